"""Chaos: a worker frozen (SIGSTOP) past its session timeout while its turns wait on the model;
the group hands its partitions on, and it is thawed while the next owner forms them again."""
from __future__ import annotations

import asyncio
import collections
import os
import signal

import pytest
from aiokafka import TopicPartition

from memstream.projections.compare import diff_counts
from memstream.projections.db import drop_schema
from memstream.schemas.codec import decode_decision
from memstream.streams.kafka_util import drain, groupless_consumer
from memstream.streams.producer import TurnLog
from memstream.streams.replay import replay
from tests.integration.conftest import Worker, wait_until
from tests.integration.helpers import turns

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
        made = collections.Counter(d.decision_id for d in await _decisions(s))
        assert [k for k, c in made.items() if c > 1] == []
        thawed = frozen.log()
        # It either found its partitions revoked first, or tried to record and was refused.
        assert frozen.proc.poll() is None or "PositionMoved" in thawed, thawed[-3000:]
    finally:
        for w in crew:
            if w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGCONT)
            w.kill()
    target = settings.postgres_schema + "_thawed"
    try:
        await replay(s, dsn, target, ["episodes", "facts", "graph"])
        for table in ("episodes", "memory_facts", "entities", "memory_edges"):
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0), table
    finally:
        await drop_schema(dsn, target)


async def _formed(conn, s) -> int:
    return await conn.fetchval("SELECT coalesce(sum(next_offset), 0) FROM projection_positions "
                               "WHERE projection = 'formation' AND topic = $1", s.events_topic)


async def _formed_past(conn, s, offset: int) -> bool:
    return await _formed(conn, s) > offset


async def _count(conn, n):
    return await conn.fetchval("SELECT count(*) FROM episodes") == n


async def _decisions(s) -> list:
    out = []
    async with groupless_consumer(s.kafka_bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition(s.decisions_topic, p) for p in range(s.partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)

        async def keep(batch):
            out.extend(decode_decision(r.value) for r in batch)

        await drain(c, tps, await c.end_offsets(tps), keep)
    return out
