"""The formation step: each turn becomes an ``EpisodeRecorded`` decision (its embedding) and,
through extract -> resolve -> classify -> safety gate -> near-duplicate merge, fact decisions.

Formation for a turn must see every earlier decision for the same user, even when the facts
projection lags. Two mechanisms give that:

* across batches, a **barrier**: before deciding, wait until the facts projection has applied
  every decision this formation produced to that partition (on a fresh assignment: every
  decision already in the partition). Decisions go to the same partition number as their
  source event, so a user's events and decisions share one partition.
* within a batch, an **overlay**: the decisions made for earlier turns are folded with the
  facts projection's own pure core, and neighbours are read through it.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from typing import Awaitable, Callable, Sequence

import asyncpg
import numpy as np

from memstream.embedding import Embedder, to_bytes
from memstream.llm.protocols import ExtractionClient, ResolutionClient
from memstream.projections import positions as pos
from memstream.projections.episodes import core as episodes
from memstream.schemas import (SYSTEM_USER, Decision, EdgeForgotten, EpisodeForgotten, EpisodeRecorded, Event,
                               FactChangeDeferred, FactCorrected, FactDecision, FactForgotten, FactUpdated,
                               InvalidEvent, LogPosition, MemoryForgotten, NothingDecided, TurnRecorded,
                               UserForgotten, decode_event)
from memstream.schemas.events import CONTROL_TYPES
from memstream.schemas.errors import Refused, Retryable
from memstream.streams.admission import admit, imported
from memstream.llm.relations import RelationExtractionClient
from memstream.projections.graph import store as graph_store
from memstream.streams.formation.decide import Context, decide
from memstream.streams.formation.graph import EdgeDecider, GraphContext, GraphView
from memstream.streams.formation.views import FactView, PostgresView
from memstream.streams.records import Record, next_offsets
from memstream.sealing.keys import Shredded
from memstream.streams.sealing import RecordSealer

log = logging.getLogger("memstream.formation")


def episode_text(turn: TurnRecorded) -> str:
    return f"{turn.user_message}\n{turn.assistant_message}".strip()


def decode_turns(records: Sequence[Record], stage: str, partitions: int | None = None
                 ) -> tuple[list[tuple[Record, Event]], list]:
    """Turns, and commands about a user's memory (``CONTROL_TYPES``), to form in log order; and
    ``(record, stage, reason)`` for records that must be dead-lettered (``admission.admit``;
    ``partitions``: the events topic's partition count)."""
    admitted, letters = admit(records, stage, partitions)
    return [(r, e) for r, e in admitted if isinstance(e, (TurnRecorded, *CONTROL_TYPES)) and not imported(r)], letters


class CommandRefused(Refused):
    """A command names a fact or edge its user does not hold (current): dead-lettered, nothing changes."""


def nothing_decided(records: Sequence[Record], made: Sequence[tuple[Record, Decision]]
                    ) -> list[tuple[Record, NothingDecided]]:
    """A ``NothingDecided`` for each partition whose last record in ``records`` is not a turn
    formed in ``made``, to be written after ``made``: without it the projections could not tell
    that trailing commands or dead letters left nothing to apply (their lag never cleared)."""
    formed = {id(r) for r, d in made if isinstance(d, EpisodeRecorded)}
    last = {r.partition: r for r in records}
    out = []
    for _, r in sorted(last.items()):
        if id(r) in formed:
            continue
        try:
            event = decode_event(r.value or b"")
            user, event_id = event.user_id, event.event_id
        except InvalidEvent:
            user, event_id = SYSTEM_USER, uuid.uuid5(uuid.NAMESPACE_URL, f"memstream:{r.where}")
        out.append((r, NothingDecided(decision_id=uuid.uuid5(event_id, "nothing-decided"), source_event_id=event_id,
                                      source=LogPosition(r.topic, r.partition, r.offset), recorded_at=r.timestamp,
                                      user_id=user)))
    return out


class ProjectionLagging(Retryable, TimeoutError):
    """The projections formation reads have not caught up with what it produced (retried)."""


class ProjectionBarrier:
    """Waits until the projections formation reads (facts, graph) have applied what formation
    produced to a partition."""

    projections = ("facts", "graph")

    def __init__(self, pool: asyncpg.Pool, decisions_topic: str,
                 end_offset: Callable[[int], Awaitable[int]], timeout: float = 30.0):
        self._pool, self._topic, self._end_offset, self._timeout = pool, decisions_topic, end_offset, timeout
        self._needed: dict[int, int] = {}

    def produced(self, partition: int, next_offset: int) -> None:
        self._needed[partition] = max(self._needed.get(partition, 0), next_offset)

    def forget(self, partitions) -> None:
        for p in partitions:
            self._needed.pop(p, None)

    async def wait(self, partition: int) -> None:
        if partition not in self._needed:
            self._needed[partition] = await self._end_offset(partition)
        needed = self._needed[partition]
        deadline = asyncio.get_running_loop().time() + self._timeout
        delay = 0.002
        while True:
            applied = await self._pool.fetchval(
                "SELECT coalesce(min(next_offset), 0) FROM projection_positions WHERE projection = ANY($3::text[]) "
                "AND topic = $1 AND partition = $2 HAVING count(*) = cardinality($3::text[])",
                self._topic, partition, list(self.projections)) or 0
            if applied >= needed:
                return
            if asyncio.get_running_loop().time() > deadline:
                # The facts projection may be restarting or on another worker.
                raise ProjectionLagging(f"facts/graph projections are at {self._topic}/{partition}@{applied}, formation needs {needed}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)


class Formation:
    name = "formation"

    def __init__(self, *, producer, decisions_topic: str, embedder: Embedder, extractor: ExtractionClient,
                 resolver: ResolutionClient, dead_letters, pool: asyncpg.Pool, barrier: ProjectionBarrier | None,
                 relations: RelationExtractionClient | None = None, gate_observations: int = 3,
                 record_position: bool = True, partitions: int | None = None,
                 sealer: RecordSealer | None = None, ends_keys: bool = False, decided=None):
        self._relations, self._partitions = relations, partitions
        # ``ends_keys``: this formation destroys a forgotten user's data key once it has sealed
        # every decision before the forget (the live one; a reform rebuilds after the fact).
        self._sealer, self._ends_keys = sealer or RecordSealer(None), ends_keys
        self._decided = decided or (lambda decisions: None)  # told every decision produced (metrics)
        self._producer, self._topic, self._embedder = producer, decisions_topic, embedder
        self._extractor, self._resolver = extractor, resolver
        self._dead, self._pool, self._barrier = dead_letters, pool, barrier
        self._gate_observations, self._record_position = gate_observations, record_position
        # Fact texts repeat ("Lives in Berlin"); vectors are a pure function of (model, text).
        self._fact_vectors: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    async def process(self, records: list[Record]) -> None:
        turns, letters = decode_turns(records, self.name, self._partitions)
        if self._barrier is not None:
            for partition in sorted({r.partition for r, _ in turns}):
                await self._barrier.wait(partition)
        decisions = await self.decide(turns, letters=letters)
        decisions += nothing_decided(records, decisions)
        futures, sent = [], []
        for r, d in decisions:
            try:
                value = await self._sealer.seal(d, r.generation)
            except Shredded:
                continue  # its record's key is gone (forgotten since, and this a retry): nothing to keep
            futures.append(await self._producer.send(self._topic, value, key=r.key, partition=r.partition))
            sent.append(d)
        metas = await asyncio.gather(*futures)
        self._decided(sent)
        if self._ends_keys:
            for _, d in decisions:
                if isinstance(d, MemoryForgotten) and d.kind == "user":
                    await self._sealer.end(d.user_id, d.generation)
        if self._barrier is not None:
            for m in metas:
                self._barrier.produced(m.partition, m.offset + 1)
        await self._dead.send(letters)
        self._dead.observe(len(records) - len(letters))
        if self._record_position:
            async with self._pool.acquire() as conn, conn.transaction():
                await pos.save(conn, self.name, next_offsets(records))

    async def decide(self, turns: list[tuple[Record, Event]], view: FactView | None = None,
                     graph: GraphView | None = None, letters: list | None = None) -> list[tuple[Record, Decision]]:
        """Every decision for ``turns``, in order: each turn's fact and edge decisions, then its
        ``EpisodeRecorded``. Facts are decided against ``view`` and edges against ``graph``
        (default: the projections under an overlay of this batch's decisions). A command about a
        user's memory becomes its decisions in its place; one naming what its user does not hold
        goes to ``letters`` as ``(record, stage, reason)``."""
        if not turns:
            return []
        said = [t for _, t in turns if isinstance(t, TurnRecorded)]
        vectors = dict(zip(map(id, said), await asyncio.to_thread(self._embedder.embed, [episode_text(t) for t in said])
                           if said else []))
        overlay = view if view is not None else PostgresView(self._pool, self._embedder.model_id)
        graph = graph if graph is not None else GraphView(self._load_graph)
        out: list[tuple[Record, Decision]] = []
        for r, turn in turns:
            vector = vectors.get(id(turn))
            if not isinstance(turn, TurnRecorded):
                try:
                    made = await self._command(r, turn, overlay, graph)
                except CommandRefused as exc:
                    log.warning("%s for user %s refused: %s", type(turn).__name__, turn.user_id, exc)
                    if letters is not None:
                        letters.append((r, self.name, str(exc)))
                    continue
                for d in made:
                    overlay.apply(d)
                    graph.apply(d)
                out += [(r, d) for d in made]
                continue
            episode = ((r, EpisodeRecorded(
                decision_id=episodes.episode_id(turn.event_id), source_event_id=turn.event_id,
                source=LogPosition(r.topic, r.partition, r.offset), recorded_at=r.timestamp,
                user_id=turn.user_id, conversation_id=turn.conversation_id, occurred_at=turn.occurred_at,
                user_message=turn.user_message, assistant_message=turn.assistant_message,
                metadata=turn.metadata, embedding=to_bytes(vector), embedding_model=self._embedder.model_id)))
            for decision in await self._facts(r, turn, overlay):
                out.append((r, decision))
            for decision in await self._edges(r, turn, graph):
                out.append((r, decision))
            # Last: a projection that has applied a turn's episode has seen all of its decisions.
            out.append(episode)
        return out

    async def _command(self, r: Record, e: Event, overlay: FactView, graph: GraphView) -> list[Decision]:
        """The decisions a command about ``e.user_id``'s memory makes."""
        common = dict(source_event_id=e.event_id, source=LogPosition(r.topic, r.partition, r.offset),
                      recorded_at=r.timestamp, user_id=e.user_id)
        why = f" by {e.actor}" + (f": {e.reason}" if e.reason else "")
        if isinstance(e, FactCorrected):
            old = await self._current_fact(overlay, e.user_id, e.fact_id, e)
            text = e.text or (old.text.replace(old.value, e.value) if old.value and old.value in old.text
                              else f"{old.text}: {e.value}")
            fid = uuid.uuid5(e.event_id, "fact:0")
            [vector] = await self._embed_facts([text])
            # Explicit and the user's own word: it passes the safety gate by construction.
            return [FactUpdated(**common, decision_id=fid, extractor=f"control:{e.actor}", resolver=f"control:{e.actor}",
                                confidence=1.0, explicit=True, fact_id=fid, text=text, category=old.category,
                                attribute=old.attribute, value=e.value, valid_from=e.occurred_at,
                                embedding=to_bytes(vector), embedding_model=self._embedder.model_id,
                                supersedes=old.fact_id, reason=f"corrected{why}")]
        forget = dict(**common, actor=e.actor, reason=e.reason)
        if isinstance(e, FactForgotten):
            await overlay.ensure(e.user_id, [e.fact_id])
            row = overlay.rows.get(e.fact_id)
            if row is not None and row.user_id == e.user_id and row.current:
                targets = [row.fact_id]
            else:
                # Re-formed with another extractor, the fact may have another id: the same slot and value.
                targets = sorted(f.fact_id for f in overlay.rows.values() if f.user_id == e.user_id and f.current
                                 and e.attribute is not None and f.attribute == e.attribute
                                 and (e.value or "").casefold() == f.value.casefold())
                if not targets:
                    raise CommandRefused(f"FactForgotten names {e.fact_id}, not a current fact of user {e.user_id!r}")
            return [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten:{n}"), kind="fact",
                                    target=t) for n, t in enumerate(targets)]
        if isinstance(e, EdgeForgotten):
            await graph.ensure_user(e.user_id)
            edge = graph.rows.get(e.edge_id)
            if getattr(edge, "user_id", None) != e.user_id:
                raise CommandRefused(f"EdgeForgotten names {e.edge_id}, not an edge of user {e.user_id!r}")
            return [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten"), kind="edge",
                                    target=e.edge_id)]
        if isinstance(e, EpisodeForgotten):
            return [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten"), kind="episode",
                                    target=e.turn_event_id)]
        if isinstance(e, UserForgotten):
            self._fact_vectors.clear()  # fact texts, some of them theirs
            return [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten"), kind="user",
                                    generation=await self._sealer.stamp(e))]
        return []

    @staticmethod
    async def _current_fact(overlay: FactView, user_id: str, fact_id: uuid.UUID, e: Event):
        await overlay.ensure(user_id, [fact_id])
        row = overlay.rows.get(fact_id)
        if row is None or row.user_id != user_id or not row.current:
            raise CommandRefused(f"{type(e).__name__} names {fact_id}, not a current fact of user {user_id!r}")
        return row

    async def _load_graph(self, user_id: str):
        async with self._pool.acquire() as conn:
            return await graph_store.load_user(conn, user_id)

    async def _edges(self, r: Record, turn: TurnRecorded, graph: GraphView) -> list[Decision]:
        if self._relations is None:
            return []
        candidates = list(await self._relations.extract(turn))
        if not candidates:
            return []
        await graph.ensure_user(turn.user_id)
        ctx = GraphContext(turn=turn, extractor=self._relations.model_id, common=dict(
            source_event_id=turn.event_id, source=LogPosition(r.topic, r.partition, r.offset),
            recorded_at=r.timestamp, user_id=turn.user_id))
        decider = EdgeDecider(ctx, graph)
        for c in candidates:
            decider.add(c)
        sentences = decider.sentences()
        vectors = dict(zip(sentences, (to_bytes(v) for v in await self._embed_facts(sentences)))) if sentences else {}
        decisions = decider.finish(vectors, self._embedder.model_id)
        for d in decisions:
            log.info("%s for user %s: %s [event %s]", type(d).__name__,
                     turn.user_id, getattr(d, "fact_sentence", None) or d.reason, turn.event_id)
        # The view saw the edges without vectors; it only needs ids, targets and intervals.
        return decisions

    async def _embed_facts(self, texts: list[str], keep: int = 10_000) -> list[np.ndarray]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._fact_vectors]
        if missing:
            for text, vec in zip(missing, await asyncio.to_thread(self._embedder.embed, missing)):
                self._fact_vectors[text] = vec
        for t in texts:
            self._fact_vectors.move_to_end(t)
        while len(self._fact_vectors) > keep:
            self._fact_vectors.popitem(last=False)
        return [self._fact_vectors[t] for t in texts]

    async def _facts(self, r: Record, turn: TurnRecorded, overlay) -> list[Decision]:
        candidates = list(await self._extractor.extract(turn))
        if not candidates:
            return []
        vectors = await self._embed_facts([c.text for c in candidates])
        ctx = Context(turn=turn, source=LogPosition(r.topic, r.partition, r.offset), recorded_at=r.timestamp,
                      extractor=self._extractor.model_id, resolver=self._resolver.model_id,
                      embedding_model=self._embedder.model_id, gate_observations=self._gate_observations)
        out = []
        for n, (cand, vector) in enumerate(zip(candidates, vectors)):
            neighbours = await overlay.neighbours(turn.user_id, cand.attribute, vector)
            await overlay.ensure(turn.user_id, [nb.fact_id for nb in neighbours])
            resolution = await self._resolver.resolve(cand, neighbours)
            decision = decide(ctx, n, cand, vector, resolution, neighbours, overlay.rows)
            _log(turn, cand, resolution, decision)
            if decision is not None:
                overlay.apply(decision)
                out.append(decision)
        return out


def _log(turn: TurnRecorded, cand, resolution, decision) -> None:
    if isinstance(decision, FactChangeDeferred):
        log.info("GATE REFUSED %s for user %s: %s [event %s]", decision.operation, turn.user_id, decision.reason, turn.event_id)
    elif isinstance(decision, FactDecision):
        op = {"FactAdded": "ADD", "FactUpdated": "UPDATE", "FactDeleted": "DELETE", "FactReinforced": "NOOP+reinforce"}[
            type(decision).__name__]
        log.info("%s %r for user %s: %s [event %s]", op, cand.text, turn.user_id, decision.reason, turn.event_id)
    else:
        log.info("NOOP %r for user %s: %s [event %s]", cand.text, turn.user_id, resolution.reason, turn.event_id)
