"""``memstream sweep decay`` and ``sweep reflect``: a sweep run once, by an operator, for every
user or one.

It weighs the facts as of now (or ``--as-of``), appends the requests (``streams.worker.sweeping``)
unless ``--dry-run``, and records the sweep per partition of the events topic. Formation turns
the requests into ``FactArchived`` decisions in order with each user's turns; a replay applies
those without a sweep, a clock or a model.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from memstream.config import Settings
from memstream.schemas.errors import InvalidArgument
from memstream.streams.worker.sweeping import Plan, sweep


def _as_of(at: datetime | None, dry_run: bool) -> datetime:
    """``at`` (default now); a time to come only for a dry run: recorded on the log, a sweep
    dated years ahead would archive what is not weak yet and keep cooled episodes cold until then."""
    now = datetime.now(timezone.utc)
    if at is not None and at > now + FUTURE_SLACK and not dry_run:
        raise InvalidArgument(f"--as-of {at.isoformat()} is to come: only a --dry-run may look ahead")
    return at or now


FUTURE_SLACK = timedelta(minutes=1)  # clocks of two hosts disagree by this much at most


async def sweep_decay(settings: Settings, dsn: str, *, user_id: str | None = None, dry_run: bool = False,
                      at: datetime | None = None, on_progress=None) -> Plan:
    """A sweep as of ``at`` (default now) of every user or ``user_id`` (``sweeping.sweep``)."""
    from memstream.projections.db import create_pool

    at = _as_of(at, dry_run)
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        return await sweep(settings, pool, at=at, user_id=user_id, dry_run=dry_run,
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

    at = _as_of(at, dry_run)
    model = embedder_for(settings).model_id
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        return await reflect(settings, pool, at=at, model=model, user_id=user_id,
                             dry_run=dry_run, on_progress=on_progress)
    finally:
        await pool.close()
