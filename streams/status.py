"""``memstream status``: each projection's position per partition and its lag behind Kafka."""
from __future__ import annotations

from aiokafka import TopicPartition

from memstream.config import Settings
from memstream.projections import db
from memstream.streams.kafka_util import groupless_consumer, partitions_of


async def projection_status(settings: Settings, dsn: str) -> list[str]:
    pool = await db.create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        rows = await pool.fetch("SELECT projection, topic, partition, next_offset FROM projection_positions ORDER BY 1, 2, 3")
        async with groupless_consumer(settings.kafka_bootstrap) as consumer:
            return await _lines(settings, consumer, rows)
    finally:
        await pool.close()


async def _lines(settings: Settings, consumer, rows) -> list[str]:
    topics = {r["topic"] for r in rows} | {settings.events_topic, settings.decisions_topic}
    tps = [TopicPartition(t, p) for t in sorted(topics) for p in await partitions_of(consumer, t)]
    ends = await consumer.end_offsets(tps) if tps else {}
    lines = [f"{'projection':<11} {'topic':<24} {'part':>4} {'applied':>9} {'end':>9} {'lag':>7}"]
    for r in rows:
        end = ends.get(TopicPartition(r["topic"], r["partition"]), 0)
        lines.append(f"{r['projection']:<11} {r['topic']:<24} {r['partition']:>4} {r['next_offset']:>9} "
                     f"{end:>9} {max(end - r['next_offset'], 0):>7}")
    dlq = [TopicPartition(settings.dead_letter_topic, p)
           for p in await partitions_of(consumer, settings.dead_letter_topic)]
    if dlq:
        dead = sum((await consumer.end_offsets(dlq)).values())
        lines.append(f"dead letters in {settings.dead_letter_topic}: {dead}")
    return lines
