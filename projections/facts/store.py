"""Facts, the asyncpg shell: load the rows a batch targets, fold, upsert, positions — one transaction."""
from __future__ import annotations

import json
import uuid
from typing import Sequence

import asyncpg
import numpy as np
from pgvector import Vector

from memstream.projections import positions as pos
from memstream.projections.db import fetch_by_keys, text_array
from memstream.projections.batches import forgets_user, runs
from memstream.projections.facts.core import (COLUMNS, FactRow, Key, ends_facts, fold, key, lineages, slots, sources,
                                              targets, turn_decisions)
from memstream.projections.profile import store as profile_store
from memstream.schemas import Decision, FactRefused, MemoryForgotten


_CASTS = {"fact_id": "uuid", "lineage_id": "uuid", "version": "int", "user_id": "text", "text": "text", "category": "text",
          "attribute": "text", "value": "text", "confidence": "real", "explicit": "boolean", "status": "text",
          "valid_from": "timestamptz", "valid_to": "timestamptz", "recorded_at": "timestamptz",
          "superseded_at": "timestamptz", "superseded_by": "uuid", "end_reason": "text",
          "observation_count": "int", "last_observed_at": "timestamptz", "observed_by": "text",
          "deferred": "jsonb", "source_event_id": "uuid", "extractor": "text", "resolver": "text",
          "reason": "text", "embedding": "vector", "embedding_model": "text", "notes": "text", "observed_in": "text",
          "derived_from": "text", "last_said_at": "timestamptz", "derived_from_turns": "text"}
# unnest() zips the column arrays; the uuid arrays and notes travel as text and are cast back to arrays.
_UUIDS = ("observed_by", "observed_in", "derived_from", "derived_from_turns")
_ARRAYS = {"notes": "u.notes::text[]", **{c: f"u.{c}::uuid[]" for c in _UUIDS}}
_UPSERT = (
    f"INSERT INTO memory_facts ({', '.join(COLUMNS)}) "
    f"SELECT {', '.join(_ARRAYS.get(c, 'u.' + c) for c in COLUMNS)} FROM unnest("
    + ", ".join(f"${i + 1}::{_CASTS[c]}[]" for i, c in enumerate(COLUMNS))
    + f") AS u({', '.join(COLUMNS)}) ON CONFLICT (user_id, fact_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS if c not in ("user_id", "fact_id"))
)


def from_record(r: asyncpg.Record) -> FactRow:
    values = dict(r)
    for c in (*_UUIDS, "notes"):
        values[c] = tuple(values[c])
    values["deferred"] = json.loads(values["deferred"]) if isinstance(values["deferred"], str) else values["deferred"]
    emb = values["embedding"]
    values["embedding"] = np.asarray(emb.to_numpy() if hasattr(emb, "to_numpy") else emb, dtype="<f4").tobytes()
    return FactRow(**values)


def _column(rows: Sequence[FactRow], c: str) -> list:
    if c == "embedding":
        return [Vector(np.frombuffer(r.embedding, dtype="<f4")) for r in rows]
    if c in _UUIDS:
        return ["{" + ",".join(str(u) for u in getattr(r, c)) + "}" for r in rows]
    if c == "notes":
        return [text_array(r.notes) for r in rows]
    if c == "deferred":
        return [json.dumps(dict(r.deferred), sort_keys=True) for r in rows]
    return [getattr(r, c) for r in rows]


_BY_SOURCE = (f"SELECT {', '.join(COLUMNS)} FROM memory_facts WHERE user_id = $1 "
              "AND (source_event_id = $2 OR observed_by && $3::uuid[] "
              "OR (category = 'reflection' AND derived_from_turns @> ARRAY[$2]::uuid[]))")


async def load_by_source(conn, user_id: str, event_id: uuid.UUID) -> dict[Key, FactRow]:
    """The user's facts that turn ``event_id`` created or observed, and reflections drawn from it."""
    rows = map(from_record, await conn.fetch(_BY_SOURCE, user_id, event_id, turn_decisions(event_id)))
    return {key(r): r for r in rows}


async def load_slot(conn, user_id: str, attribute: str) -> dict[Key, FactRow]:
    """Every version of the user's facts filling ``attribute``."""
    rows = map(from_record, await conn.fetch(f"SELECT {', '.join(COLUMNS)} FROM memory_facts "
                                             "WHERE user_id = $1 AND attribute = $2", user_id, attribute))
    return {key(r): r for r in rows}


