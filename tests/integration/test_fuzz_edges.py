"""Fuzzing the edges a host calls, on the real stack: random strings (any Unicode, NUL, sizes near
the limits), numbers and shapes through ``TurnLog.append``, ``read``, ``search``, the HTTP API and
the MCP tools. Each call is answered or refused with a typed error (``InvalidEvent``,
``InvalidArgument``; a 4xx problem; an MCP tool error), a refusal appends nothing, a read on a
healthy stack is never degraded, and nothing answers 500. Small here (``make test``);
``MEMSTREAM_FUZZ_EXAMPLES`` runs more."""
from __future__ import annotations

import contextlib
import logging
import os
import string
from datetime import timezone
from urllib.parse import quote

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from hypothesis import strategies as st

from memstream.embedding import default_embedder
from memstream.schemas import InvalidEvent, LogPosition, TurnRecorded
from memstream.schemas.errors import InvalidArgument
from memstream.streams.log.producer import TurnLog

from .conftest import served
from .helpers import hypothesis_on_loop
from .test_formation import append_and_wait, turn
from .test_read_path import make_reader

pytestmark = pytest.mark.asyncio
EXAMPLES = int(os.environ.get("MEMSTREAM_FUZZ_EXAMPLES", "40"))

# Any Unicode but lone surrogates (no UTF-8 has them, so no HTTP body or JSON can carry them),
# NUL and the other control characters included, at sizes around the limits.
SHORT = st.one_of(st.text(max_size=40), st.text(st.characters(codec="utf-8"), max_size=400))
TEXT = st.one_of(SHORT, st.sampled_from(["", " ", "\x00", "a\x00b", "\u202e", "🧠" * 10, "'; DROP TABLE episodes; --",
                                  "%s %(x)s {0}", "\\", "$1"]),
                 st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "💥", " "]),
                           st.sampled_from([255, 256, 1_000, 4_097, 99_999, 100_000, 100_001])))
