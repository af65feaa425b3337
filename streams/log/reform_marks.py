"""Which reform topics are whole: ``memstream reform`` registers its topic in the live schema's
``reforms`` table when it starts and marks it when it ends; a topic registered and never marked
is what a crashed reform left partway."""
from __future__ import annotations

import json
from datetime import datetime

from memstream.projections import db


async def started(pool, topic: str, extractor: str, since: datetime | None) -> None:
    await pool.execute("INSERT INTO reforms VALUES ($1, $2, $3, now(), NULL, NULL) ON CONFLICT (topic) DO UPDATE "
                       "SET extractor = EXCLUDED.extractor, since = EXCLUDED.since, started_at = now(), "
                       "finished_at = NULL, report = NULL", topic, extractor, since)


async def finished(pool, topic: str, report: dict) -> None:
    await pool.execute("UPDATE reforms SET finished_at = now(), report = $2::jsonb WHERE topic = $1",
                       topic, json.dumps(report, default=str))


async def unfinished(conn, schema: str, topic: str) -> datetime | None:
    """When the reform into ``topic`` that never finished started (None: none such, or a whole one)."""
    table = f"{db.quote(schema)}.reforms"
    if await conn.fetchval("SELECT to_regclass($1)", table) is None:
        return None  # a schema migrated before reforms were registered
    return await conn.fetchval(f"SELECT started_at FROM {table} WHERE topic = $1 AND finished_at IS NULL", topic)
