"""The keyword channel's SQL, one design for every table that has a per-user ``tsv``.

Each tsvector carries a lexeme naming its user (migration 0005), so the GIN scan stays inside the
user; every part also says ``user_id = $1`` so the planner prunes to the user's partition (0006).
Candidates: rows containing every word of the text (AND, over all the user's rows, through the
GIN: selective) plus, for recall, rows containing any word among the user's newest ``RECENT``
rows. Both parts are bounded whatever the user's size — ranking every loose match of a
100k-row user cost 50 ms (measured) — and only the candidates are ranked. Older rows matching
only some of the words are left to the vector channels. '::tsquery' keeps lexemes as
to_tsvector produced them instead of stemming them twice. Parameters: $1 user_id, $2 text, $3 k.
"""
from __future__ import annotations

from typing import Sequence

import asyncpg

CAP = 200  # AND matches taken, and OR matches taken among the newest rows
RECENT = 1000


def keyword_sql(*, table: str, key: str, time_col: str, cols: str, where: str = "") -> str:
    """The keyword query for ``table``; ``where`` is an extra row filter on alias ``t``."""
    extra = f" AND {where}" if where else ""
    return f"""
WITH lx AS (SELECT array_agg(DISTINCT quote_literal(lexeme)) AS l FROM unnest(to_tsvector('english', $2))),
     qs AS (SELECT array_to_string(l, ' & ')::tsquery && quote_literal('u' || md5($1))::tsquery AS qa,
                   array_to_string(l, ' | ')::tsquery AS qo
            FROM lx WHERE l IS NOT NULL),
     newest AS MATERIALIZED (SELECT t.{key}, t.tsv FROM {table} t WHERE t.user_id = $1{extra}
                             ORDER BY t.{time_col} DESC LIMIT {RECENT}),
     hits AS ((SELECT t.{key} FROM {table} t, qs WHERE t.user_id = $1 AND t.tsv @@ qs.qa{extra} LIMIT {CAP})
              UNION
              (SELECT n.{key} FROM newest n, qs WHERE n.tsv @@ qs.qo LIMIT {CAP}))
SELECT {cols}, ts_rank_cd(tsv, qs.qo) AS rank FROM {table} JOIN hits USING ({key}), qs
WHERE user_id = $1
ORDER BY rank DESC, {time_col} DESC, {key} LIMIT $3
"""


async def search(conn, sql: str, user_id: str, text: str, k: int) -> Sequence[asyncpg.Record]:
    """Keyword channel over ``text``: the message, or only its names/IDs/numbers
    (``read_client.terms``, the reader's ``keyword_mode="names"``)."""
    return await conn.fetch(sql, user_id, text, k)
