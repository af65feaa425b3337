"""Episodes, the query side used by the read client (no writes, no Faust)."""
from __future__ import annotations

import uuid
from typing import Sequence

import asyncpg
import numpy as np

from memstream.projections import fulltext
from memstream.projections.episodes.core import episode_id

_COLS = "episode_id, conversation_id, occurred_at, user_message, assistant_message, metadata, recorded_at"
PASSAGE_DISCOUNT = 0.1  # cosine distance added to a passage's past the first window

# An episode is as near as its nearest passage: its own vector (the first window of its text)
# or, for a long turn, a later window's (episode_passages) plus PASSAGE_DISCOUNT: a long turn
# has many draws at resembling a question, and a later window lacks the turn's opening, which
# mostly says what it is about (the discount's measurements: BENCHMARKS.md). A later passage
# nearer than the opening comes with its characters, for a read that must return an excerpt.
# relaxed_order iterative scans may return rows slightly out of order: re-sort outside.
def _nearest_sql(period: bool, cold: bool) -> str:
    """The nearest-episodes statement of one vector index (``cold``: the cold one, else the hot;
    migration 0027); ``period``: only episodes that occurred in [$5, $6)."""
    within = " AND occurred_at >= $5 AND occurred_at < $6" if period else ""
    tier = " IS NOT NULL" if cold else " IS NULL"
    passages = "episode_passages p JOIN episodes e USING (user_id, episode_id)" if period else "episode_passages p"
    return f"""
WITH c AS MATERIALIZED (
    SELECT {_COLS}, embedding <=> $2 AS distance FROM episodes
    WHERE user_id = $1 AND embedding_model = $4 AND cooled_at{tier}{within}
    ORDER BY embedding <=> $2 LIMIT $3),
p AS MATERIALIZED (
    SELECT p.episode_id, p.start_char, p.end_char, p.embedding <=> $2 AS distance FROM {passages}
    WHERE p.user_id = $1 AND p.embedding_model = $4 AND p.cooled_at{tier}{within.replace("occurred_at", "e.occurred_at")}
    ORDER BY p.embedding <=> $2 LIMIT $3),
bp AS (SELECT DISTINCT ON (episode_id) * FROM p ORDER BY episode_id, distance, start_char),
n AS (
    SELECT c.episode_id, c.conversation_id, c.occurred_at, c.user_message, c.assistant_message, c.metadata,
           c.recorded_at, least(c.distance, bp.distance + {PASSAGE_DISCOUNT}) AS distance,
           CASE WHEN bp.distance < c.distance THEN bp.start_char END AS start_char,
           CASE WHEN bp.distance < c.distance THEN bp.end_char END AS end_char
    FROM c LEFT JOIN bp USING (episode_id)
    UNION ALL
    SELECT e.episode_id, e.conversation_id, e.occurred_at, e.user_message, e.assistant_message, e.metadata,
           e.recorded_at, bp.distance + {PASSAGE_DISCOUNT}, bp.start_char, bp.end_char
    FROM bp JOIN episodes e ON e.user_id = $1 AND e.episode_id = bp.episode_id
    WHERE bp.episode_id NOT IN (SELECT episode_id FROM c))
SELECT * FROM n ORDER BY distance, episode_id LIMIT $3
"""


_NEAREST = {(period, cold): _nearest_sql(period, cold) for period in (False, True) for cold in (False, True)}

# A turn of more distinct words than this is scored by the density of its matches: a long
# answer or a pasted page holds most words of any question, so without this it outranks the
# short turn that was asked about (which set chose it, and what it buys: BENCHMARKS.md).
KEYWORD_DENSITY_WORDS = 50
# A conversation of up to this many turns is searched whole by its words; older turns of a longer
# history only when they hold every word (or by meaning). Bounded for the heaviest users' sake
# (BENCHMARKS.md: what the window costs them, and what 1,000 lost on long chats).
KEYWORD_WINDOW = 2000
_KEYWORD = fulltext.keyword_sql(table="episodes", key="episode_id", time_col="occurred_at", cols=_COLS,
                                density=KEYWORD_DENSITY_WORDS, recent=KEYWORD_WINDOW)
