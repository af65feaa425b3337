"""Operating it on the real stack: a worker that finds partitions added under it stops, saying
what happened and what to do, rather than project users whose records now straddle partitions."""
from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

pytestmark = pytest.mark.asyncio


async def test_a_worker_stops_with_a_clear_error_when_partitions_are_added_under_it(settings, workers):
    w = workers()
    await w.wait_assigned()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:  # what `kafka-topics --alter --partitions 6` does
        await admin.create_partitions({settings.events_topic: NewPartitions(total_count=settings.partitions + 2)})
    finally:
        await admin.close()
    code = await asyncio.to_thread(w.proc.wait, 60)
    assert code == 78, w.log()[-3000:]
    assert "the partition count changed under this worker" in w.log()
    assert "Operations" in w.log()  # where to read what to do
