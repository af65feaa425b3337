"""Sealed records (``streams.log.sealing``): what the log holds of a person opens only with their
key, what must outlive the key stays plain, and opening follows the log — after a forget, what
was sealed under the key it ended opens as shredded in every process, live or replaying."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

import msgspec
import pytest

from memstream.schemas import (SYSTEM_USER, ExpertIdentityUpserted, LogPosition, MemoryForgotten, NothingDecided, TurnRecorded, UserForgotten,
                               decode_event)
from memstream.schemas.events import new_event_id
from memstream.keys.kek import LocalKek
from memstream.keys.data_keys import DataKeys, Shredded
from memstream.keys.wrapped import MemoryWrappedKeys
from memstream.streams.log.screening import screen
from memstream.streams.log.records import Record
from memstream.streams.log.sealing import RecordSealer

pytestmark = pytest.mark.asyncio
NOW = datetime(2026, 11, 30, 9, tzinfo=timezone.utc)


def turn(user: str, text: str) -> TurnRecorded:
    return TurnRecorded.new(user_id=user, conversation_id="c", user_message=text, assistant_message="ok", occurred_at=NOW)


def forgotten(user: str, generation: int | None = None) -> UserForgotten:
    return UserForgotten(event_id=new_event_id(), user_id=user, occurred_at=NOW, actor="user", generation=generation)


def on_log(values: list[bytes]) -> list[Record]:
    """Records as the log holds them: keyed by the user their envelope names."""
    return [Record("ev", 0, n, msgspec.json.decode(v)["user_id"].encode(), v, (), 0) for n, v in enumerate(values)]


@pytest.fixture
def keys(tmp_path) -> DataKeys:
    return DataKeys(LocalKek(tmp_path / "kek"), MemoryWrappedKeys())


async def test_a_sealed_turn_shows_its_type_and_user_but_none_of_its_words_and_opens_to_itself(keys):
    t = turn("ana", "I live in Lisbon with my cat Miso")
    sealed = await RecordSealer(keys).seal(t)
    envelope = msgspec.json.decode(sealed)
    assert envelope["type"] == "TurnRecorded" and envelope["user_id"] == "ana"
    assert b"Lisbon" not in sealed and b"Miso" not in sealed
    [opened] = await RecordSealer(keys).open(on_log([sealed]))
    assert opened.sealing is None and opened.sealed_value == sealed and decode_event(opened.value) == t
    assert screen([opened], "formation", None)[0] == [(opened, t)]


async def test_what_must_be_read_after_the_key_is_gone_stays_plain(keys):
    sealer = RecordSealer(keys)
    await sealer.seal(turn("ana", "hello"))  # ana has key generation 1
    stamped = msgspec.json.decode(await sealer.seal(forgotten("ana")))
    assert stamped["type"] == "UserForgotten" and stamped["generation"] == 1 and "sealed" not in stamped
    assert msgspec.json.decode(await sealer.seal(forgotten("nobody")))["generation"] == 0  # no key: nothing to end
    common = dict(source_event_id=uuid.uuid4(), source=LogPosition("ev", 0, 0), recorded_at=NOW, user_id="ana")
    for plain in (NothingDecided(decision_id=uuid.uuid4(), **common),
                  MemoryForgotten(decision_id=uuid.uuid4(), kind="user", actor="user", generation=1, **common),
                  ExpertIdentityUpserted(event_id=new_event_id(), user_id=SYSTEM_USER, occurred_at=NOW,
                                         identity_id="support", name="Support", instructions="Be kind.")):
        assert "sealed" not in msgspec.json.decode(await sealer.seal(plain))
    fact_forget = MemoryForgotten(decision_id=uuid.uuid4(), kind="fact", target=uuid.uuid4(), actor="user", **common)
    assert "sealed" in msgspec.json.decode(await sealer.seal(fact_forget))


async def test_after_a_forget_on_the_log_what_its_key_sealed_is_shredded_even_before_the_key_is_destroyed(keys):
    writer = RecordSealer(keys)
    before, late = await writer.seal(turn("ana", "before")), await writer.seal(turn("ana", "late, stale key"))
    forget = await writer.seal(forgotten("ana"))
    bo = await writer.seal(turn("bo", "bo's own"))
    reader = RecordSealer(keys)
    opened = await reader.open(on_log([before, forget, late, bo]))
    assert [r.sealing for r in opened] == [None, None, "shredded", None] and reader.shredded == 1
    assert opened[2].value is None and screen(opened, "formation", None)[1] == []  # skipped, not dead-lettered
    await writer.destroy("ana", 1)
    comeback = await writer.seal(turn("ana", "I am back"))
    again = RecordSealer(keys)  # a replay after the key is gone
    opened = await again.open(on_log([before, forget, late, comeback]))
    assert [r.sealing for r in opened] == ["shredded", None, "shredded", None] and again.shredded == 2
    assert decode_event(opened[3].value).user_message == "I am back"


async def test_ending_a_key_twice_or_after_the_user_came_back_spares_what_they_said_since(keys):
    sealer = RecordSealer(keys)
    await sealer.seal(turn("ana", "first life"))
    await sealer.destroy("ana", 1)
    comeback = await sealer.seal(turn("ana", "second life"))
    await sealer.destroy("ana", 1)  # the same forget applied again (a restart, a second send)
    [opened] = await RecordSealer(keys).open(on_log([comeback]))
    assert opened.sealing is None


async def test_a_damaged_or_moved_sealed_record_is_dead_lettered_with_the_reason(keys):
    sealer = RecordSealer(keys)
    sealed = msgspec.json.decode(await sealer.seal(turn("ana", "x")))
    await sealer.seal(turn("bo", "y"))  # bo has a key: ana's record does not open with it
    moved = msgspec.json.encode({**sealed, "user_id": "bo"})
    [r] = await RecordSealer(keys).open(on_log([moved]))
    [(_, stage, reason)] = screen([r], "formation", None)[1]
    assert "does not open" in reason and r.wire_value == moved  # the letter keeps the record as on the log


async def test_a_forget_sealed_again_after_the_user_came_back_still_ends_only_its_own_key(keys):
    """A retried append or a restarted ingress seals the same forget twice: its stamp is fixed
    the first time, and a client's own ``generation`` is never believed."""
    sealer = RecordSealer(keys)
    await sealer.seal(turn("ana", "first life"))
    forget = msgspec.structs.replace(forgotten("ana"), generation=999_999)  # a plain client's guess
    first = msgspec.json.decode(await sealer.seal(forget))
    await sealer.destroy("ana", first["generation"])
    comeback = await sealer.seal(turn("ana", "second life"))
    again = msgspec.json.decode(await sealer.seal(forget))
    assert first["generation"] == again["generation"] == 1
    [_, opened] = await RecordSealer(keys).open(on_log([msgspec.json.encode(again), comeback]))
    assert opened.sealing is None


