"""Episodes, the query side used by the read client (no writes, no Faust)."""
from __future__ import annotations

from typing import Sequence

import asyncpg
import numpy as np

_COLS = "episode_id, conversation_id, occurred_at, user_message, assistant_message, metadata"

# relaxed_order iterative scans may return rows slightly out of order: re-sort outside.
_NEAREST = f"""
WITH c AS MATERIALIZED (
    SELECT {_COLS}, embedding <=> $2 AS distance FROM episodes
    WHERE user_id = $1 AND embedding_model = $4
    ORDER BY embedding <=> $2 LIMIT $3)
SELECT * FROM c ORDER BY distance, episode_id
"""

# Keyword channel: every word of the message (AND) — selective, so ranked in full — plus, for
# recall, the newest rows matching any word (OR), capped so a heavy user with thousands of
# loose matches costs a bounded scan. The user lexeme keeps the GIN scan to this user's rows.
# '::tsquery' keeps lexemes as to_tsvector produced them instead of stemming them twice.
KEYWORD_OR_CAP = 200
_KEYWORD = f"""
WITH lx AS (SELECT array_agg(DISTINCT quote_literal(lexeme)) AS l FROM unnest(to_tsvector('english', $2))),
     qs AS (SELECT array_to_string(l, ' & ')::tsquery && quote_literal('u' || md5($1))::tsquery AS qa,
                   array_to_string(l, ' | ')::tsquery AS qo
            FROM lx WHERE l IS NOT NULL),
     hits AS ((SELECT e.episode_id FROM episodes e, qs WHERE e.tsv @@ qs.qa LIMIT {KEYWORD_OR_CAP})
              UNION
              (SELECT e.episode_id FROM episodes e, qs WHERE e.user_id = $1 AND e.tsv @@ qs.qo
               ORDER BY e.occurred_at DESC LIMIT {KEYWORD_OR_CAP}))
SELECT {_COLS}, ts_rank_cd(tsv, qs.qo) AS rank FROM episodes JOIN hits USING (episode_id), qs
ORDER BY rank DESC, occurred_at DESC, episode_id LIMIT $3
"""

# Names mode: only the given terms (names, IDs, numbers), fully served by the per-user GIN.
_KEYWORD_TERMS = f"""
WITH q AS (SELECT (SELECT string_agg(quote_literal(lexeme), ' | ') FROM unnest(to_tsvector('english', $2)))::tsquery AS terms,
                  quote_literal('u' || md5($1))::tsquery AS owner)
SELECT {_COLS}, ts_rank_cd(tsv, q.terms) AS rank FROM episodes e, q
WHERE q.terms IS NOT NULL AND e.tsv @@ (q.terms && q.owner)
ORDER BY rank DESC, occurred_at DESC, episode_id LIMIT $3
"""

_RECENT = f"""
SELECT {_COLS} FROM (
    SELECT {_COLS} FROM episodes WHERE user_id = $1 AND conversation_id = $2
    ORDER BY occurred_at DESC, episode_id DESC LIMIT $3) t
ORDER BY occurred_at, episode_id
"""


async def nearest(conn, user_id: str, embedding: np.ndarray, k: int, model: str) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_NEAREST, user_id, embedding, k, model)


async def keyword(conn, user_id: str, text: str, k: int, *, names_only: bool = False) -> Sequence[asyncpg.Record]:
    """Keyword channel. Default: the message's words (all of them, then the newest rows matching
    any). ``names_only``: ``text`` holds only names/IDs/numbers (``read_client.terms``) — much
    cheaper for heavy users, at some cost in recall."""
    return await conn.fetch(_KEYWORD_TERMS if names_only else _KEYWORD, user_id, text, k)


async def recent(conn, user_id: str, conversation_id: str, n: int) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_RECENT, user_id, conversation_id, n)


async def epoch(conn, projection: str = "episodes") -> int:
    return await conn.fetchval("SELECT epoch FROM projection_epochs WHERE projection = $1", projection)


async def applied_through(conn, projection: str, topic: str, partition: int) -> int:
    """The next offset of ``topic``/``partition`` that ``projection`` has not yet applied."""
    value = await conn.fetchval(
        "SELECT next_offset FROM projection_positions WHERE projection = $1 AND topic = $2 AND partition = $3",
        projection, topic, partition,
    )
    return value or 0
