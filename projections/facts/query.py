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

# Archived facts (a decay sweep's): out of the partial HNSW index, so scanned exactly — a user's
# archive, read only when a caller asks for it.
_NEAREST_ARCHIVED = f"""
SELECT {_COLS}, embedding <=> $2 AS distance FROM memory_facts
WHERE user_id = $1 AND status = 'archived' AND embedding_model = $4
ORDER BY distance, fact_id LIMIT $3
"""

_KEYWORD = fulltext.keyword_sql(table="memory_facts", key="fact_id", time_col="recorded_at", cols=_COLS,
                                where="t.status = 'current'")

_BY_ATTRIBUTE = f"""
SELECT {_COLS}, embedding FROM memory_facts
WHERE user_id = $1 AND status = 'current' AND attribute = ANY($2::text[]) AND embedding_model = $3
ORDER BY recorded_at, fact_id
"""

_HISTORY = f"""
SELECT {_COLS}, superseded_by, end_reason, reason, observed_by[1] AS decision_id, source_event_id, extractor, resolver,
       derived_from, derived_from_turns
FROM memory_facts
WHERE user_id = $1 AND lineage_id = (SELECT lineage_id FROM memory_facts WHERE fact_id = $2 AND user_id = $1)
ORDER BY version
"""

_CURRENT = f"SELECT {_COLS} FROM memory_facts WHERE user_id = $1 AND status = 'current' ORDER BY category, attribute, recorded_at"


# A page of the user's facts of one status (or every version: NULL) in the order they were
# recorded, from a (recorded_at, fact_id) key on.
_PAGE = f"""
SELECT {_COLS}, superseded_by, end_reason, reason, observed_by[1] AS decision_id, source_event_id, extractor, resolver,
       derived_from, derived_from_turns
FROM memory_facts
WHERE user_id = $1 AND ($2::text IS NULL OR status = $2) AND (recorded_at, fact_id) > ($3, $4)
ORDER BY recorded_at, fact_id LIMIT $5
"""

_COUNTS = """
SELECT status, count(*) AS n, min(recorded_at) AS oldest, max(greatest(recorded_at, superseded_at)) AS newest
FROM memory_facts WHERE user_id = $1 GROUP BY status
"""




def _as_of(valid: str, recorded: str) -> str:
    """The fact versions believed at ``recorded`` to hold at ``valid``: recorded by then, and
    either ending after ``valid`` or not yet ended as believed then (a version ended later was
    open-ended then); a forgotten fact at no time. A correction ends the old version where it
    began, so as of a time after it, the old value never held; before it, it did."""
    return (f"user_id = $1 AND status <> 'forgotten' AND recorded_at <= {recorded} AND valid_from <= {valid} "
            f"AND (valid_to IS NULL OR superseded_at > {recorded} OR valid_to > {valid})")


# As of a moment, over every version of the user's facts (a user's versions are few: scanned whole).
_NEAREST_AS_OF = f"""
SELECT {_COLS}, embedding <=> $2 AS distance FROM memory_facts
WHERE {_as_of("$5", "$6")} AND embedding_model = $4
ORDER BY distance, fact_id LIMIT $3
"""
_KEYWORD_AS_OF = f"""
WITH q AS (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery
                   && quote_literal('u' || md5($1))::tsquery AS q FROM (  -- the user's lexeme: their rows only (0005)
               SELECT lexeme FROM unnest(to_tsvector('english', $2)) LIMIT {fulltext.MAX_TERMS}) l)
SELECT {_COLS}, ts_rank(tsv, q.q) AS rank FROM memory_facts, q
WHERE q.q IS NOT NULL AND tsv @@ q.q AND {_as_of("$4", "$5")}
ORDER BY rank DESC, recorded_at DESC, fact_id LIMIT $3
"""
_ALL_AS_OF = f"SELECT {_COLS} FROM memory_facts WHERE {_as_of('$2', '$3')} ORDER BY recorded_at, fact_id"


