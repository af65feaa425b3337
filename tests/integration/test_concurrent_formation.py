"""Formation at a hosted model's speed, on the real stack with the latency stand-in
(``extractor = "offline+latency"``): two users' turns interleaved in one partition are formed
side by side, each user's decisions stay in their turn order, and a replay of those decisions
lands on the same stores without any model."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from aiokafka import TopicPartition

from memstream.projections.compare import TABLES, diff_counts
from memstream.projections.db import create_pool, drop_schema
from memstream.schemas import TurnRecorded
from memstream.streams.log.screening import expected_partition
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.replay import replay

from .conftest import Worker, wait_until

pytestmark = pytest.mark.asyncio

LATENCY = 1.0
CITIES = ["Lisbon", "Porto", "Madrid", "Oslo", "Rome", "Vienna"]


def two_users_on_one_partition(partitions: int) -> tuple[str, str]:
    first = "ana"
    want = expected_partition(first.encode(), partitions)
    second = next(u for u in (f"bo{i}" for i in range(1000)) if expected_partition(u.encode(), partitions) == want)
    return first, second


async def decisions_by_user(settings, dsn) -> dict[str, list]:
    """Every decision on the decisions topic, opened, per user in log order."""
    from memstream.schemas.codec import decode_decision
    from memstream.keys import data_keys
    from memstream.streams.log.kafka_util import drain, groupless_consumer
    from memstream.streams.log.sealing import RecordSealer

    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    out: dict[str, list] = {}
    try:
        sealer = RecordSealer(await data_keys(settings, pool))
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as c:
            tps = [TopicPartition(settings.decisions_topic, p) for p in range(settings.partitions)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)

            async def keep(batch):
                for r in await sealer.open(batch):
                    d = decode_decision(r.value)
                    out.setdefault(d.user_id, []).append(d)

            await drain(c, tps, await c.end_offsets(tps), keep)
    finally:
        await pool.close()
    return out


async def test_two_users_of_one_partition_are_formed_side_by_side_each_in_order(settings, conn, dsn, tmp_path,
                                                                                   forbid_llm_and_embedder):
    slow = settings.model_copy(update={"extractor": "offline+latency", "stand_in_latency_p50": LATENCY,
                                       "formation_concurrency": 16})
    a, b = two_users_on_one_partition(slow.partitions)
    at = datetime(2026, 3, 1, tzinfo=timezone.utc)
    # Interleaved: a, b, a, b, ... every turn a new home, so each after the first asks the
    # resolver too (two calls: the turn's extraction, then its resolution).
    turns = [TurnRecorded.new(user_id=user, conversation_id="c", user_message=f"I live in {city}.",
                              assistant_message="Noted.", occurred_at=at + timedelta(minutes=i))
             for i, city in enumerate(CITIES) for user in (a, b)]
    async with TurnLog(slow) as log:  # before the worker starts: one batch holds them all
        await log.append_many(turns)
    serial = 2 * (1 + 2 * (len(CITIES) - 1)) * LATENCY  # every call of both users, one after another

    worker = Worker(slow, tmp_path / "worker.log")
    try:
        await worker.wait_assigned()
        t0 = time.perf_counter()
        await wait_until(lambda: conn.fetchval("SELECT count(*) = $1 FROM episodes", len(turns)), timeout=90,
                         what="every turn formed and projected")
        wall = time.perf_counter() - t0
        # Facts and graph too (each projection goes at its own pace), before the worker stops.
        await wait_until(lambda: conn.fetchval("SELECT (SELECT count(*) FROM memory_facts) = $1 AND "
                                               "(SELECT count(*) FROM memory_edges) = $1", len(turns)),
                         what="every fact and edge projected")
    finally:
        worker.stop()
    assert wall < 0.7 * serial, f"formed in {wall:.1f}s: the serial sum of the calls is {serial:.0f}s"

    for user in (a, b):  # each user's homes superseded in the order they said them
        rows = await conn.fetch("SELECT value, status FROM memory_facts WHERE user_id = $1 AND attribute = 'home' "
                                "ORDER BY version", user)
        assert [r["value"] for r in rows] == CITIES
        assert [r["status"] for r in rows] == ["superseded"] * (len(CITIES) - 1) + ["current"]
    made = await decisions_by_user(slow, dsn)
    for user in (a, b):  # on the decisions topic too: every decision after those of the turns before
        offsets = [d.source.offset for d in made[user]]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(CITIES), offsets

    forbid_llm_and_embedder()
    target = settings.postgres_schema + "_rebuilt"
    try:
        await replay(slow, dsn, target, ["episodes", "facts", "graph"])
        for table in TABLES["facts"] + TABLES["episodes"] + TABLES["graph"]:
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0), table
    finally:
        await drop_schema(dsn, target)
