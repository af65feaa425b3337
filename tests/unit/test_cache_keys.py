"""The derived caches' Redis keys read back: a forget or a switch deletes exactly the keys it means."""
from __future__ import annotations

import pytest

from memstream.projections.cache_keys import key, parse
from memstream.projections.profile.core import profile_key
from memstream.projections.session_cache import tier0_key


@pytest.mark.parametrize("user", ["ana", "a:b", "x:t0:3:ana", "", "日本", "*?[]\\"])
def test_every_key_names_its_epoch_tier_and_user(user):
    assert parse("s", tier0_key("s", 7, user, "c:1")) == (7, "t0", user)
    assert parse("s", profile_key("s", 12, user)) == (12, "t1", user)


@pytest.mark.parametrize("other", [
    "memstream:s2:e1:t1:3:ana",  # another schema's
    "memstream:s:eX:t1:3:ana",  # not an epoch
    "memstream:s:e1:t1:4:ana",  # shorter than its length says
    "memstream:s:e1:t1:2:ana",  # longer, without a separator after it
    "memstream:s:e1:t1",
    "other:s:e1:t1:3:ana",
])
def test_keys_of_another_shape_or_schema_are_not_read_as_ours(other):
    assert parse("s", other) is None


def test_a_user_id_holding_anothers_key_shape_is_its_own_user():
    assert parse("s", key("s", 1, "t0", "x:t0:3:ana", "c"))[2] == "x:t0:3:ana"


@pytest.mark.parametrize("odd", ["memstream:s:e²:t1:3:ana", "memstream:s:e1:t1:-1:ana", "memstream:s:e1:t1: 3:ana"])
def test_digits_are_ascii_digits(odd):
    assert parse("s", odd) is None


def test_a_profiles_older_keys_are_named_without_a_scan():
    from memstream.projections.cache_keys import older

    assert older("s", 2, "t1", ["ana"]) == [profile_key("s", 0, "ana"), profile_key("s", 1, "ana")]
