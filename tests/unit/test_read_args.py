"""``MemoryReader.read`` refuses bad arguments at once, before any I/O (no stack needed)."""
import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from memstream.read_client import MemoryReader
from memstream.read_client.budget import Budgets
from memstream.schemas import LogPosition
from memstream.schemas.read_models import AsOf

NAIVE = datetime(2026, 1, 1)
AWARE = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Untouchable:
    """Stands for the pools, Redis and the embedder: any use of it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"read touched {name!r} before refusing its arguments")


@pytest.fixture
def reader():
    r = MemoryReader(pool=Untouchable(), redis=Untouchable(), embedder=Untouchable(), schema="s")
    yield r
    r._embed_pool.shutdown()


GOOD = {"user_id": "u", "conversation_id": "c", "message": "where do I live?"}


@pytest.mark.parametrize("change, says", [
    ({"user_id": ""}, "user_id is required"),
    ({"user_id": 5}, "user_id is required"),
    ({"conversation_id": None}, "conversation_id is required"),
    ({"message": None}, "message must be a string"),
    ({"message": "where do I live?\x00"}, "message must not contain NUL"),  # the keyword sections degraded
    ({"message": "where \ud800 do I live?"}, "message is not valid Unicode"),  # every vector section degraded
    ({"user_id": "u\x00"}, "user_id must not contain NUL"),
    ({"k": 0}, "k must be an integer from 1 to 100"),
    ({"k_edges": 2**80}, "k_edges must be an integer from 0 to 100"),  # overflowed SQL LIMIT: a degraded section
    ({"k_facts": -1}, "k_facts must be an integer from 0 to 100"),  # sliced as [:-1] it returned all but one
    ({"k_edges": 2.5}, "k_edges must be an integer from 0 to 100"),
    ({"after": 17}, "after must be the LogPosition"),
    ({"after": LogPosition("t", -5, "x")}, "after must name a topic and a partition and offset >= 0"),
    ({"wait_timeout": -1}, "wait_timeout must be a number of seconds from 0 to 60"),
    ({"wait_timeout": float("inf")}, "wait_timeout must be a number of seconds from 0 to 60"),  # never returned
    ({"now": NAIVE}, "now must be a timezone-aware datetime"),  # failed mid-rerank, after every statement
    ({"as_of": NAIVE}, "as_of must be a timezone-aware datetime"),
    ({"as_of": AsOf(valid_time=AWARE, recorded_time=NAIVE)}, "as_of.recorded_time must be a timezone-aware"),
    ({"as_of": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))}, "as_of must fall between 0002-01-01"),
    ({"now": datetime(9999, 12, 31, tzinfo=timezone.utc)}, "now must fall between 0002-01-01 and 9998-12-31"),
    ({"identity_id": 7}, "identity_id must be a non-empty string"),  # was a degraded section
    ({"budgets": {"facts": 10}}, "budgets must be a Budgets"),
    ({"user_id": "__memstream__"}, "is the host-wide key, not a user"),  # every user's expert personas live there
])
def test_a_bad_argument_is_refused_before_any_io_naming_what_is_wrong(reader, change, says):
    args = {**GOOD, **change}
    with pytest.raises(ValueError, match=says):
        asyncio.run(reader.read(args.pop("user_id"), args.pop("conversation_id"), args.pop("message"), **args))


def test_a_negative_budget_cannot_be_made():
    with pytest.raises(ValueError, match="edges budget"):
        Budgets(edges=-1)


@pytest.mark.parametrize("change, says", [
    ({"user_id": ""}, "user_id is required"),
    ({"query": "  "}, "query must be a non-blank string"),
    ({"query": "where\x00"}, "query must not contain NUL"),
    ({"kinds": ()}, "kinds must be a non-empty sequence"),
    ({"kinds": "facts"}, "kinds must be a non-empty sequence"),
    ({"kinds": ("facts", "profile")}, "kinds must be a non-empty sequence"),
    ({"k": 0}, "k must be an integer from 1 to 100"),
    ({"k": 101}, "k must be an integer from 1 to 100"),
    ({"k": True}, "k must be an integer from 1 to 100"),
    ({"as_of": NAIVE}, "as_of must be a timezone-aware datetime"),
    ({"as_of": AsOf(valid_time=NAIVE)}, "as_of.valid_time must be a timezone-aware"),
    ({"now": NAIVE}, "now must be a timezone-aware datetime"),
])
def test_search_refuses_bad_arguments_before_any_io(reader, change, says):
    args = {"user_id": "u", "query": "where do I live?", **change}
    with pytest.raises(ValueError, match=says):
        asyncio.run(reader.search(**args))


@pytest.mark.parametrize("call, says", [
    (lambda r: r.users(5), "prefix must be a string"),
    (lambda r: r.users("acme:", limit=0), "limit must be an integer from 1 to 500"),
    (lambda r: r.users("acme:", cursor="globex:bob"), "cursor is not one a page of these users returned"),
    (lambda r: r.overview(""), "user_id is required"),
    (lambda r: r.graph("u", NAIVE), "as_of must be a timezone-aware datetime"),
    (lambda r: r.graph("u", AsOf(recorded_time=NAIVE)), "as_of.recorded_time must be a timezone-aware"),
    (lambda r: r.graph("u", "2026-01-01"), "as_of must be a timezone-aware datetime"),
    (lambda r: r.caught_up(("t", 0, 1)), "after must be the LogPosition"),
    (lambda r: r.caught_up(LogPosition("t", 0, 1), timeout="5"), "timeout must be 0..60 seconds"),
])
def test_the_inspectors_reads_refuse_bad_arguments_before_any_io(reader, call, says):
    with pytest.raises(ValueError, match=says):
        asyncio.run(call(reader))


def test_a_prefix_ends_where_its_byte_order_range_does():
    from memstream.read_client.memories import _prefix_end

    assert _prefix_end("acme:") == "acme;"
    assert _prefix_end("") is None
    assert _prefix_end("a\U0010ffff") == "b"
    assert _prefix_end("\ud7ff"[0]) == "\ue000"  # past the surrogates, which Postgres text cannot hold
    assert all(_prefix_end(p) > p + "\U0010ffff" * 3 for p in ("acme:", "é", "x\uffff"))
