"""``memstream sweep decay``: a decay sweep run once, by an operator, for every user or one.

It weighs the facts as of now (or ``--as-of``), appends the requests (``streams.worker.sweeping``)
unless ``--dry-run``, and records the sweep per partition of the events topic. Formation turns
the requests into ``FactArchived`` decisions in order with each user's turns; a replay applies
those without a sweep, a clock or a model.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone

from memstream.config import Settings
from memstream.streams.log.screening import expected_partition
from memstream.streams.worker.sweeping import Plan, plan, record, requests

log = logging.getLogger("memstream.sweep")


async def sweep_decay(settings: Settings, dsn: str, *, user_id: str | None = None, dry_run: bool = False,
                      at: datetime | None = None, on_progress=None) -> Plan:
    """Plan a sweep as of ``at`` (default now) and, unless ``dry_run``, append its requests and
    record it per partition of the events topic (``memstream status``)."""
    from memstream.projections.db import create_pool
    from memstream.streams.log.kafka_util import groupless_consumer, partitions_of
    from memstream.streams.log.producer import TurnLog

    at = at or datetime.now(timezone.utc)
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        async with pool.acquire() as conn:
            found = await plan(conn, at=at, threshold=settings.decay_threshold, user_id=user_id)
        log.info("decay sweep %s: %d facts weighed, %d of %d users below %.2f%s", found.sweep_id,
                 found.facts_weighed, found.archiving, len(found.weak), found.threshold, " (dry run)" if dry_run else "")
        if dry_run or not found.weak:
            return found
        asked = requests(found)
        async with TurnLog(settings) as turns:
            for n, request in enumerate(asked, 1):
                await turns.append(request)
                if on_progress:
                    on_progress(n, len(asked))
            topic = turns.events_topic
        async with groupless_consumer(settings.kafka_bootstrap) as consumer:
            partitions = len(await partitions_of(consumer, topic))
        async with pool.acquire() as conn:
            # One user's sweep swept their partition, not the others.
            await record(conn, topic, found, partitions,
                         only=None if user_id is None else [expected_partition(user_id.encode(), partitions)])
        return found
    finally:
        await pool.close()
