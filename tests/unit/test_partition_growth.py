"""The pure parts of growing the log: where a copied record goes, and what it says it was."""
from __future__ import annotations

import json

from memstream.streams.log.screening import expected_partition
from memstream.streams.ops.partition_growth import OFFSET_KEPT, MOVED_FROM, _Copy, _moved_from, _type


def test_each_new_partition_takes_the_users_of_exactly_one_old_partition_on_their_murmur2_partition():
    copy = _Copy("e", "e", "e.p8", 4, 8, "k")
    for i in range(500):
        key = f"user-{i}".encode()
        old = expected_partition(key, 4)
        new = copy.target(old, key)
        assert new == expected_partition(key, 8) and new % 4 == old


def test_a_record_that_was_not_on_its_keys_partition_stays_off_it_so_a_replay_refuses_it_again():
    copy = _Copy("e", "e", "e.p8", 4, 8, "k")
    key = b"user-1"
    wrong = (expected_partition(key, 4) + 1) % 4
    assert copy.target(wrong, key) == wrong != expected_partition(key, 8)
    assert copy.target(2, None) == 2


def test_a_copied_record_names_its_old_place_and_identity_commands_are_recognised_sealed_or_plain():
    assert _moved_from([("x", b"1"), (MOVED_FROM, b"3/1207")]) == (3, 1207)
    sealed = json.dumps({"type": "PersonIdentitySet", "schema_version": 1, "user_id": "u", "sealed": "AAAA"}).encode()
    assert _type(sealed) in OFFSET_KEPT
    assert _type(b'{"type": "TurnRecorded", "user_message": "hi"}') == "TurnRecorded"
    assert _type(b"not json") == "" and _type(None) == ""
