"""The graph, the query side: current edges by fact-sentence similarity, one-hop expansion,
neighbourhoods, as-of queries on both time axes, and the timeline of one relation."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Sequence

import asyncpg
import numpy as np

_COLUMNS = ("edge_id", "source_entity_id", "relation", "target_entity_id", "target_value", "valid_from", "valid_to",
            "recorded_at", "closed_at", "fact_sentence", "confidence", "explicit")
_COLS = ", ".join(_COLUMNS)
_EDGE = (", ".join(f"e.{c}" for c in _COLUMNS)
         + ", s.name AS source_name, coalesce(t.name, e.target_value) AS target_name")
# Entities by (user, id), like every lookup: an edge names only its own user's entities.
_JOIN = ("memory_edges e JOIN entities s ON s.entity_id = e.source_entity_id AND s.user_id = e.user_id "
         "LEFT JOIN entities t ON t.entity_id = e.target_entity_id AND t.user_id = e.user_id")

# The nearest current edges (hop 0) and, in the same statement, a bounded set of other current
# edges touching their entities other than the user (hop 1), nearest first: one round trip and
# one plan instead of two. Both are picked with their own columns (the scans read those rows
# anyway) and only then named: no join back to the partitioned table. Entities are looked up by
# key in scalar subqueries, not joined: the same rows (every edge's entities exist, a foreign key)
# with fewer plans to weigh (faster to plan and to run for a heavy user, interleaved A/B:
# docs/benchmarks-history.md).
_NEAREST_WITH_HOPS = f"""
WITH c AS MATERIALIZED (
    SELECT {_COLS}, embedding <=> $2 AS distance FROM memory_edges
    WHERE user_id = $1 AND valid_to IS NULL AND embedding_model = $4
    ORDER BY embedding <=> $2 LIMIT $3),
-- Not through the user's own entity: every fact about the user touches it, so a hop through it
-- would be the user's whole graph (all of a heavy user's edges sorted by distance), not a neighbourhood.
ends AS (SELECT array_agg(DISTINCT v.e) AS e FROM c, LATERAL (VALUES (c.source_entity_id), (c.target_entity_id)) v(e)
         WHERE NOT (SELECT en.is_user FROM entities en WHERE en.entity_id = v.e AND en.user_id = $1)),
h AS MATERIALIZED (
    SELECT {_COLS}, embedding <=> $2 AS distance FROM memory_edges
    WHERE user_id = $1 AND valid_to IS NULL AND embedding_model = $4
      AND NOT (edge_id = ANY((SELECT array_agg(edge_id) FROM c)::uuid[]))
      AND (source_entity_id = ANY((SELECT e FROM ends)::uuid[]) OR target_entity_id = ANY((SELECT e FROM ends)::uuid[]))
    ORDER BY embedding <=> $2, edge_id LIMIT $5),
found AS (SELECT 0 AS hop, * FROM c UNION ALL SELECT 1, * FROM h)
SELECT b.*, (SELECT s.name FROM entities s WHERE s.entity_id = b.source_entity_id AND s.user_id = $1) AS source_name,
       coalesce((SELECT t.name FROM entities t WHERE t.entity_id = b.target_entity_id AND t.user_id = $1),
                b.target_value) AS target_name
FROM found b ORDER BY b.hop, b.distance, b.edge_id
"""

# What was believed at recorded time r about valid time v: edges recorded by r, begun by v,
# and not (yet, as of r) known to have ended by v.
_AS_OF = f"""
SELECT {_EDGE}, (e.embedding <=> $4) AS distance FROM {_JOIN}
WHERE e.user_id = $1 AND NOT e.forgotten AND e.recorded_at <= $3 AND e.valid_from <= $2
  AND (e.valid_to IS NULL OR e.closed_at > $3 OR e.valid_to > $2) AND e.embedding_model = $6
ORDER BY e.embedding <=> $4, e.edge_id LIMIT $5
"""

_AS_OF_ALL = f"""
SELECT {_EDGE} FROM {_JOIN}
WHERE e.user_id = $1 AND NOT e.forgotten AND e.recorded_at <= $3 AND e.valid_from <= $2
  AND (e.valid_to IS NULL OR e.closed_at > $3 OR e.valid_to > $2)