async def test_a_forget_screening_refuses_or_one_claiming_a_later_key_ends_no_one_s_key(keys):
    """A plain forget written to the events topic by hand, under another user's key or on a
    partition not its user's, is dead-lettered by screening: opening it must not end the named
    user's key first (their every later record would be skipped as shredded). One naming a
    generation past the user's ends only the one the key store stamps."""
    from memstream.streams.log.screening import expected_partition

    writer = RecordSealer(keys)
    said = await writer.seal(turn("vic", "I live in Lisbon"))
    forged = msgspec.json.encode(forgotten("vic", generation=999))
    other = msgspec.json.encode(forgotten("vic", generation=999))
    wrong = next(p for p in range(4) if p != expected_partition(b"vic", 4))
    reader = RecordSealer(keys)
    reader.partitions = 4
    opened = await reader.open([Record("ev", 0, 0, b"mallory", forged, (), 0),  # under another key
                                Record("ev", wrong, 1, b"vic", other, (), 0),  # on another partition
                                Record("ev", expected_partition(b"vic", 4), 2, b"vic", said, (), 0)])
    assert opened[2].sealing is None and decode_event(opened[2].value).user_message == "I live in Lisbon"
    assert len(screen(opened[:2], "formation", 4)[1]) == 2  # both dead-lettered, as they were
    inflated = forgotten("vic", generation=999)
    await writer.destroy("vic", await writer.stamp(inflated))  # it ended generation 1, and only that
    comeback = await writer.seal(turn("vic", "I am back"))
    again = RecordSealer(keys)
    opened = await again.open(on_log([msgspec.json.encode(inflated), comeback]))
    assert opened[1].sealing is None and decode_event(opened[1].value).user_message == "I am back"


