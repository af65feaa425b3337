"""The keyword channel's SQL, one design for every table that has a per-user ``tsv``.

Each tsvector carries a lexeme naming its user (migration 0005), so the GIN scan stays inside the
user. Words mode: every word of the message (AND) — selective, so ranked in full — plus, for
recall, the newest rows matching any word (OR), capped so a heavy user with thousands of loose
matches costs a bounded scan. Names mode: only the given terms (names, IDs, numbers), fully
served by the GIN. '::tsquery' keeps lexemes as to_tsvector produced them instead of stemming
them twice. Parameters: $1 user_id, $2 text, $3 k.
"""
from __future__ import annotations

from typing import Sequence

import asyncpg

OR_CAP = 200


def keyword_sql(*, table: str, key: str, time_col: str, cols: str, where: str = "") -> tuple[str, str]:
    """(words-mode SQL, names-mode SQL) for ``table``; ``where`` is an extra row filter."""
    extra = f" AND {where}" if where else ""
    words = f"""
WITH lx AS (SELECT array_agg(DISTINCT quote_literal(lexeme)) AS l FROM unnest(to_tsvector('english', $2))),
     qs AS (SELECT array_to_string(l, ' & ')::tsquery && quote_literal('u' || md5($1))::tsquery AS qa,
                   array_to_string(l, ' | ')::tsquery AS qo
            FROM lx WHERE l IS NOT NULL),
     hits AS ((SELECT t.{key} FROM {table} t, qs WHERE t.tsv @@ qs.qa{extra} LIMIT {OR_CAP})
              UNION
              (SELECT t.{key} FROM {table} t, qs WHERE t.user_id = $1{extra} AND t.tsv @@ qs.qo
               ORDER BY t.{time_col} DESC LIMIT {OR_CAP}))
SELECT {cols}, ts_rank_cd(tsv, qs.qo) AS rank FROM {table} JOIN hits USING ({key}), qs
ORDER BY rank DESC, {time_col} DESC, {key} LIMIT $3
"""
    names = f"""
WITH q AS (SELECT (SELECT string_agg(quote_literal(lexeme), ' | ') FROM unnest(to_tsvector('english', $2)))::tsquery AS terms,
                  quote_literal('u' || md5($1))::tsquery AS owner)
SELECT {cols}, ts_rank_cd(tsv, q.terms) AS rank FROM {table} t, q
WHERE q.terms IS NOT NULL AND t.tsv @@ (q.terms && q.owner){extra}
ORDER BY rank DESC, {time_col} DESC, {key} LIMIT $3
"""
    return words, names


async def search(conn, sql: tuple[str, str], user_id: str, text: str, k: int, names_only: bool) -> Sequence[asyncpg.Record]:
    """Keyword channel. Default: the message's words. ``names_only``: ``text`` holds only
    names/IDs/numbers (``read_client.terms``) — much cheaper for heavy users, at some cost in recall."""
    return await conn.fetch(sql[1] if names_only else sql[0], user_id, text, k)
