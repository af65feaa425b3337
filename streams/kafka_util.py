"""Small aiokafka helpers shared by replay, status and benchmarks."""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from aiokafka import AIOKafkaConsumer


@contextlib.asynccontextmanager
async def groupless_consumer(bootstrap: str, **kwargs) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer outside any group (manual assignment, no commits)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **kwargs)
    await consumer.start()
    try:
        yield consumer
    finally:
        # aiokafka 0.14 cancels its no-group bookkeeping task on stop; if that task never ran,
        # stop() re-raises CancelledError. One turn of the loop lets it start.
        await asyncio.sleep(0)
        await consumer.stop()


async def partitions_of(consumer: AIOKafkaConsumer, topic: str) -> list[int]:
    """Partition ids of ``topic`` (a group-less consumer has no metadata for unsubscribed topics)."""
    metadata = await consumer._client.fetch_all_metadata()
    return sorted(metadata.partitions_for_topic(topic) or ())


async def drain(consumer: AIOKafkaConsumer, tps, high, handle) -> None:
    """Hands ``handle`` every record of the assigned partitions ``tps`` from the consumer's
    position up to the high-water mark ``high[tp]`` (exclusive), as batches of ``Record``."""
    from memstream.streams.records import Record

    remaining = {tp for tp in tps if high[tp] > await consumer.position(tp)}
    while remaining:
        fetched = await consumer.getmany(*remaining, timeout_ms=1000)
        for tp, msgs in fetched.items():
            batch = [Record(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers or ()), m.timestamp)
                     for m in msgs if m.offset < high[tp]]
            if batch:
                await handle(batch)
            if msgs and msgs[-1].offset + 1 >= high[tp]:
                remaining.discard(tp)
