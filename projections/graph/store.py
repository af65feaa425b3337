"""The graph, the asyncpg shell: load targeted rows, fold, upsert, positions — one transaction."""
from __future__ import annotations

import uuid
from typing import Sequence

import asyncpg
import numpy as np
from pgvector import Vector

from memstream.projections import positions as pos
from memstream.projections.db import fetch_by_keys, text_array
from memstream.projections.batches import forgets_user, runs
from memstream.projections.graph.core import (EDGE_COLUMNS, ENTITY_COLUMNS, EdgeRow, EntityRow, Key, Row, fold, key,
                                             sources, spans, targets)
from memstream.schemas import Decision

_ENTITY_CASTS = {"entity_id": "uuid", "user_id": "text", "name": "text", "aliases": "text", "is_user": "boolean",
                 "recorded_at": "timestamptz", "source_event_id": "uuid"}
_EDGE_CASTS = {"edge_id": "uuid", "user_id": "text", "source_entity_id": "uuid", "relation": "text",
               "target_entity_id": "uuid", "target_value": "text", "multi_valued": "boolean",
               "valid_from": "timestamptz", "valid_to": "timestamptz", "recorded_at": "timestamptz",
               "closed_at": "timestamptz", "fact_sentence": "text", "confidence": "real", "explicit": "boolean",
               "source_event_id": "uuid", "extractor": "text", "reason": "text", "close_reason": "text",
               "embedding": "vector", "embedding_model": "text", "forgotten": "boolean"}


def _upsert_sql(table: str, columns: Sequence[str], casts: dict[str, str], key: Sequence[str],
                array_as_text: str | None = None) -> str:
    select = ", ".join(f"u.{c}::text[]" if c == array_as_text else f"u.{c}" for c in columns)
    return (f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM unnest("
            + ", ".join(f"${i + 1}::{casts[c]}[]" for i, c in enumerate(columns))
            + f") AS u({', '.join(columns)}) ON CONFLICT ({', '.join(key)}) DO UPDATE SET "
            + ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key))


# aliases (text[] per row) travel as their array literal and are cast back.
_UPSERT_ENTITIES = _upsert_sql("entities", ENTITY_COLUMNS, _ENTITY_CASTS, ["user_id", "entity_id"],
                               array_as_text="aliases")
_UPSERT_EDGES = _upsert_sql("memory_edges", EDGE_COLUMNS, _EDGE_CASTS, ["user_id", "edge_id"])  # partitioned by user


def entity_from(r) -> EntityRow:
    return EntityRow(**{**dict(r), "aliases": tuple(r["aliases"])})


def edge_from(r) -> EdgeRow:
    values = dict(r)
    values["embedding"] = np.asarray(values["embedding"].to_numpy(), dtype="<f4").tobytes()
    return EdgeRow(**values)


async def load(conn, keys: Sequence[Key]) -> dict[Key, Row]:
    """The entities and edges of these ``(user_id, id)`` keys: a row is found only under its own
    user, so a decision naming another user's row finds nothing to change."""
    out: dict[Key, Row] = {}
    for r in await fetch_by_keys(conn, "entities", ENTITY_COLUMNS, "entity_id", keys):
        out[r["user_id"], r["entity_id"]] = entity_from(r)
    for r in await fetch_by_keys(conn, "memory_edges", EDGE_COLUMNS, "edge_id", keys):
        out[r["user_id"], r["edge_id"]] = edge_from(r)
    return out


async def load_user(conn, user_id: str) -> list[Row]:
    """All of one user's entities and edges (formation's view of the graph), the edges without
    their embeddings: formation decides by names, targets and intervals, and keeps thousands of
    users' views (an embedding is 1.5 kB of each edge)."""
    ents = await conn.fetch(f"SELECT {', '.join(ENTITY_COLUMNS)} FROM entities WHERE user_id = $1", user_id)
    cols = ", ".join(c for c in EDGE_COLUMNS if c != "embedding")
    edges = await conn.fetch(f"SELECT {cols} FROM memory_edges WHERE user_id = $1", user_id)
    return [entity_from(r) for r in ents] + [EdgeRow(**dict(r), embedding=b"") for r in edges]


async def upsert(conn, rows: Sequence[Row]) -> None:
    entities = [r for r in rows if isinstance(r, EntityRow)]
    # Closed edges first: the overlap constraint is deferred, but keep the natural order anyway.
    edges = sorted((r for r in rows if isinstance(r, EdgeRow)), key=lambda e: e.valid_to is None)
    if entities:
        await conn.execute(_UPSERT_ENTITIES, *[
            [text_array(e.aliases) if c == "aliases" else getattr(e, c) for e in entities] for c in ENTITY_COLUMNS])
    if edges:
        await conn.execute(_UPSERT_EDGES, *[
            [Vector(np.frombuffer(e.embedding, dtype="<f4")) if c == "embedding" else getattr(e, c) for e in edges]
            for c in EDGE_COLUMNS])


async def load_by_source(conn, user_id: str, event_id: uuid.UUID) -> dict[Key, Row]:
    """The user's edges that turn ``event_id`` opened."""
    rows = await conn.fetch(f"SELECT {', '.join(EDGE_COLUMNS)} FROM memory_edges WHERE user_id = $1 AND source_event_id = $2",
                            user_id, event_id)
    return {key(e): e for e in map(edge_from, rows)}


async def load_spans(conn, wanted: Sequence[tuple[str, uuid.UUID, str, object]]) -> dict[Key, Row]:
    """The closed single-valued edges of each ``(user_id, source entity, relation, from)`` ending after ``from``."""
    if not wanted:
        return {}
    rows = await conn.fetch(
        f"SELECT {', '.join('e.' + c for c in EDGE_COLUMNS)} FROM unnest($1::text[], $2::uuid[], $3::text[], "
        "$4::timestamptz[]) AS s(user_id, source_entity_id, relation, since) JOIN memory_edges e "
        "ON e.user_id = s.user_id AND e.source_entity_id = s.source_entity_id AND e.relation = s.relation "
        "WHERE NOT e.multi_valued AND e.valid_to > s.since", *map(list, zip(*wanted)))
    return {key(e): e for e in map(edge_from, rows)}


class GraphStore:
    name = "graph"

    async def apply_batch(self, conn: asyncpg.Connection, decisions: Sequence[Decision], positions: pos.Positions) -> None:
        async with conn.transaction():
            for run, forget in runs(decisions, forgets_user):
                forgotten = forget.user_id if forget else None
                state = await load(conn, [(d.user_id, t) for d in run for t in targets(d)])
                state = {**await load_spans(conn, sorted({s for d in run for s in spans(d)})), **state}
                for user, event_id in {s for d in run for s in sources(d)}:
                    state.update(await load_by_source(conn, user, event_id))
                await upsert(conn, list(fold(state, run).values()))
                if forgotten is not None:
                    await conn.execute("DELETE FROM memory_edges WHERE user_id = $1", forgotten)
                    await conn.execute("DELETE FROM entities WHERE user_id = $1", forgotten)
            await pos.save(conn, self.name, positions)
