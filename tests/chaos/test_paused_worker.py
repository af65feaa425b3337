"""Chaos: a worker frozen (SIGSTOP) past its session timeout while its turns wait on the model;
the group hands its partitions on, and it is thawed while the next owner forms them again."""
from __future__ import annotations

import asyncio
import collections
import os
import signal

import pytest

from memstream.streams.log.producer import TurnLog
from tests.integration.conftest import Worker, wait_until
from tests.integration.helpers import assert_equal_to_a_replay, produced, turns

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_a_worker_thawed_after_its_partitions_moved_on_records_nothing_twice(settings, conn, dsn, tmp_path):
    # A model answering in 0.5 s keeps batches in flight; plain records, to read the decisions back.
    s = settings.model_copy(update={"extractor": "offline+latency", "stand_in_latency_p50": 0.5, "seal_records": False})
    n = 600
    sent = turns(n, users=60, prefix="pause")
    crew = []

    async def produce():
        async with TurnLog(s) as log:
            for i in range(0, n, 30):
                await log.append_many(sent[i:i + 30])
                await asyncio.sleep(0.5)

    try:
        frozen = Worker(s, tmp_path / "frozen.log")
        crew.append(frozen)
        await frozen.wait_assigned()
        producer = asyncio.ensure_future(produce())
        await asyncio.sleep(4)
        os.killpg(frozen.proc.pid, signal.SIGSTOP)
        at_pause = await _formed(conn, s)
        successor = Worker(s, tmp_path / "successor.log")
        crew.append(successor)
        await successor.wait_assigned(timeout=90)  # once the frozen one's session timed out
        await wait_until(lambda: _formed_past(conn, s, at_pause), timeout=60, what="the successor forming")
        os.killpg(frozen.proc.pid, signal.SIGCONT)
        await producer
        await wait_until(lambda: _count(conn, n), timeout=600, what=f"{n} episodes")
        await asyncio.sleep(3)  # whatever the thawed worker still had to say
        made = collections.Counter(d.decision_id for decided in (await produced(s)).values() for d in decided)
        assert [k for k, c in made.items() if c > 1] == []
        thawed = frozen.log()
        # It either found its partitions revoked first, or tried to record and was refused.
        assert frozen.proc.poll() is None or "PositionMoved" in thawed, thawed[-3000:]
    finally:
        for w in crew:
            if w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGCONT)
            w.kill()
    await assert_equal_to_a_replay(s, conn, dsn, "thawed")


async def _formed(conn, s) -> int:
    return await conn.fetchval("SELECT coalesce(sum(next_offset), 0) FROM projection_positions "
                               "WHERE projection = 'formation' AND topic = $1", s.events_topic)


async def _formed_past(conn, s, offset: int) -> bool:
    return await _formed(conn, s) > offset


async def _count(conn, n):
    return await conn.fetchval("SELECT count(*) FROM episodes") == n