SCALAR = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False, allow_infinity=False)
JSON = st.recursive(SCALAR | TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
WHEN = st.one_of(st.none(), st.datetimes(timezones=st.just(timezone.utc)), st.datetimes())


@contextlib.asynccontextmanager
async def events_ends(settings):
    """A function returning the events topic's end offsets now (one consumer for every look)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None)
    await consumer.start()
    parts = [TopicPartition(settings.events_topic, p) for p in range(settings.partitions)]
    try:
        yield lambda: consumer.end_offsets(parts)
    finally:
        await consumer.stop()


async def test_random_turns_are_appended_or_refused_with_invalid_event_and_a_refusal_appends_nothing(settings):
    async with TurnLog(settings) as log, events_ends(settings) as end_offsets:
        async def one(example):
            user, conversation, said, answer, metadata, when = example
            before = await end_offsets()
            try:
                turn = TurnRecorded.new(user_id=user, conversation_id=conversation, user_message=said,
                                        assistant_message=answer, metadata=metadata, occurred_at=when)
                assert isinstance(await log.append(turn), LogPosition)
            except InvalidEvent as exc:
                assert exc.reason
                assert await end_offsets() == before, "a refused turn was appended"

        await hypothesis_on_loop(st.tuples(TEXT, TEXT, TEXT, TEXT, st.none() | st.dictionaries(st.text(max_size=8), JSON),
                                           st.datetimes(timezones=st.just(timezone.utc))), one, EXAMPLES)


async def test_random_reads_and_searches_answer_whole_or_raise_invalid_argument(settings, dsn, conn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("fz-ana", "I live in Porto and work at Initech.", 0),
                                           turn("fz-ana", "My sister Ana visits in May.", 1)])
    reader = await make_reader(dsn, settings, default_embedder())
    kinds = st.lists(st.sampled_from(["facts", "episodes", "edges", "nope", ""]), max_size=4)
    answered = []
    try:
        async def one(example):
            user, conversation, message, k, chosen, since, until = example
            try:
                ctx = await reader.read(user, conversation, message, k=k)
                assert ctx.degraded == [], (message, ctx.degraded)
                answered.append(1)
            except InvalidArgument as exc:
                assert str(exc)
            try:
                found = await reader.search(user, message, kinds=chosen, k=k, since=since, until=until)
                assert found.degraded == [], (message, found.degraded)
            except InvalidArgument as exc:
                assert str(exc)

        user = st.one_of(st.just("fz-ana"), SHORT)  # one the checks let through, often
        await hypothesis_on_loop(st.tuples(user, st.just("c1") | TEXT, TEXT, st.integers(-3, 300), kinds, WHEN, WHEN),
                                 one, EXAMPLES)
        assert len(answered) >= EXAMPLES // 4  # enough of them reached the stores
    finally:
        await reader.close()


async def test_random_requests_to_the_http_api_get_an_answer_or_a_typed_4xx_never_a_500(settings, dsn, tmp_path):
    from memstream.api.app import create_app
    from memstream.api.keys import ApiKeys

    keys = ApiKeys(tmp_path / "api-keys.json")
    auth = {"Authorization": f"Bearer {keys.create('fuzz', tenant='fz')}"}
    app = create_app(settings, keys=keys, dsn=dsn, embedder=default_embedder())
    routes = [("POST", "turns"), ("POST", "events"), ("POST", "context"), ("POST", "search"), ("GET", "memories"),
              ("POST", "forget"), ("GET", "facts/{id}/history"), ("POST", "facts/{id}/correct"), ("GET", ""),
              ("DELETE", ""), ("POST", "/v1/caught-up")]
    body = st.one_of(JSON, st.fixed_dictionaries({}, optional={
        "user_message": TEXT, "assistant_message": TEXT, "conversation_id": TEXT, "message": TEXT, "query": TEXT,
        "k": st.integers(-3, 300) | TEXT, "kinds": st.lists(TEXT, max_size=3), "value": TEXT, "type": TEXT,
        "fact_id": TEXT, "occurred_at": TEXT, "metadata": JSON, "after": JSON, "position": JSON, "timeout": JSON}))
    raw = st.sampled_from([b"", b"{", b'{"k": NaN, "message": Infinity}', b"[" * 100_000, b"\xff\xfe", b"null",
                           b'{"message": "\x00"}'])
    # A URL's parts stay short: httpx refuses one over 64 KiB before it is sent.
    user = st.one_of(st.just("fz:ana"), st.builds(lambda s: f"fz:{s}", SHORT), SHORT)
    params = st.dictionaries(st.sampled_from(["kind", "limit", "cursor", "include_history", "x"]), SHORT, max_size=3)
    ids = st.one_of(st.uuids().map(str), SHORT)

    async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as client, \
            events_ends(settings) as end_offsets:
        async def one(example):
            (method, route), who, fact, payload, junk, query = example
            path = route if route.startswith("/") else (
                f"/v1/users/{quote(who, safe='')}" + (f"/{route.replace('{id}', quote(fact, safe=''))}" if route else ""))
            before = await end_offsets()
            content = junk if junk is not None else httpx.Request("POST", url, json=payload).content
            got = await client.request(method, path, headers={**auth, "Content-Type": "application/json"},
                                       content=content if method != "GET" else None, params=query)
            assert got.status_code < 500, (method, path, got.status_code, got.text[:500])
            if got.status_code >= 400:
                assert got.headers["content-type"].startswith("application/problem+json"), (path, got.text[:200])
                assert await end_offsets() == before, f"{method} {path} was refused but appended"

        await hypothesis_on_loop(st.tuples(st.sampled_from(routes), user, ids, body, st.none() | raw, params),
                                 one, EXAMPLES)


async def test_random_mcp_tool_calls_are_answered_or_refused_as_tool_errors(settings, dsn, caplog):
    from mcp import Client

    from memstream.mcp_server import create_server

    server = create_server(settings, user="fz-mcp", dsn=dsn, embedder=default_embedder())
    args = {
        "remember": {"text": TEXT, "reply": TEXT, "conversation_id": TEXT, "user_id": TEXT},
        "recall": {"query": TEXT, "kinds": st.lists(TEXT | st.just("facts"), max_size=3), "k": st.integers(-3, 300),
                   "user_id": TEXT},
        "get_context": {"message": TEXT, "conversation_id": TEXT, "after": JSON},
        "list_memories": {"kind": TEXT | st.just("facts"), "limit": st.integers(-3, 5000) | TEXT, "cursor": TEXT,
                          "include_history": JSON},
        "correct_memory": {"fact_id": st.uuids().map(str) | TEXT, "value": TEXT, "text": TEXT, "reason": TEXT},
        "forget_memory": {"fact_id": st.uuids().map(str) | TEXT, "episode_id": TEXT, "edge_id": JSON, "reason": TEXT},
    }
    call = st.sampled_from(sorted(args)).flatmap(
        lambda name: st.tuples(st.just(name), st.fixed_dictionaries({}, optional=args[name])))
    caplog.set_level(logging.ERROR)
    async with Client(server, read_timeout_seconds=60) as client:
        async def one(example):
            name, arguments = example
            caplog.clear()
            result = await client.call_tool(name, arguments)
            # A tool's own refusal, or the SDK's for arguments off its schema; "Error executing tool
            # <name>" alone is what the SDK says of an exception it did not expect.
            assert not result.is_error or result.content[0].text != f"Error executing tool {name}", (name, arguments)
            crashed = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert not crashed, (name, arguments, [r.getMessage()[:300] for r in crashed])

        await hypothesis_on_loop(call, one, EXAMPLES)


def test_the_fuzzed_text_reaches_the_limits_it_should():
    """The strategies hold what the edges must cope with (else the tests above prove little)."""
    from hypothesis import find

    assert find(TEXT, lambda s: "\x00" in s) is not None
    assert find(TEXT, lambda s: len(s) > 100_000) is not None
    assert find(TEXT, lambda s: any(c not in string.printable for c in s)) is not None
