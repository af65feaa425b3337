"""Facts, the query side: the read path and formation retrieve current facts with the same SQL."""
from __future__ import annotations

import uuid
from typing import Sequence

import asyncpg
import numpy as np

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

# As for episodes: all words (AND, selective, via the per-user GIN) plus the newest current
# facts matching any word (OR), capped.
_KEYWORD = f"""
WITH lx AS (SELECT array_agg(DISTINCT quote_literal(lexeme)) AS l FROM unnest(to_tsvector('english', $2))),
     qs AS (SELECT array_to_string(l, ' & ')::tsquery && quote_literal('u' || md5($1))::tsquery AS qa,
                   array_to_string(l, ' | ')::tsquery AS qo
            FROM lx WHERE l IS NOT NULL),
     hits AS ((SELECT f.fact_id FROM memory_facts f, qs WHERE f.tsv @@ qs.qa AND f.status = 'current' LIMIT 200)
              UNION
              (SELECT f.fact_id FROM memory_facts f, qs WHERE f.user_id = $1 AND f.status = 'current' AND f.tsv @@ qs.qo
               ORDER BY f.recorded_at DESC LIMIT 200))
SELECT {_COLS}, ts_rank_cd(tsv, qs.qo) AS rank FROM memory_facts JOIN hits USING (fact_id), qs
ORDER BY rank DESC, recorded_at DESC, fact_id LIMIT $3
"""

# Names mode: only the given terms (names, IDs, numbers), fully served by the per-user GIN.
_KEYWORD_TERMS = f"""
WITH q AS (SELECT (SELECT string_agg(quote_literal(lexeme), ' | ') FROM unnest(to_tsvector('english', $2)))::tsquery AS terms,
                  quote_literal('u' || md5($1))::tsquery AS owner)
SELECT {_COLS}, ts_rank_cd(tsv, q.terms) AS rank FROM memory_facts f, q
WHERE q.terms IS NOT NULL AND f.tsv @@ (q.terms && q.owner) AND f.status = 'current'
ORDER BY rank DESC, recorded_at DESC, fact_id LIMIT $3
"""

_BY_ATTRIBUTE = f"""
SELECT {_COLS}, embedding FROM memory_facts
WHERE user_id = $1 AND status = 'current' AND attribute = ANY($2::text[])
ORDER BY recorded_at, fact_id
"""

_HISTORY = f"""
SELECT {_COLS}, superseded_by, end_reason, reason FROM memory_facts
WHERE user_id = $1 AND lineage_id = (SELECT lineage_id FROM memory_facts WHERE fact_id = $2 AND user_id = $1)
ORDER BY version
"""

_CURRENT = f"SELECT {_COLS} FROM memory_facts WHERE user_id = $1 AND status = 'current' ORDER BY category, attribute, recorded_at"


async def nearest(conn, user_id: str, embedding: np.ndarray, k: int, model: str) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_NEAREST, user_id, embedding, k, model)


async def keyword(conn, user_id: str, text: str, k: int, *, names_only: bool = False) -> Sequence[asyncpg.Record]:
    """Keyword channel. Default: the message's words (all of them, then the newest rows matching
    any). ``names_only``: ``text`` holds only names/IDs/numbers (``read_client.terms``) — much
    cheaper for heavy users, at some cost in recall."""
    return await conn.fetch(_KEYWORD_TERMS if names_only else _KEYWORD, user_id, text, k)


async def current_by_attribute(conn, user_id: str, attributes: Sequence[str]) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_BY_ATTRIBUTE, user_id, list(attributes))


async def history(conn, user_id: str, fact_id: uuid.UUID) -> Sequence[asyncpg.Record]:
    """Every version of the fact's lineage, oldest first, with when and why each one ended."""
    return await conn.fetch(_HISTORY, user_id, fact_id)


async def current(conn, user_id: str) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_CURRENT, user_id)