_KEYWORD_SPAN = fulltext.keyword_sql(table="episodes", key="episode_id", time_col="occurred_at", cols=_COLS,
                                     ranged=True, density=KEYWORD_DENSITY_WORDS, recent=KEYWORD_WINDOW)

# The turns just before and just after (``next``) each anchor, in the anchor's conversation, in
# the order of (occurred_at, episode_id) so turns with the same time are still neighbours.
_NEIGHBOURS = f"""
SELECT a.anchor, n.* FROM unnest($2::uuid[], $3::text[], $4::timestamptz[]) AS a(anchor, conv, at)
CROSS JOIN LATERAL (
    (SELECT {_COLS}, true AS next FROM episodes WHERE user_id = $1 AND conversation_id = a.conv
       AND (occurred_at, episode_id) > (a.at, a.anchor) ORDER BY occurred_at, episode_id LIMIT 1)
    UNION ALL
    (SELECT {_COLS}, false FROM episodes WHERE user_id = $1 AND conversation_id = a.conv
       AND (occurred_at, episode_id) < (a.at, a.anchor) ORDER BY occurred_at DESC, episode_id DESC LIMIT 1)) n
"""

_RECENT = f"""
SELECT {_COLS} FROM (
    SELECT {_COLS} FROM episodes WHERE user_id = $1 AND conversation_id = $2
    ORDER BY occurred_at DESC, episode_id DESC LIMIT $3) t
ORDER BY occurred_at, episode_id
"""

_RECENT_OF = f"""
SELECT c.user_id, t.* FROM unnest($1::text[], $2::text[]) AS c(user_id, conversation_id)
CROSS JOIN LATERAL (
    SELECT {_COLS} FROM episodes WHERE user_id = c.user_id AND conversation_id = c.conversation_id
    ORDER BY occurred_at DESC, episode_id DESC LIMIT $3) t
"""


async def nearest(conn, user_id: str, embedding: np.ndarray, k: int, model: str, span: tuple | None = None
                  ) -> Sequence[asyncpg.Record]:
    """The ``k`` episodes nearest ``embedding`` by their best passage; ``span``: (since, until).
    The hot index first; the cold one (episodes a decay sweep moved there) only when the hot one
    comes back short of ``k``, the two then merged by distance."""
    args = (user_id, embedding, k, model, *(span or ()))
    hot = await conn.fetch(_NEAREST[span is not None, False], *args)
    if len(hot) >= k:
        return hot
    cold = await conn.fetch(_NEAREST[span is not None, True], *args)
    return sorted([*hot, *cold], key=lambda r: (r["distance"], r["episode_id"]))[:k] if cold else hot


async def keyword(conn, user_id: str, text: str, k: int, span: tuple | None = None) -> Sequence[asyncpg.Record]:
    if span is not None:
        return await fulltext.search(conn, _KEYWORD_SPAN, user_id, text, k, *span)
    return await fulltext.search(conn, _KEYWORD, user_id, text, k)


async def neighbours(conn, user_id: str, anchors: Sequence) -> Sequence[asyncpg.Record]:
    """The turns adjacent to each anchor row (``episode_id``, ``conversation_id``, ``occurred_at``),
    each with the anchor's id in ``anchor`` and ``next`` true for the turn after it."""
    return await conn.fetch(_NEIGHBOURS, user_id, [a["episode_id"] for a in anchors],
                            [a["conversation_id"] for a in anchors], [a["occurred_at"] for a in anchors])


async def recent(conn, user_id: str, conversation_id: str, n: int) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_RECENT, user_id, conversation_id, n)


