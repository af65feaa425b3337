"""Formation's views of current facts: the contract (``FactView``) and its two implementations,
``PostgresView`` (live formation) and ``MemoryView`` (``memstream reform``).

The contract suite ``tests/contracts/test_fact_views.py`` runs the same behaviour against both.
"""
from __future__ import annotations

import uuid
from typing import Iterable, Mapping, Protocol

import asyncpg
import numpy as np

from memstream.embedding import from_bytes
from memstream.llm.protocols import ExistingFact
from memstream.projections.facts import query as facts_q
from memstream.projections.facts import store as facts_store
from memstream.projections.facts.core import REFLECTION, FactRow, Key, fold
from memstream.schemas import Decision
from memstream.streams.worker.formation.by_user import ByUser

NEIGHBOURS = 10  # nearest current facts shown to the resolver, besides same-attribute facts


class FactView(Protocol):
    """One embedding model's current facts as the facts projection will hold them once every
    decision made so far applies: those already in the view's store and those given to
    ``apply`` since the view was made (as formation makes them; the store may catch up with
    them meanwhile, which changes no answer). Formation asks it, per
    candidate fact, which facts the resolver is shown (``neighbours``) and which rows a
    decision may target (``rows``).

    ``rows`` maps ``(user_id, fact id)`` -> ``FactRow`` (the core's ``key``), each in its current state exactly as the facts
    projection's core folds it (``projections.facts.core.fold``): a version superseded or
    deleted since the view was made reads as such (but an older version a backdated update ends
    early keeps its end here unless it was ensured: formation reads no ended version's times). It
    holds every fact this view's ``apply`` changed and every fact ``ensure`` found; it may hold others (``MemoryView`` holds all of them), so a fact
    missing from ``rows`` is not thereby unknown — ``ensure`` it first.

    ``ensure(user_id, fact_ids, turns=())``: afterwards ``rows`` holds each of ``user_id``'s
    ``fact_ids`` the store or the view's decisions hold, and every reflection of theirs drawn
    from one of ``turns`` (event ids) (never another user's: the store is read by user and id).
    Ids nobody holds are ignored, not an error. It only loads: a row already in ``rows`` keeps
    the view's state and is not read again from the store.

    ``apply(decision)``: folds one decision into ``rows`` with the facts core, as the projection
    will. The rows it targets (``core.targets``) must be in ``rows`` — applied earlier or
    ensured — else it raises ``MissingTarget`` (``PostgresView`` does even when Postgres holds the
    row: it never loads on its own). Idempotent like the core: a decision applied again, or one
    the store already holds, changes nothing; any other kind of decision changes nothing. Local
    and synchronous: nothing is written; the projection writes the decision when it comes back
    from the log.

    ``neighbours(user_id, attribute, vector)``: ``user_id``'s current facts (after the view's
    decisions) embedded by the view's model, as ``ExistingFact`` whose ``similarity`` is the
    cosine of the fact's embedding with ``vector`` (embeddings are unit vectors), highest first.
    It includes the ``NEIGHBOURS`` most similar such facts — exactly in ``MemoryView``; in
    ``PostgresView`` as the HNSW index finds them, which for a user with thousands of facts may
    miss some (BENCHMARKS.md) — and every such fact that fills ``attribute``, and no others. Each
    fact at most once. Never another user's fact, a superseded or deleted version, or a fact of
    another embedding model. The order of equal similarities is unspecified.

    ``slot(user_id, attributes)``: every version of ``user_id``'s facts filling one of
    ``attributes`` (loaded as ``ensure`` loads), oldest recorded first: what the user's edges of
    that slot follow (``slot_edges``). An ended version a decision of this view ended early
    keeps the store's end if it was loaded after that decision.

    ``archived(user_id, attribute)``: ``user_id``'s archived facts filling ``attribute`` (a decay
    sweep's, after the view's decisions), loaded as ``ensure`` loads: what a mention may restore.

    ``fork()``: a view that answers as this one does now, and that ``apply`` and ``ensure`` then
    change without changing this one: formation decides a turn on a fork and keeps it only if
    the whole turn was decided (a retried turn must not see half of itself).
    """

    rows: Mapping[Key, FactRow]

    async def ensure(self, user_id: str, fact_ids: Iterable[uuid.UUID], turns: Iterable[uuid.UUID] = ()) -> None:
        ...

    def apply(self, decision: Decision) -> None:
        ...

    async def neighbours(self, user_id: str, attribute: str, vector: np.ndarray) -> list[ExistingFact]:
        ...

    async def slot(self, user_id: str, attributes: Iterable[str]) -> list[FactRow]:
        """Every version of the user's facts filling one of ``attributes``, as the view holds
        them (for the user's edges to follow: ``slot_edges``)."""
        ...

    async def archived(self, user_id: str, attribute: str) -> list[FactRow]:
        ...

    def fork(self) -> "FactView":
        ...


