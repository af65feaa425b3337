"""Benchmarks and harnesses that print numbers (``memstream bench ...``, ``memstream eval ...``)."""
from __future__ import annotations

import uuid

from memstream.config import Settings


def isolated(base: Settings, prefix: str, tag: str | None = None) -> tuple[Settings, str]:
    """``base`` with topics, consumer group and schema of its own, so a run never mixes with
    another's data (``tag``: a kept run's, to use its data again). Returns the settings and the
    run's tag."""
    tag = tag or uuid.uuid4().hex[:8]
    return base.model_copy(update={
        "events_topic": f"{prefix}.{tag}.events", "decisions_topic": f"{prefix}.{tag}.decisions",
        "dead_letter_topic": f"{prefix}.{tag}.dead-letter", "ingress_topic": f"{prefix}.{tag}.ingress",
        "group_id": f"{prefix}-{tag}",
        "postgres_schema": f"{prefix}_{tag}",
    }), tag


async def prepared(base: Settings, prefix: str) -> tuple[Settings, str, str]:
    """``isolated`` settings with the local stack up, topics created and the schema migrated.
    Returns the settings, the run's tag and the Postgres DSN."""
    from memstream.projections.db import migrate
    from memstream.stack.launcher import stack_from_settings
    from memstream.streams.log.topics import ensure_topics

    settings, tag = isolated(base, prefix)
    stack_from_settings(settings).up()
    dsn = settings.dsn()
    await ensure_topics(settings)
    await migrate(dsn, settings.postgres_schema)
    return settings, tag, dsn


async def discarded(settings: Settings, dsn: str, *also: str) -> None:
    """What a run made, gone: the schemas ``also`` and the run's own, then its topics."""
    from memstream.projections.db import drop_schema
    from memstream.streams.log.topics import drop_topics

    for schema in (*also, settings.postgres_schema):
        await drop_schema(dsn, schema)
    await drop_topics(settings)
