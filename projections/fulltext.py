"""The keyword channel's SQL, one design for every table that has a per-user ``tsv`` and a
``<table>_terms`` postings table (migration 0008).

The text's words are its first ``MAX_TERMS`` distinct lexemes. Candidates: rows containing any
of them among the user's newest ``RECENT`` rows (for recall), plus rows containing every word
(AND, over all the user's rows, through the GIN index: selective; each tsvector carries a lexeme
naming its user, migration 0005; ``<table>_all_words``, migration 0009, planned for its arguments
however this statement is planned). Both parts are bounded whatever the user's size — ranking
every loose match of a heavy user's rows was the slowest part of a read (measured) — and only the candidates are ranked,
by BM25. Older rows matching only some of the words are left to the vector channels. The newest
rows are found without reading them: the window's start comes from the (user, time) index and
its matches from the postings' primary key, both index-only. Every part says ``user_id = $1`` so
the planner prunes to the user's partition (0006). '::tsquery' keeps lexemes as to_tsvector
produced them instead of stemming them twice.
Parameters: $1 user_id, $2 text, $3 k.
"""
from __future__ import annotations

from typing import Sequence

import asyncpg

CAP = 200  # AND matches taken
RECENT = 1000  # the window's default, in rows; the episodes' is wider (projections.episodes.query)
# Words of the message searched: the first ones it uses. A pasted page of distinct words costs
# a keyword statement per word, up to the statement timeout; 32 cover any question (BENCHMARKS.md,
# "Keyword channel: long messages"). The query embedding likewise reads only the message's first
# 256 tokens.
MAX_TERMS = 32


def keyword_sql(*, table: str, key: str, time_col: str, cols: str, where: str = "", ranged: bool = False,
                density: int | None = None, recent: int = RECENT) -> str:
    """The keyword query for ``table``; ``where`` is an extra row filter on alias ``t`` (the
    postings and ``<table>_all_words`` match exactly the rows it matches). ``ranged``: only rows
    whose ``time_col`` is in [$4, $5). ``density``: a row of more distinct words than that (its
    postings' ``words``) has its score divided by how many times more it has. ``recent``: the
    window's rows."""
    extra = f" AND {where}" if where else ""
    words = "p.words" if density else "0"
    # Only rows scored in full can make the all-words scan needless: an older row holding every
    # word outranks a diluted one.
    undiluted = f"WHERE m.words <= {density} " if density else ""
    all_words = (f"{table}_all_words_between($1, qs.qa, {CAP}, $4, $5)" if ranged
                 else f"{table}_all_words($1, qs.qa, {CAP})")
    per = (lambda n: f" / greatest(1.0, ({n})::float8 / {density})") if density else (lambda n: "")
    span = ""
    if ranged:
        extra += f" AND t.{time_col} >= $4 AND t.{time_col} < $5"
        span = " AND p.at < $5"
    return f"""
WITH lx AS (SELECT array_agg(lexeme ORDER BY lexeme) AS l FROM (
                SELECT t.lexeme FROM unnest(to_tsvector('english', $2)) t
                ORDER BY (SELECT min(p) FROM unnest(t.positions) p), t.lexeme LIMIT {MAX_TERMS}) f),
     words AS (SELECT w, quote_literal(w)::tsquery AS q FROM lx, unnest(lx.l) AS w),
     qs AS (SELECT (SELECT string_agg(quote_literal(w), ' & ') FROM unnest(l) w)::tsquery
                   && quote_literal('u' || md5($1))::tsquery AS qa
            FROM lx WHERE l IS NOT NULL),
     -- The window: where the user's newest RECENT rows begin, and how many there are.
     win AS (SELECT min(at) AS since, count(*) AS n FROM (
                 SELECT t.{time_col} AS at FROM {table} t
                 WHERE t.user_id = $1{extra} AND EXISTS (SELECT FROM qs)  -- no words: no scan
                 ORDER BY t.{time_col} DESC LIMIT {recent}) w),
     m AS MATERIALIZED (SELECT p.term AS w, p.{key}, p.at, {words} AS words FROM {table}_terms p
                        WHERE p.user_id = $1 AND p.term = ANY((SELECT l FROM lx)::text[])
                          AND p.at >= (SELECT since FROM win){span}),
     -- Rank: BM25 with term frequency 1, i.e. the sum of the idf of the query words a row
     -- contains, document frequencies over the user's newest rows; no length normalisation for
     -- rows of up to ``density`` distinct words (short turns: BM25's b = 0), the score divided by
     -- how many times longer for longer ones (a long turn is judged by the density of its
     -- matches; BENCHMARKS.md has both). Rows holding every word in the window: a row outside
     -- it holding every word ranks no higher unless it is denser, and is older, so with k of
     -- these the all-words scan below is skipped (one-word questions: the scan was every row
     -- with that word); only undiluted rows count there.
     whole AS (SELECT count(*) AS n FROM (SELECT m.{key} FROM m {undiluted}GROUP BY m.{key}
                                         HAVING count(*) = (SELECT count(*) FROM words)) f),
     idf AS (SELECT words.w, words.q, ln(1 + (win.n - count(m.{key}) + 0.5) / (count(m.{key}) + 0.5)) AS idf
             FROM words CROSS JOIN win LEFT JOIN m ON m.w = words.w GROUP BY words.w, words.q, win.n),
     scored AS ((SELECT m.{key}, m.at, sum(idf.idf){per("m.words")} AS rank FROM m JOIN idf USING (w)
                 GROUP BY m.{key}, m.at, m.words)
                UNION
                (SELECT a.{key}, a.at, sum(idf.idf){per("a.words")} FROM idf JOIN
                    (SELECT f.{key}, f.tsv, f.at, length(f.tsv) - 1 AS words FROM qs, {all_words} f
                     WHERE (SELECT n FROM whole) < $3) a
                    ON a.tsv @@ idf.q GROUP BY a.{key}, a.at, a.words)),
     -- The k best before the join back: only they are read whole.
     top AS (SELECT {key}, max(rank) AS rank, max(at) AS at FROM scored GROUP BY {key}
             ORDER BY rank DESC, at DESC, {key} LIMIT $3)
SELECT {cols}, top.rank FROM {table} JOIN top USING ({key})
WHERE user_id = $1
ORDER BY top.rank DESC, top.at DESC, {key}
"""


async def search(conn, sql: str, user_id: str, text: str, k: int, *span) -> Sequence[asyncpg.Record]:
    """Keyword channel over ``text``: the message, or only its names/IDs/numbers
    (``read_client.terms``, the reader's ``keyword_mode="names"``); ``span``: (since, until) of a
    ``ranged`` statement."""
    return await conn.fetch(sql, user_id, text, k, *span)
