"""``memstream bench grow``: how fast ``memstream partitions grow`` copies the log, and how long
appends wait at its fence.

Fresh topics get ``turns`` sealed turns (``TurnLog``) and as many recorded episodes with their
vectors (``bench rebuild``'s decisions, ~3.4 kB each sealed); every step's position is set at
the topics' ends, as if the workers had applied everything; then the log is grown to twice its
partitions. Writing the topics is not timed. With no workers behind, the fenced phase measures
the procedure's own overhead: the two fences, the checks, the tail and the cut-over.
"""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from memstream.bench import discarded, prepared
from memstream.config import Settings


async def run_grow_bench(base: Settings, *, turns: int, users: int = 1000, on_progress=None) -> dict:
    from aiokafka import TopicPartition

    from memstream.bench.rebuild import _write
    from memstream.projections.db import create_pool
    from memstream.schemas import TurnRecorded
    from memstream.streams.log.kafka_util import groupless_consumer
    from memstream.streams.ops.partition_growth import grow_partitions
    from memstream.streams.log.producer import TurnLog

    settings, tag, dsn = await prepared(base, "grow")
    settings = settings.model_copy(update={"keys_schema": f"grow_keys_{tag}"})
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        t = time.perf_counter()
        at = datetime(2026, 1, 1, tzinfo=timezone.utc)
        async with TurnLog(settings) as log:
            for start in range(0, turns, 5000):
                await log.append_many([TurnRecorded.new(
                    user_id=f"grow-{i % users}", conversation_id=f"c{i % users}", user_message=f"turn {i} of the bench",
                    assistant_message="noted", occurred_at=at + timedelta(seconds=i))
                    for i in range(start, min(turns, start + 5000))])
        await _write(settings, pool, turns, users)
        write_s = time.perf_counter() - t
        async with groupless_consumer(settings.kafka_bootstrap) as c:
            rows = []
            for topic, steps in ((settings.events_topic, ("formation", "commands")),
                                 (settings.decisions_topic, ("episodes", "facts", "graph"))):
                ends = await c.end_offsets([TopicPartition(topic, p) for p in range(settings.partitions)])
                rows += [(s, topic, tp.partition, end) for s in steps for tp, end in ends.items()]
        await pool.executemany("INSERT INTO projection_positions (projection, topic, partition, next_offset) "
                               "VALUES ($1, $2, $3, $4)", rows)
        report = await grow_partitions(settings, dsn, 2 * settings.partitions, on_progress=on_progress)
        records = sum(report.copied.values())
        copy_s = report.seconds - report.fenced_s
        return {"turns": turns, "records": records, "write_topics_s": round(write_s, 1),
                "copy_s": round(copy_s, 2), "copy_records_per_s": round(records / copy_s) if copy_s else None,
                "appends_waited_s": round(report.fenced_s, 2),
                "phases_s": {k: round(v, 2) for k, v in report.phases.items()}, "total_s": round(report.seconds, 2)}
    finally:
        await pool.close()
        await discarded(settings, dsn, settings.keys_schema)
