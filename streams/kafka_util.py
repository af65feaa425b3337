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