_DRAWN_FROM = (f"SELECT {', '.join(COLUMNS)} FROM memory_facts WHERE user_id = $1 AND category = 'reflection' "
               "AND (derived_from && $2::uuid[] OR derived_from_turns && $3::uuid[]) AND status <> 'forgotten'")


async def load_drawn_from(conn, user_id: str, fact_ids: Sequence[uuid.UUID],
                          turns: Sequence[uuid.UUID] = ()) -> dict[Key, FactRow]:
    """The user's reflections not forgotten drawn from any of ``fact_ids`` (``core.ends_facts``)
    or of ``turns`` (event ids)."""
    if not fact_ids and not turns:
        return {}
    rows = await conn.fetch(_DRAWN_FROM, user_id, list(fact_ids), list(turns))
    return {key(r): r for r in map(from_record, rows)}


async def load(conn, keys: Sequence[Key], by: str = "fact_id") -> dict[Key, FactRow]:
    """The fact rows of these ``(user_id, fact_id)`` keys (or, ``by="lineage_id"``, every version
    of these facts): a decision naming another user's fact finds nothing to change."""
    rows = await fetch_by_keys(conn, "memory_facts", COLUMNS, by, keys)
    return {key(r): r for r in map(from_record, rows)}


async def upsert(conn, rows: Sequence[FactRow]) -> None:
    if rows:
        await conn.execute(_UPSERT, *[_column(rows, c) for c in COLUMNS])


class FactStore:
    name = "facts"

    async def apply_batch(self, conn: asyncpg.Connection, decisions: Sequence[Decision], positions: pos.Positions) -> dict:
        """Also rebuilds the Tier 1 profile of every user whose facts changed, in the same
        transaction; returns those profiles (for the Redis cache)."""
        async with conn.transaction():
            touched: set[str] = set()
            for run, forget in runs(decisions, forgets_user):
                forgotten = forget.user_id if forget else None
                state = await load(conn, [(d.user_id, t) for d in run for t in targets(d)])
                for user, event_id in {s for d in run for s in sources(d)}:
                    state.update(await load_by_source(conn, user, event_id))
                for k, row in (await load(conn, [ln for d in run for ln in lineages(state, d)], "lineage_id")).items():
                    state.setdefault(k, row)
                for user, attribute in {s for d in run for s in slots(d)}:
                    for k, row in (await load_slot(conn, user, attribute)).items():
                        state.setdefault(k, row)
                for user in sorted({d.user_id for d in run if ends_facts(d)}):
                    for k, row in (await load_drawn_from(conn, user, [f for u, f in state if u == user])).items():
                        state.setdefault(k, row)
                changed = fold(state, run)
                await upsert(conn, list(changed.values()))
                touched |= {r.user_id for r in changed.values()}
                await _refusals(conn, run)
                if forgotten is not None:
                    # A forgotten user's rows go, every version: nothing of theirs stays behind.
                    await conn.execute("DELETE FROM memory_facts WHERE user_id = $1", forgotten)
                    await conn.execute("DELETE FROM fact_refusals WHERE user_id = $1", forgotten)
                    touched.add(forgotten)
            profiles = await profile_store.refresh(conn, touched)
            await pos.save(conn, self.name, positions)
        return profiles


async def _refusals(conn, run: Sequence[Decision]) -> None:
    """The junk guard's refusals of ``run`` kept (a refusal formed again is the same row), and
    those of a forgotten turn dropped, in log order."""
    for d in run:
        if isinstance(d, FactRefused):
            await conn.execute(
                "INSERT INTO fact_refusals (user_id, decision_id, source_event_id, recorded_at, refusal, reason, text, "
                "category, attribute, value, evidence, extractor) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
                "$11, $12) ON CONFLICT DO NOTHING", d.user_id, d.decision_id, d.source_event_id, d.recorded_at,
                d.refusal, d.reason, d.text, d.category, d.attribute, d.value, d.evidence, d.extractor)
        elif isinstance(d, MemoryForgotten) and d.kind == "episode" and d.target is not None:
            await conn.execute("DELETE FROM fact_refusals WHERE user_id = $1 AND source_event_id = $2",
                               d.user_id, d.target)
