from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlparse

import asyncpg
from aiokafka import TopicPartition

from memstream.projections.compare import diff_counts
from memstream.projections.db import drop_schema
from memstream.schemas import TurnRecorded
from memstream.schemas.codec import decode_decision
from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.ops.replay import replay

BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def turns(n: int, users: int = 5, prefix: str = "t") -> list[TurnRecorded]:
    return [
        TurnRecorded.new(
            user_id=f"{prefix}-user-{i % users}", conversation_id=f"conv-{i % users}-{i // (users * 10)}",
            user_message=f"message {i}: I mentioned topic number {i} and my cat Miso",
            assistant_message=f"noted {i}", occurred_at=BASE + timedelta(minutes=i),
        )
        for i in range(n)
    ]


async def schemas_named(dsn: str, prefix: str) -> set[str]:
    """The Postgres schemas whose names start with ``prefix`` (a command's own, to see it dropped)."""
    conn = await asyncpg.connect(dsn)
    try:
        return {r["nspname"] for r in await conn.fetch("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)",
                                                       prefix)}
    finally:
        await conn.close()


async def every_record(settings, topic: str) -> list:
    """Every record of ``topic`` up to its end now (``Record``s, each partition's in log order)."""
    out: list = []
    async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition(topic, p) for p in await partitions_of(c, topic)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)

        async def keep(batch):
            out.extend(batch)

        await drain(c, tps, await c.end_offsets(tps), keep)
    return out


async def produced(settings) -> dict[int, list]:
    """Every decision on the decisions topic (plain records), per partition in log order."""
    out: dict[int, list] = {}
    for r in await every_record(settings, settings.decisions_topic):
        out.setdefault(r.partition, []).append(decode_decision(r.value))
    return out


async def assert_equal_to_a_replay(settings, conn, dsn, suffix: str, projections=("episodes", "facts", "graph"),
                                   tables=("episodes", "episode_passages", "memory_facts", "entities", "memory_edges"),
                                   topic: str | None = None) -> None:
    """The live ``tables`` equal, table by table, a replay of the log (of the decisions
    ``topic``, default the live one) by ``projections`` into a side schema."""
    target = f"{settings.postgres_schema}_{suffix}"
    try:
        await replay(settings, dsn, target, list(projections), **({"topic": topic} if topic else {}))
        for table in tables:
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0), table
    finally:
        await drop_schema(dsn, target)


async def assert_equal_to_a_rebuild(settings, conn, dsn, suffix: str) -> None:
    """The live episodes and passages equal, row for row, a fast rebuild of the log into a side
    schema (``streams.ops.rebuild``)."""
    from memstream.streams.ops.rebuild import rebuild_episodes

    target = f"{settings.postgres_schema}_{suffix}"
    try:
        await rebuild_episodes(settings, dsn, target)
        for table in ("episodes", "episode_passages"):
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0), table
    finally:
        await drop_schema(dsn, target)


async def hypothesis_on_loop(strategy, check, examples: int) -> None:
    """``check(example)`` (a coroutine function) awaited on this event loop for ``examples``
    examples of ``strategy``, derandomized (the same examples every run, none stored): hypothesis
    runs in a thread of its own, since its ``given`` is synchronous and the stack's clients live on
    this loop. A failing example is shrunk and raised here as hypothesis reports it."""
    import asyncio

    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings

    loop = asyncio.get_running_loop()

    @hsettings(max_examples=examples, deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(example):
        asyncio.run_coroutine_threadsafe(check(example), loop).result(timeout=300)

    await asyncio.to_thread(run)


class FreezingProxy:
    """A TCP front for the local Postgres socket that can stop passing bytes either way, as a
    server that stops answering does (SIGSTOP, a network partition): no error, no statement
    timeout, nothing."""

    def __init__(self, socket_path: str):
        self._socket, self.frozen, self._tasks = socket_path, asyncio.Event(), set()

    async def __aenter__(self):
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self._server.close()
        for t in self._tasks:
            t.cancel()

    async def _serve(self, reader, writer):
        up_r, up_w = await asyncio.open_unix_connection(self._socket)

        async def pipe(src, dst):
            while data := await src.read(65536):
                if self.frozen.is_set():
                    await asyncio.Event().wait()  # held, never passed on
                dst.write(data)
                await dst.drain()
            dst.close()  # one side hung up: so does the other (a client's close waits for it)

        for t in (asyncio.ensure_future(pipe(reader, up_w)), asyncio.ensure_future(pipe(up_r, writer))):
            self._tasks.add(t)

    @classmethod
    def of(cls, dsn: str) -> FreezingProxy:
        """A proxy in front of the socket ``dsn`` (the local stack's) names."""
        socket_dir = parse_qs(urlparse(dsn).query)["host"][0]
        return cls(f"{socket_dir}/.s.PGSQL.{urlparse(dsn).port or 5432}")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

