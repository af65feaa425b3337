"""Chaos: a worker SIGKILLed again and again while a stream flows; the replay is the oracle."""
from __future__ import annotations

import asyncio
import random

import pytest

from memstream.projections.compare import diff_counts
from memstream.projections.db import drop_schema
from memstream.streams.producer import TurnLog
from memstream.streams.replay import replay
from tests.integration.conftest import wait_until
from tests.integration.helpers import turns

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_repeated_kills_during_a_stream_end_exactly_once_and_equal_to_a_replay(settings, conn, dsn, workers):
    n, kills = 4000, 4
    sent = turns(n, users=40, prefix="chaos")
    rng = random.Random(3)

    async def produce():
        async with TurnLog(settings) as log:
            for i in range(0, n, 250):
                await log.append_many(sent[i:i + 250])
                await asyncio.sleep(0.2)

    producer = asyncio.ensure_future(produce())
    w = workers()
    for _ in range(kills):
        await w.wait_assigned()
        await asyncio.sleep(rng.uniform(2, 6))
        w.kill()
        w = workers()
    await producer
    await w.wait_assigned()
    await wait_until(lambda: _count(conn, n), timeout=600, what=f"{n} episodes after {kills} kills")
    ids = {r["source_event_id"] for r in await conn.fetch("SELECT source_event_id FROM episodes")}
    assert ids == {t.event_id for t in sent}
    await asyncio.sleep(3)
    w.stop()
    target = settings.postgres_schema + "_chaos"
    try:
        await replay(settings, dsn, target, ["episodes", "facts", "graph"])
        for table in ("episodes", "memory_facts", "entities", "memory_edges"):
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0), table
    finally:
        await drop_schema(dsn, target)


async def _count(conn, n):
    return await conn.fetchval("SELECT count(*) FROM episodes") == n
