"""Small aiokafka helpers shared by replay, status and benchmarks."""
from __future__ import annotations

import asyncio
import contextlib
import time
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


async def drain(consumer: AIOKafkaConsumer, tps, high, handle, idle_s: float = 60.0) -> None:
    """Hands ``handle`` every record of the assigned partitions ``tps`` from the consumer's
    position up to the high-water mark ``high[tp]`` (exclusive), as batches of ``Record``.
    ``TimeoutError`` when no partition moved for ``idle_s`` seconds (a broker gone)."""
    from memstream.streams.log.records import Record

    remaining = {tp for tp in tps if high[tp] > await consumer.position(tp)}
    moved = time.monotonic()
    while remaining:
        fetched = await consumer.getmany(*remaining, timeout_ms=1000)
        for tp, msgs in fetched.items():
            batch = [Record(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers or ()), m.timestamp)
                     for m in msgs if m.offset < high[tp]]
            if batch:
                await handle(batch)
            if msgs:
                moved = time.monotonic()
        # By position, not by the last record: the log may end in records no fetch returns
        # (transaction markers), and the position passes them.
        for tp in list(remaining):
            if await consumer.position(tp) >= high[tp]:
                remaining.discard(tp)
        if remaining and time.monotonic() - moved > idle_s:
            raise TimeoutError(f"reading the log stopped {idle_s:.0f} s short of its end at {sorted(map(str, remaining))}")