async def test_an_offline_reader_ends_a_key_only_for_a_forget_the_workers_stamped(keys):
    """A replay or a reform knows no partition count: a forget the workers never applied (on a
    partition not its user's, dead-lettered) must neither end the user's key in it nor be
    stamped by it (a stamp retires the user's live key and dates their last forget)."""
    writer = RecordSealer(keys)
    said = await writer.seal(turn("vic", "I live in Lisbon"))
    stray = forgotten("vic")
    reader = RecordSealer(keys)  # no partitions: an offline tool's
    opened = await reader.open(on_log([msgspec.json.encode(stray), said]))
    assert opened[1].sealing is None and await keys.stamped("vic", stray.event_id.bytes) is None
    assert await keys.last_forgets(["vic"]) == {}


async def test_what_derives_from_a_forgotten_record_is_never_sealed_under_a_newer_key(keys):
    sealer = RecordSealer(keys)
    [source] = await sealer.open(on_log([await sealer.seal(turn("ana", "old secret"))]))
    assert source.generation == 1
    await sealer.destroy("ana", 1)
    await sealer.seal(turn("ana", "back again"))  # generation 2 is live now
    with pytest.raises(Shredded):  # a retried formation batch: its decision is dropped, not re-sealed
        await sealer.seal(decode_event(source.value), source.generation)


async def test_a_sealed_record_is_told_by_its_envelope_whatever_its_user_id_or_text_holds():
    import json

    from memstream.streams.log.sealing import is_sealed

    long_id = "u" * 256
    assert is_sealed(json.dumps({"type": "TurnRecorded", "schema_version": 1, "user_id": long_id,
                                 "sealed": "AAAA"}).encode())
    plain = {"type": "TurnRecorded", "user_id": "u", "conversation_id": "sealed", "metadata": {"sealed": "x"}}
    assert not is_sealed(json.dumps(plain).encode()) and not is_sealed(b"not json")


async def test_a_user_back_right_after_a_forget_keeps_what_they_say_before_its_key_is_destroyed(keys):
    """The forget retires the key it ends when it is stamped: what the user says next is sealed
    under a new one, while formation still seals its decisions about what came before."""
    sealer = RecordSealer(keys)
    before = await sealer.seal(turn("ana", "I live in Oslo."))
    forget = await sealer.seal(forgotten("ana"))
    back = await sealer.seal(turn("ana", "I am back."))  # formation has not destroyed generation 1 yet
    live = RecordSealer(keys)
    opened = await live.open(on_log([before, forget, back]))
    assert [r.sealing for r in opened] == [None, None, None] and [r.generation for r in (opened[0], opened[2])] == [1, 2]
    await live.seal(decode_event(opened[0].value), opened[0].generation)  # a decision about "Oslo"
    await live.destroy("ana", msgspec.json.decode(forget)["generation"])
    replayed = await RecordSealer(keys).open(on_log([before, forget, back]))
    assert [r.sealing for r in replayed] == ["shredded", None, None]
    assert decode_event(replayed[2].value).user_message == "I am back."


async def test_a_plain_record_of_a_user_written_after_sealing_began_is_counted_and_said_not_refused(keys, caplog):
    """A process with sealing off beside sealing ones, or a client writing the events topic by
    hand: applied (the second is supported and cannot be told from the first), counted, said."""
    import logging
    import time

    from memstream.schemas import encode
    from memstream.streams.log.records import Record

    sealer = RecordSealer(keys)
    await sealer.seal(turn("ana", "sealed"))  # sealing begins
    plain = [Record("t.events", 0, i, b"bo", encode(turn("bo", "plain")), (), int(time.time() * 1000) + 1000)
             for i in range(3)]
    old = Record("t.events", 0, 9, b"bo", encode(turn("bo", "from before")), (), 1_000)
    with caplog.at_level(logging.WARNING, "memstream.sealing"):
        opened = await sealer.open([old, *plain])
    assert [r.sealing for r in opened] == [None] * 4 and sealer.plain_records == 3
    assert caplog.text.count("plain records of users") == 1