ORDER BY e.relation, e.valid_from, e.edge_id
LIMIT $4
"""

_TIMELINE = f"""
SELECT {_EDGE} FROM {_JOIN}
WHERE e.user_id = $1 AND NOT e.forgotten AND e.source_entity_id = $2 AND e.relation = $3
ORDER BY e.valid_from, e.recorded_at, e.edge_id
"""

# Entities within ``hops`` of a start entity over current edges, in either direction.
_NEIGHBOURHOOD = """
WITH RECURSIVE walk(entity_id, depth, path) AS (
    SELECT $2::uuid, 0, ARRAY[$2::uuid]
  UNION ALL
    SELECT CASE WHEN e.source_entity_id = w.entity_id THEN e.target_entity_id ELSE e.source_entity_id END,
           w.depth + 1,
           w.path || CASE WHEN e.source_entity_id = w.entity_id THEN e.target_entity_id ELSE e.source_entity_id END
    FROM walk w JOIN memory_edges e
      ON e.user_id = $1 AND e.valid_to IS NULL AND e.target_entity_id IS NOT NULL
     AND (e.source_entity_id = w.entity_id OR e.target_entity_id = w.entity_id)
    WHERE w.depth < $3
      AND NOT (CASE WHEN e.source_entity_id = w.entity_id THEN e.target_entity_id ELSE e.source_entity_id END = ANY(w.path))
)
SELECT en.entity_id, en.name, min(w.depth) AS depth FROM walk w JOIN entities en ON en.entity_id = w.entity_id AND en.user_id = $1
WHERE w.depth > 0 GROUP BY en.entity_id, en.name ORDER BY depth, en.name
"""


async def nearest_with_hops(conn, user_id: str, embedding: np.ndarray, k: int, hop_limit: int,
                            model: str) -> Sequence[asyncpg.Record]:
    """The ``k`` current edges nearest the embedding (``hop`` 0), then up to ``hop_limit`` other
    current edges sharing an entity with them (``hop`` 1), each with its ``distance``."""
    return await conn.fetch(_NEAREST_WITH_HOPS, user_id, embedding, k, model, hop_limit)


async def as_of(conn, user_id: str, valid_time: datetime, recorded_time: datetime,
                embedding: np.ndarray | None = None, k: int = 100, model: str | None = None) -> Sequence[asyncpg.Record]:
    """The graph as believed at ``recorded_time`` about ``valid_time``: its first ``k`` edges (by
    relation), or the ``k`` edges nearest ``embedding`` among those embedded by ``model``
    (distances of two models do not compare)."""
    if embedding is None:
        return await conn.fetch(_AS_OF_ALL, user_id, valid_time, recorded_time, k)
    return await conn.fetch(_AS_OF, user_id, valid_time, recorded_time, embedding, k, model)


async def timeline(conn, user_id: str, source_entity_id: uuid.UUID, relation: str) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_TIMELINE, user_id, source_entity_id, relation)


async def neighbourhood(conn, user_id: str, entity_id: uuid.UUID, hops: int = 2) -> Sequence[asyncpg.Record]:
    if not 1 <= hops <= 2:
        raise ValueError("neighbourhoods are bounded to 1 or 2 hops")
    return await conn.fetch(_NEIGHBOURHOOD, user_id, entity_id, hops)


async def entities(conn, user_id: str) -> Sequence[asyncpg.Record]:
    return await conn.fetch("SELECT entity_id, name, aliases, is_user FROM entities WHERE user_id = $1 ORDER BY recorded_at, entity_id", user_id)


async def user_entity(conn, user_id: str) -> uuid.UUID | None:
    return await conn.fetchval("SELECT entity_id FROM entities WHERE user_id = $1 AND is_user", user_id)


_PAGE = f"""
SELECT {_EDGE} FROM {_JOIN}
WHERE e.user_id = $1 AND NOT e.forgotten AND ($2 OR e.valid_to IS NULL) AND (e.recorded_at, e.edge_id) > ($3, $4)
ORDER BY e.recorded_at, e.edge_id LIMIT $5
"""


async def page(conn, user_id: str, include_history: bool, after: tuple, limit: int) -> Sequence[asyncpg.Record]:
    """Up to ``limit`` of the user's edges recorded after the ``(recorded_at, edge_id)`` key
    ``after``; closed ones too with ``include_history``."""
    return await conn.fetch(_PAGE, user_id, include_history, *after, limit)


async def counts(conn, user_id: str) -> asyncpg.Record:
    return await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE valid_to IS NULL) AS current, "
        "count(*) FILTER (WHERE valid_to IS NOT NULL AND NOT forgotten) AS closed, count(*) FILTER (WHERE forgotten) AS forgotten, "
        "min(recorded_at) AS oldest, max(greatest(recorded_at, closed_at)) AS newest, "
        "(SELECT count(*) FROM entities WHERE user_id = $1) AS entities FROM memory_edges WHERE user_id = $1", user_id)


async def holder(conn, edge_id: uuid.UUID, user_id: str) -> asyncpg.Record | None:
    """Whose edge ``edge_id`` is (``user_id``'s own if they hold it, else any user's), and what it
    says: its relation and the names of its ends."""
    return await conn.fetchrow(f"SELECT e.user_id, e.valid_to, e.forgotten, e.relation, s.name AS source, "
                               f"coalesce(t.name, e.target_value) AS target FROM {_JOIN} WHERE e.edge_id = $1 "
                               "ORDER BY e.user_id = $2 DESC LIMIT 1", edge_id, user_id)


# Every end of the user's edges, ever (not forgotten): the nodes of a drawing that keeps its
# places while a date slider opens and closes edges. A target that is a value, not an entity, is
# a node of its own ('value:<text>').
_NODES = f"""
SELECT DISTINCT v.id, v.name, v.is_user FROM {_JOIN},
LATERAL (VALUES (s.entity_id::text, s.name, s.is_user),
                (coalesce(t.entity_id::text, 'value:' || e.target_value), coalesce(t.name, e.target_value),
                 coalesce(t.is_user, false))) v(id, name, is_user)
WHERE e.user_id = $1 AND NOT e.forgotten
ORDER BY v.is_user DESC, v.name, v.id LIMIT $2
"""


async def nodes(conn, user_id: str, limit: int) -> Sequence[asyncpg.Record]:
    return await conn.fetch(_NODES, user_id, limit)


async def span(conn, user_id: str) -> asyncpg.Record:
    """From the first time the user's known relationships began or were recorded to the last of
    their openings, closings and recordings: a date slider over it reaches every change on either
    axis (what was said in 2024 of a marriage since 2010 is recorded past its valid range)."""
    return await conn.fetchrow(
        "SELECT min(least(valid_from, recorded_at)) AS earliest, "
        "max(greatest(valid_from, valid_to, recorded_at, closed_at)) AS latest "
        "FROM memory_edges WHERE user_id = $1 AND NOT forgotten", user_id)
