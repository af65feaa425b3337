"""Chaos: a worker SIGKILLed again and again while a stream flows; the replay is the oracle."""
from __future__ import annotations

import asyncio
import random

import pytest

from memstream.streams.log.producer import TurnLog
from tests.integration.conftest import wait_until
from tests.integration.helpers import assert_equal_to_a_replay, turns

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
    await assert_equal_to_a_replay(settings, conn, dsn, "chaos")


async def _count(conn, n):
    return await conn.fetchval("SELECT count(*) FROM episodes") == n


async def test_three_workers_a_kill_a_replacement_and_a_fourth_project_every_turn_once_in_each_users_order(
        settings, conn, workers):
    """Scale out while turns flow: three workers in one group, one SIGKILLed, another started,
    then a fourth; every turn ends up projected exactly once, each user's episodes in log order."""
    n = 1500
    sent = turns(n, users=30, prefix="scale")

    async def produce():
        async with TurnLog(settings) as log:
            for i in range(0, n, 100):
                await log.append_many(sent[i:i + 100])
                await asyncio.sleep(0.3)

    crew = [workers() for _ in range(3)]
    for w in crew:
        await w.wait_assigned()
    producer = asyncio.ensure_future(produce())
    await asyncio.sleep(1.5)
    crew[0].kill()
    await asyncio.sleep(1.5)
    crew.append(workers())
    await asyncio.sleep(1.5)
    crew.append(workers())
    await producer
    await wait_until(lambda: _count(conn, n), timeout=600, what=f"{n} episodes from a changing crew")
    rows = await conn.fetch("SELECT user_id, source_event_id, source_partition, source_offset, occurred_at FROM episodes")
    assert len(rows) == len({r["source_event_id"] for r in rows}) == n  # once each
    by_user: dict[str, list] = {}
    for r in rows:
        by_user.setdefault(r["user_id"], []).append(r)
    for user, mine in by_user.items():
        assert len({r["source_partition"] for r in mine}) == 1, user  # one partition per user
        in_log_order = [r["occurred_at"] for r in sorted(mine, key=lambda r: r["source_offset"])]
        assert in_log_order == sorted(in_log_order), user  # appended in time order, projected in log order