async def recent_of(conn, conversations: Sequence[tuple[str, str]], n: int) -> dict[tuple[str, str], list[asyncpg.Record]]:
    """The last ``n`` turns of each ``(user_id, conversation_id)``, newest first."""
    out: dict[tuple[str, str], list[asyncpg.Record]] = {}
    for r in await conn.fetch(_RECENT_OF, [u for u, _ in conversations], [c for _, c in conversations], n):
        out.setdefault((r["user_id"], r["conversation_id"]), []).append(r)
    return out


_PAGE = f"""
SELECT {_COLS} FROM episodes WHERE user_id = $1 AND (occurred_at, episode_id) > ($2, $3)
ORDER BY occurred_at, episode_id LIMIT $4
"""


async def page(conn, user_id: str, after: tuple, limit: int) -> Sequence[asyncpg.Record]:
    """Up to ``limit`` of the user's episodes after the ``(occurred_at, episode_id)`` key ``after``."""
    return await conn.fetch(_PAGE, user_id, *after, limit)


async def counts(conn, user_id: str) -> asyncpg.Record:
    return await conn.fetchrow(
        "SELECT count(*) AS n, min(occurred_at) AS oldest, max(occurred_at) AS newest, max(recorded_at) AS last_recorded, "
        "count(DISTINCT conversation_id) AS conversations FROM episodes WHERE user_id = $1", user_id)


async def holder(conn, episode_id, user_id: str) -> asyncpg.Record | None:
    """Whose episode ``episode_id`` is (``user_id``'s own if they hold it, else any user's), and
    the turn it came from."""
    return await conn.fetchrow("SELECT user_id, source_event_id FROM episodes WHERE episode_id = $1 "
                               "ORDER BY user_id = $2 DESC LIMIT 1", episode_id, user_id)


# One distinct user id per step of the byte-order index (migration 0014): a page of users costs
# `limit` index probes, however many episodes each has.
_USERS = """
WITH RECURSIVE u(id) AS (
    (SELECT user_id COLLATE "C" FROM episodes WHERE user_id COLLATE "C" {first} $1 {bounded} ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT e.user_id COLLATE "C" FROM episodes e WHERE e.user_id COLLATE "C" > u.id {bounded_e}
            ORDER BY 1 LIMIT 1)
    FROM u WHERE u.id IS NOT NULL)
SELECT id FROM u WHERE id IS NOT NULL LIMIT $2
"""
# Four statements, not one with "$3 IS NULL OR ...": a generic plan could not bound the index
# scan by a condition that may be absent, and would read past the range to the index's end.
_USERS_SQL = {(inclusive, bounded): _USERS.format(
    first=">=" if inclusive else ">", bounded='AND user_id COLLATE "C" < $3' if bounded else "",
    bounded_e='AND e.user_id COLLATE "C" < $3' if bounded else "")
    for inclusive in (True, False) for bounded in (True, False)}


async def users(conn, start: str, before: str | None, limit: int, *, inclusive: bool) -> list[str]:
    """Up to ``limit`` user ids with episodes, in byte order, from ``start`` (or after it, unless
    ``inclusive``) and before ``before`` (None: to the end)."""
    sql = _USERS_SQL[(inclusive, before is not None)]
    rows = await (conn.fetch(sql, start, limit, before) if before is not None else conn.fetch(sql, start, limit))
    return [r["id"] for r in rows]


async def by_source(conn, user_id: str, source_event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, asyncpg.Record]:
    """The user's episodes recorded from these turns, by turn event id (a forgotten one is gone):
    looked up by their primary key, which the turn's id gives."""
    ids = {episode_id(e): e for e in source_event_ids}
    rows = await conn.fetch(f"SELECT {_COLS} FROM episodes WHERE user_id = $1 AND episode_id = ANY($2::uuid[])",
                            user_id, list(ids))
    return {ids[r["episode_id"]]: r for r in rows}