async def nearest(conn, user_id: str, embedding: np.ndarray, k: int, model: str,
                  as_of=None) -> Sequence[asyncpg.Record]:
    """The ``k`` current facts nearest ``embedding``; with ``as_of`` (an ``AsOf`` with both axes),
    the versions that held then, as believed then."""
    if as_of is not None:
        return await conn.fetch(_NEAREST_AS_OF, user_id, embedding, k, model, as_of.valid_time, as_of.recorded_time)
    return await conn.fetch(_NEAREST, user_id, embedding, k, model)


class Archived:
    """The archived facts' nearest search, in the shape the read path's channels call (``q.nearest``)."""

    @staticmethod
    async def nearest(conn, user_id: str, embedding: np.ndarray, k: int, model: str) -> Sequence[asyncpg.Record]:
        return await conn.fetch(_NEAREST_ARCHIVED, user_id, embedding, k, model)


async def keyword(conn, user_id: str, text: str, k: int, as_of=None) -> Sequence[asyncpg.Record]:
    if as_of is not None:
        return await conn.fetch(_KEYWORD_AS_OF, user_id, text, k, as_of.valid_time, as_of.recorded_time)
    return await fulltext.search(conn, _KEYWORD, user_id, text, k)


async def as_of(conn, user_id: str, valid_time, recorded_time) -> Sequence[asyncpg.Record]:
    """Every fact version that held at ``valid_time`` as believed at ``recorded_time``."""
    return await conn.fetch(_ALL_AS_OF, user_id, valid_time, recorded_time)


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
    return await conn.fetch(_PAGE, user_id, None if include_history else "current", *after, limit)


async def archived_page(conn, user_id: str, after: tuple, limit: int) -> Sequence[asyncpg.Record]:
    """Up to ``limit`` of the user's archived facts (a decay sweep took them off the read path)
    recorded after the ``(recorded_at, fact_id)`` key ``after``, oldest first."""
    return await conn.fetch(_PAGE, user_id, "archived", *after, limit)


async def refused_page(conn, user_id: str, after: tuple, limit: int) -> Sequence[asyncpg.Record]:
    """Up to ``limit`` of the user's refused candidates recorded after the ``(recorded_at,
    decision_id)`` key ``after``, oldest first."""
    return await conn.fetch(
        "SELECT decision_id, source_event_id, recorded_at, refusal, reason, text, category, attribute, value, "
        "evidence, extractor FROM fact_refusals WHERE user_id = $1 AND (recorded_at, decision_id) > ($2, $3) "
        "ORDER BY recorded_at, decision_id LIMIT $4", user_id, *after, limit)


async def counts(conn, user_id: str) -> Sequence[asyncpg.Record]:
    """Per status: how many versions, the oldest recorded and the newest recorded or ended."""
    return await conn.fetch(_COUNTS, user_id)


async def holder(conn, fact_id: uuid.UUID, user_id: str) -> asyncpg.Record | None:
    """Whose fact ``fact_id`` is, its status, slot and value: ``user_id``'s own if they hold it,
    else any user's (for a control request to say whether an id is unknown or another user's)."""
    return await conn.fetchrow("SELECT user_id, status, attribute, value FROM memory_facts WHERE fact_id = $1 "
                               "ORDER BY user_id = $2 DESC LIMIT 1", fact_id, user_id)


async def turns(conn, user_id: str, fact_id: uuid.UUID) -> list[uuid.UUID]:
    """The turns (event ids) forgetting the user's fact forgets: those its version, and the
    earlier versions of its lineage saying the same value (forgotten with it), were read from."""
    rows = await conn.fetch(
        "SELECT v.source_event_id, v.observed_in FROM memory_facts f JOIN memory_facts v ON v.user_id = f.user_id "
        "AND v.lineage_id = f.lineage_id AND lower(v.value) = lower(f.value) AND v.status <> 'forgotten' "
        "AND v.version <= f.version WHERE f.user_id = $1 AND f.fact_id = $2 ORDER BY v.version", user_id, fact_id)
    return list(dict.fromkeys(t for r in rows for t in (r["source_event_id"], *r["observed_in"])))
