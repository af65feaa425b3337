"""``memstream sweep decay`` and ``sweep reflect``: a sweep run once, by an operator, for every
user or one.

It weighs the facts as of now (or ``--as-of``), appends the requests (``streams.worker.sweeping``)
unless ``--dry-run``, and records the sweep per partition of the events topic. Formation turns
the requests into ``FactArchived`` decisions in order with each user's turns; a replay applies
those without a sweep, a clock or a model.
"""
from __future__ import annotations

from datetime import datetime, timezone

from memstream.config import Settings
from memstream.streams.worker.sweeping import Plan, sweep


async def sweep_decay(settings: Settings, dsn: str, *, user_id: str | None = None, dry_run: bool = False,
                      at: datetime | None = None, on_progress=None) -> Plan:
    """A sweep as of ``at`` (default now) of every user or ``user_id`` (``sweeping.sweep``)."""
    from memstream.projections.db import create_pool

    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        return await sweep(settings, pool, at=at or datetime.now(timezone.utc), user_id=user_id, dry_run=dry_run,
                           on_progress=on_progress)
    finally:
        await pool.close()


async def sweep_reflect(settings: Settings, dsn: str, *, user_id: str | None = None, dry_run: bool = False,
                        at: datetime | None = None, on_progress=None):
    """A reflection sweep as of ``at`` (default now) of every user or ``user_id``
    (``reflecting.sweep``), over the facts the configured embedder embedded."""
    from memstream.embedding import embedder_for
    from memstream.projections.db import create_pool
    from memstream.streams.worker.reflecting import sweep as reflect

    model = embedder_for(settings).model_id
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        return await reflect(settings, pool, at=at or datetime.now(timezone.utc), model=model, user_id=user_id,
                             dry_run=dry_run, on_progress=on_progress)
    finally:
        await pool.close()