class PostgresView(FactView):
    """Current facts as the facts projection will hold them once the view's decisions apply:
    the projection's rows (same SQL as the read path) under an overlay of those decisions."""

    def __init__(self, pool: asyncpg.Pool, model_id: str):
        self._pool, self._model = pool, model_id
        self.rows: dict[Key, FactRow] = {}
        self._touched: set[Key] = set()

    async def ensure(self, user_id: str, fact_ids, turns=()) -> None:
        missing = [(user_id, f) for f in fact_ids if (user_id, f) not in self.rows]
        turns = list(turns)
        if missing or turns:
            async with self._pool.acquire() as conn:
                self.rows.update(await facts_store.load(conn, missing))
                # What a decision on these may end with them (``core.ends_facts``).
                drawn = await facts_store.load_drawn_from(conn, user_id, [f for _, f in missing], turns)
                self.rows.update((k, r) for k, r in drawn.items() if k not in self.rows)

    def apply(self, decision: Decision) -> None:
        self._touched.update(fold(self.rows, [decision]))

    async def slot(self, user_id: str, attributes: Iterable[str]) -> list[FactRow]:
        attributes = list(attributes)
        async with self._pool.acquire() as conn:
            ids = await conn.fetch("SELECT fact_id FROM memory_facts WHERE user_id = $1 AND attribute = ANY($2::text[])",
                                   user_id, attributes)
        await self.ensure(user_id, [r["fact_id"] for r in ids])
        return sorted((r for (u, _), r in self.rows.items() if u == user_id and r.attribute in attributes),
                      key=lambda r: (r.recorded_at, r.fact_id))

    async def archived(self, user_id: str, attribute: str) -> list[FactRow]:
        # Only the archived rows are read (``slot`` reads every version: a like among hundreds).
        async with self._pool.acquire() as conn:
            ids = await conn.fetch("SELECT fact_id FROM memory_facts WHERE user_id = $1 AND attribute = $2 "
                                   "AND status = 'archived'", user_id, attribute)
        await self.ensure(user_id, [r["fact_id"] for r in ids])
        return _archived(((r for (u, _), r in self.rows.items() if u == user_id)), attribute)

    def fork(self) -> "PostgresView":
        other = PostgresView(self._pool, self._model)
        other.rows, other._touched = dict(self.rows), set(self._touched)  # rows are frozen: shared
        return other

    async def neighbours(self, user_id: str, attribute: str, vector: np.ndarray) -> list[ExistingFact]:
        # Facts the view ended may still sit in Postgres: ask for as many more, so the nearest that
        # are still current are NEIGHBOURS whatever the view overlaid.
        ended = sum(1 for f in self._touched if self.rows[f].user_id == user_id and not self.rows[f].current)
        async with self._pool.acquire() as conn:
            near = await facts_q.nearest(conn, user_id, vector, NEIGHBOURS + ended, self._model)
            same = await facts_q.current_by_attribute(conn, user_id, [attribute], self._model)
        found: dict[uuid.UUID, ExistingFact] = {}
        for rec in near:
            if rec["category"] == REFLECTION:  # drawn from facts, never one a turn's candidate resolves against
                continue
            found[rec["fact_id"]] = ExistingFact(rec["fact_id"], rec["text"], rec["category"], rec["attribute"],
                                                 rec["value"], 1.0 - float(rec["distance"]))
        for rec in same:
            if rec["category"] == REFLECTION:
                continue
            emb = np.asarray(rec["embedding"].to_numpy(), dtype=np.float32)
            found.setdefault(rec["fact_id"], ExistingFact(rec["fact_id"], rec["text"], rec["category"],
                                                          rec["attribute"], rec["value"], float(emb @ vector)))
        for k in self._touched:
            row = self.rows[k]
            if (row.user_id == user_id and row.current and row.embedding_model == self._model
                    and row.category != REFLECTION):
                found[row.fact_id] = _existing(row, vector)
        stale = {f for f in found if (user_id, f) in self.rows and not self.rows[user_id, f].current}
        ranked = sorted((f for fid, f in found.items() if fid not in stale), key=lambda f: -f.similarity)
        # As many as ``MemoryView`` shows, however much the view has overlaid since it was made.
        return ranked[:NEIGHBOURS] + [f for f in ranked[NEIGHBOURS:] if f.attribute == attribute]


class MemoryView(FactView):
    """Every fact in memory, for backfills that run formation over the whole log (``reform``),
    kept by user (``ByUser``)."""

    def __init__(self, model_id: str):
        self._model = model_id
        self.rows: ByUser[Key, FactRow] = ByUser()

    async def ensure(self, user_id: str, fact_ids, turns=()) -> None:
        pass

    def apply(self, decision: Decision) -> None:
        fold(self.rows.mine(decision.user_id), [decision])

    async def slot(self, user_id: str, attributes: Iterable[str]) -> list[FactRow]:
        attributes = set(attributes)
        return sorted((r for r in self.rows.of(user_id).values() if r.attribute in attributes),
                      key=lambda r: (r.recorded_at, r.fact_id))

    async def archived(self, user_id: str, attribute: str) -> list[FactRow]:
        return _archived(self.rows.of(user_id).values(), attribute)

    def fork(self) -> "MemoryView":
        other = MemoryView(self._model)
        other.rows = self.rows.fork()
        return other

    async def neighbours(self, user_id: str, attribute: str, vector: np.ndarray) -> list[ExistingFact]:
        current = [r for r in self.rows.of(user_id).values()
                   if r.current and r.embedding_model == self._model and r.category != REFLECTION]
        scored = sorted((_existing(r, vector) for r in current), key=lambda f: (-f.similarity, f.fact_id))
        near = scored[:NEIGHBOURS]
        return near + [f for f in scored[NEIGHBOURS:] if f.attribute == attribute]


def _archived(rows: Iterable[FactRow], attribute: str) -> list[FactRow]:
    return sorted((r for r in rows if r.attribute == attribute and r.status == "archived"),
                  key=lambda r: (r.recorded_at, r.fact_id))


def _existing(row: FactRow, vector: np.ndarray) -> ExistingFact:
    return ExistingFact(row.fact_id, row.text, row.category, row.attribute, row.value,
                        float(from_bytes(row.embedding) @ vector))
