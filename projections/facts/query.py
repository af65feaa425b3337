"""Facts, the query side: the read path and formation retrieve current facts with the same SQL."""
from __future__ import annotations

import uuid
from typing import Sequence

import asyncpg
import numpy as np

from memstream.projections import fulltext

_COLS = ("fact_id, lineage_id, version, text, category, attribute, value, confidence, explicit, status, "
         "valid_from, valid_to, recorded_at, superseded_at, observation_count, last_observed_at")

# relaxed_order iterative scans may return rows slightly out of order: re-sort outside.
_NEAREST = f"""
WITH c AS MATERIALIZED (
    SELECT {_COLS}, embedding <=> $2 AS distance FROM memory_facts
    WHERE user_id = $1 AND status = 'current' AND embedding_model = $4
    ORDER BY embedding <=> $2 LIMIT $3)
SELECT * FROM c ORDER BY distance, fact_id
"""

_KEYWORD = fulltext.keyword_sql(table="memory_facts", key="fact_id", time_col="recorded_at", cols=_COLS,
                                where="t.status = 'current'")

_BY_ATTRIBUTE = f"""
SELECT {_COLS}, embedding FROM memory_facts
WHERE user_id = $1 AND status = 'current' AND attribute = ANY($2::text[]) AND embedding_model = $3
ORDER BY recorded_at, fact_id
"""

_HISTORY = f"""
SELECT {_COLS}, superseded_by, end_reason, reason, observed_by[1] AS decision_id, source_event_id, extractor, resolver
FROM memory_facts
WHERE user_id = $1 AND lineage_id = (SELECT lineage_id FROM memory_facts WHERE fact_id = $2 AND user_id = $1)
ORDER BY version
"""

_CURRENT = f"SELECT {_COLS} FROM memory_facts WHERE user_id = $1 AND status = 'current' ORDER BY category, attribute, recorded_at"


# A page of the user's facts in the order they were recorded, from a (recorded_at, fact_id) key on.
_PAGE = f"""
SELECT {_COLS}, superseded_by, end_reason, reason, observed_by[1] AS decision_id, source_event_id, extractor, resolver
FROM memory_facts
WHERE user_id = $1 AND ($2 OR status = 'current') AND (recorded_at, fact_id) > ($3, $4)
ORDER BY recorded_at, fact_id LIMIT $5
"""

_COUNTS = """
SELECT status, count(*) AS n, min(recorded_at) AS oldest, max(greatest(recorded_at, superseded_at)) AS newest
FROM memory_facts WHERE user_id = $1 GROUP BY status
"""


async def nearest(conn, user_id: str, embedding: np.ndarray, k: int, model: str) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_NEAREST, user_id, embedding, k, model)


async def keyword(conn, user_id: str, text: str, k: int) -> Sequence[asyncpg.Record]:
    return await fulltext.search(conn, _KEYWORD, user_id, text, k)


async def current_by_attribute(conn, user_id: str, attributes: Sequence[str], model: str) -> Sequence[asyncpg.Record]:
    """The user's current facts filling ``attributes``, embedded by ``model`` (vectors of other
    models are not comparable)."""
    return await conn.fetch(_BY_ATTRIBUTE, user_id, list(attributes), model)


async def history(conn, user_id: str, fact_id: uuid.UUID) -> Sequence[asyncpg.Record]:
    """Every version of the fact's lineage, oldest first, with when and why each one ended."""
    return await conn.fetch(_HISTORY, user_id, fact_id)


async def current(conn, user_id: str) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_CURRENT, user_id)


async def page(conn, user_id: str, include_history: bool, after: tuple, limit: int) -> Sequence[asyncpg.Record]:
    """Up to ``limit`` of the user's facts recorded after the ``(recorded_at, fact_id)`` key
    ``after``; every version with ``include_history``, else the current ones."""
    return await conn.fetch(_PAGE, user_id, include_history, *after, limit)


async def counts(conn, user_id: str) -> Sequence[asyncpg.Record]:
    """Per status: how many versions, the oldest recorded and the newest recorded or ended."""
    return await conn.fetch(_COUNTS, user_id)


async def holder(conn, fact_id: uuid.UUID, user_id: str) -> asyncpg.Record | None:
    """Whose fact ``fact_id`` is, its status, slot and value: ``user_id``'s own if they hold it,
    else any user's (for a control command to say whether an id is unknown or another user's)."""
    return await conn.fetchrow("SELECT user_id, status, attribute, value FROM memory_facts WHERE fact_id = $1 "
                               "ORDER BY user_id = $2 DESC LIMIT 1", fact_id, user_id)
