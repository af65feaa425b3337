"""One turn's decisions: extract -> resolve -> classify -> safety gate -> near-duplicate merge
for its facts, the relationship pipeline for its edges (side by side), the user's slot edges
made to follow their facts, and last its ``EpisodeRecorded`` (its embedding).

A turn is decided on the user's views (``views``): the projections' rows under the decisions
made since. The pipeline (``pipeline``) schedules turns and records what they decide."""
from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import time
import uuid

import asyncpg
import numpy as np

from memstream.embedding import Embedder, to_bytes
from memstream.llm.protocols import (ExtractionClient, ModelRefused, ModelUnavailable, Operation, Resolution,
                                     ResolutionClient, TurnExtractionClient)
from memstream.llm.relations import USER, RelationExtractionClient
from memstream.projections.episodes import core as episodes
from memstream.projections.facts import core as facts_core
from memstream.projections.facts import decay
from memstream.projections.graph import store as graph_store
from memstream.projections.graph.core import EdgeRow
from memstream.schemas import (Decision, EpisodeRecorded, Event, FactChangeDeferred, FactDecision, FactDeleted,
                               FactRefused, FactRestored, LogPosition, TurnRecorded)
from memstream.schemas.events import Passage
from memstream.schemas.vocabulary import canonical, relation_of
from memstream.streams.log.records import Record
from memstream.streams.worker.formation import grounding, slot_edges
from memstream.streams.worker.formation.decide import Context, decide
from memstream.streams.worker.formation.graph import EdgeDecider, GraphContext, GraphView
from memstream.streams.worker.formation.slots import OldestFirst
from memstream.streams.worker.formation.views import FactView

log = logging.getLogger("memstream.formation")

# A turn's episode vector and its passages ``(start, end, vector)`` (``embed_with_passages``).
Embedded = tuple[np.ndarray, list[tuple[int, int, np.ndarray]]]

_RANK: contextvars.ContextVar[int] = contextvars.ContextVar("rank", default=0)  # of the turn a call is for

FORGOTTEN_KEPT = 100_000  # forgotten turns held in memory (beyond, Postgres answers: the barrier passed them)

NEW = Resolution(Operation.ADD, None, "new fact")

RELATED = 0.5  # cosine from which a fact of another slot may still be the same fact in other words



def episode_text(turn: TurnRecorded) -> str:
    return f"{turn.user_message}\n{turn.assistant_message}".strip()


class TurnDecider:
    """A turn's decisions on a user's views, and the model calls they take (oldest turn first)."""

    def __init__(self, *, embedder: Embedder, extractor: ExtractionClient, resolver: ResolutionClient,
                 pool: asyncpg.Pool | None, relations: RelationExtractionClient | None = None,
                 turn_extractor: TurnExtractionClient | None = None, gate_observations: int = 3,
                 concurrency: int = 16):
        """``pool``: the projections' rows (None in a reform, whose views hold everything)."""
        self.embedder, self.pool = embedder, pool
        self._extractor, self._resolver, self._relations = extractor, resolver, relations
        # One call for a turn's facts and relations when the model offers it (fewer calls per turn).
        self._turn_extractor = turn_extractor
        self._gate_observations = gate_observations
        self._slots = OldestFirst(concurrency)  # LLM calls in flight for this worker
        self.answered_at: dict[int, float] = {}  # per client: when a call of it last succeeded (monotonic)
        # Fact texts repeat ("Lives in Berlin"); vectors are a pure function of (model, text).
        self._fact_vectors: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        # Turns whose episodes this process forgot (Postgres holds the ones before: the barrier),
        # by user, the users who forgot last at the end; beyond FORGOTTEN_KEPT turns the oldest
        # users' go (their forgets applied long since: Postgres answers), except in a reform.
        self._forgotten_turns: collections.OrderedDict[str, set[uuid.UUID]] = collections.OrderedDict()
        self._forgotten_n = 0

    def clear(self) -> None:
        """Forget what is held between turns (partitions revoked: users this worker may no longer form)."""
        self._fact_vectors.clear()
        self._forgotten_turns.clear()
        self._forgotten_n = 0

    def forget_user(self, user_id: str) -> None:
        """A whole user forgotten: nothing of theirs is held (fact texts, some of them theirs)."""
        self._fact_vectors.clear()
        self._forgotten_n -= len(self._forgotten_turns.pop(user_id, ()))

    async def form(self, r: Record, turn: TurnRecorded, embedded: asyncio.Future, n: int, overlay: FactView,
                    graph: GraphView, extracted: asyncio.Future | None = None) -> tuple[list[Decision], str | None]:
        """A turn's fact and edge decisions (the two pipelines side by side), then its episode;
        or, if the model refuses its one extraction call, its episode alone and why; or nothing,
        if the user forgot this turn (it is on the log again: a retried letter, a host's retry)."""
        if await self.was_forgotten(turn):
            return [], None
        if self._turn_extractor is not None:
            try:
                found = await (extracted or self.ask(self._turn_extractor.extract_turn, turn))
            except ModelRefused as exc:  # nothing decided yet: ``decide`` (no forks) can give it up too
                return self.given_up(r, turn, (await embedded)[n], exc)
            facts, edges = await together(self.facts(r, turn, overlay, list(found.facts)),
                                           self.edges(r, turn, graph, list(found.relations)))
        else:
            facts, edges = await together(self.facts(r, turn, overlay), self.edges(r, turn, graph))
        relations = slot_edges.touched([*facts, *edges], overlay, graph, turn.user_id)
        # A turn formed again (its decisions sent, or some of them, before a crash) follows its own
        # facts' slots too: what it decided is in the view, not in ``facts``, and its slot edges may
        # not have been sent.
        relations |= {x for f in _own_facts(overlay, turn) if (x := relation_of(f.attribute)) is not None}
        if relations:
            model = (self._turn_extractor or self._extractor).model_id
            edges += await self.follow(r, turn, overlay, graph, relations, extractor=model)
        # Last: a projection that has applied a turn's episode has seen all of its decisions.
        return [*facts, *edges, self.episode(r, turn, (await embedded)[n])], None

    async def facts(self, r: Record, turn: TurnRecorded, overlay, candidates=None) -> list[Decision]:
        if candidates is None:
            candidates = list(await self.ask(self._extractor.extract, turn))
            model = self._extractor.model_id
        else:
            model = self._turn_extractor.model_id
        if not candidates:
            return []
        if len(candidates) > facts_core.MAX_CANDIDATES:  # the rest would have ids a forget cannot name
            log.info("turn %s: %d candidate facts, the first %d decided", turn.event_id,
                     len(candidates), facts_core.MAX_CANDIDATES)
            candidates = candidates[:facts_core.MAX_CANDIDATES]
        # The junk guard reads the turn, not the model: what it refuses is recorded, not weighed.
        refused = {n: why for n, c in enumerate(candidates) if (why := grounding.refusal(c, turn)) is not None}
        vectors = await self.embed_facts([c.text for c in candidates])
        ctx = Context(turn=turn, source=LogPosition(r.topic, r.partition, r.offset), recorded_at=r.timestamp,
                      extractor=model, resolver=self._resolver.model_id,
                      embedding_model=self.embedder.model_id, gate_observations=self._gate_observations)
        shown = [await overlay.neighbours(turn.user_id, c.attribute, v) for c, v in zip(candidates, vectors)]
        # The turn's own fact ids too: a turn formed again (a crash before its position was saved,
        # a host's retry) must not decide again what its facts' rows already hold.
        own = [facts_core.fact_id(turn.event_id, n) for n in range(len(candidates))]
        await overlay.ensure(turn.user_id, {*own, *(nb.fact_id for nbs in shown for nb in nbs)})
        # One resolution call for the candidates no earlier one of this turn bears on (another
        # slot, other neighbours, far in meaning): the facts held before the turn are the ones
        # they would be weighed against after the earlier candidates, too. The others are
        # resolved one by one, each against the facts as the candidates before it left them.
        alone = {n for n in range(len(candidates)) if n not in refused and not any(
            _bears_on(m, n, candidates, shown, vectors) for m in range(n) if m not in refused)}
        # A fact the user says again after a sweep archived it comes back (the same slot and
        # value); one they retract ends.
        restored = {n: d for n in range(len(candidates)) if n not in refused
                    and (d := await self._restored(ctx, n, candidates[n], shown[n], overlay)) is not None}
        alone -= restored.keys()
        repeats = {n: known for n in alone if (known := _repeated(candidates[n], shown[n])) is not None}
        batched = [n for n in sorted(alone) if n not in repeats and _related(candidates[n], shown[n])]
        answers = dict(zip(batched, await self.ask(self._resolver.resolve_all, [(candidates[n], shown[n])
                                                                                 for n in batched])
                           if batched else []))
        answers.update(repeats)
        out: list[Decision] = []
        for n, (cand, vector) in enumerate(zip(candidates, vectors)):
            if (turn.user_id, own[n]) in overlay.rows:
                continue  # decided when the turn was formed before
            if n in refused:
                out.append(_refused(ctx, n, cand, *refused[n]))
                continue
            if n in restored:
                overlay.apply(restored[n])
                out.append(restored[n])
                continue
            if n in alone:  # less what this turn ended since (unrelated to it: nothing to weigh)
                neighbours = [nb for nb in shown[n]
                              if (row := overlay.rows.get((turn.user_id, nb.fact_id))) is None or row.current]
                resolution = answers.get(n, NEW)
            else:
                neighbours = await overlay.neighbours(turn.user_id, cand.attribute, vector)
                await overlay.ensure(turn.user_id, [nb.fact_id for nb in neighbours])
                resolution = _repeated(cand, neighbours) or (await self.ask(self._resolver.resolve, cand, neighbours)
                                                             if _related(cand, neighbours) else NEW)
            decision = decide(ctx, n, cand, vector, resolution, neighbours, overlay.rows)
            _log(turn, cand, resolution, decision)
            if decision is not None:
                overlay.apply(decision)
                out.append(decision)
        return out

    async def _restored(self, ctx: Context, n: int, cand, shown, overlay: FactView) -> FactRestored | FactDeleted | None:
        """What ``cand`` does to an archived fact of its user of the same slot and value (none
        held current): states it again (``FactRestored``), or retracts it (``FactDeleted``: an
        archived fact is believed still, and ends as a current one)."""
        said = cand.value.casefold().strip()
        if not said or not decay.decays(cand.category, cand.attribute) or _repeated(cand, shown) is not None:
            return None
        row = next((f for f in await overlay.archived(ctx.turn.user_id, cand.attribute)
                    if f.value.casefold().strip() == said), None)
        if row is None:
            return None
        common = dict(decision_id=facts_core.fact_id(ctx.turn.event_id, n), source_event_id=ctx.turn.event_id,
                      source=ctx.source, recorded_at=ctx.recorded_at, user_id=ctx.turn.user_id, extractor=ctx.extractor,
                      resolver="decay-restore", confidence=float(cand.confidence), explicit=cand.explicit,
                      target=row.fact_id, said_at=ctx.turn.occurred_at)
        if cand.negated:
            return FactDeleted(**common, valid_to=max(cand.valid_at or ctx.turn.occurred_at, row.valid_from),
                               reason=f"user retracts archived {row.text!r}")
        return FactRestored(**common, reason=f"said again: {row.text!r}")

    async def edges(self, r: Record, turn: TurnRecorded, graph: GraphView, candidates=None) -> list[Decision]:
        if candidates is None:
            if self._relations is None:
                return []
            candidates = list(await self.ask(self._relations.extract, turn))
            model = self._relations.model_id
        else:
            model = self._turn_extractor.relations_model_id
        if not candidates:
            return []
        await graph.ensure_user(turn.user_id)
        if any(isinstance(row, EdgeRow) and row.source_event_id == turn.event_id
               for row in graph.of(turn.user_id).values()):
            return []  # formed before: deciding again would close what later turns said and reopen its edges
        ctx = GraphContext(turn=turn, extractor=model, common=dict(
            source_event_id=turn.event_id, source=LogPosition(r.topic, r.partition, r.offset),
            recorded_at=r.timestamp, user_id=turn.user_id))
        decider = EdgeDecider(ctx, graph)
        for c in candidates:
            if c.source == USER and (why := grounding.edge_refusal(canonical(c.relation), c.target, c.negated,
                                                                    turn)):
                # The junk guard, as for facts ("imagine my boss is Darth Vader" is no edge of theirs).
                log.info("edge refused by the junk guard: %s [event %s]", why[0], turn.event_id)
                continue
            decider.add(c)
        sentences = decider.sentences()
        vectors = dict(zip(sentences, (to_bytes(v) for v in await self.embed_facts(sentences)))) if sentences else {}
        decisions = decider.finish(vectors, self.embedder.model_id)
        for d in decisions:
            log.debug("%s for user %s: %s [event %s]", type(d).__name__,
                      turn.user_id, getattr(d, "fact_sentence", None) or d.reason, turn.event_id)
        # The view saw the edges without vectors; it only needs ids, targets and intervals.
        return decisions

    async def follow(self, r: Record, event: Event, overlay: FactView, graph: GraphView, relations: set[str], *,
                      extractor: str, why: str | None = None, forgot: tuple | None = None) -> list[Decision]:
        """The graph decisions that make the user's edges of ``relations`` say what their facts
        say (``slot_edges``), with their sentences embedded."""
        ctx = GraphContext(turn=event, extractor=extractor, why=why, common=dict(
            source_event_id=event.event_id, source=LogPosition(r.topic, r.partition, r.offset),
            recorded_at=r.timestamp, user_id=event.user_id))
        decider = EdgeDecider(ctx, graph, prefix="slot-")
        await slot_edges.follow(decider, overlay, relations, forgot=forgot)
        sentences = decider.sentences()
        vectors = dict(zip(sentences, (to_bytes(v) for v in await self.embed_facts(sentences)))) if sentences else {}
        return decider.finish(vectors, self.embedder.model_id)

    async def embed_facts(self, texts: list[str], keep: int = 10_000) -> list[np.ndarray]:
        # Held here across the wait: other users' turns may evict from the cache, or clear it.
        have = {t: self._fact_vectors[t] for t in dict.fromkeys(texts) if t in self._fact_vectors}
        missing = [t for t in dict.fromkeys(texts) if t not in have]
        if missing:
            have.update(zip(missing, await asyncio.to_thread(self.embedder.embed, missing)))
        for t, vec in have.items():
            self._fact_vectors[t] = vec
            self._fact_vectors.move_to_end(t)
        while len(self._fact_vectors) > keep:
            self._fact_vectors.popitem(last=False)
        return [have[t] for t in texts]

    def episode(self, r: Record, turn: TurnRecorded, embedded: Embedded) -> EpisodeRecorded:
        vector, passages = embedded
        # Spans of the text as stored (``user_message + "\n" + assistant_message``): the
        # embedded text (``episode_text``) is that text without its leading whitespace.
        raw = f"{turn.user_message}\n{turn.assistant_message}"
        lead = len(raw) - len(raw.lstrip())
        return EpisodeRecorded(
            decision_id=episodes.episode_id(turn.event_id), source_event_id=turn.event_id,
            source=LogPosition(r.topic, r.partition, r.offset), recorded_at=r.timestamp,
            user_id=turn.user_id, conversation_id=turn.conversation_id, occurred_at=turn.occurred_at,
            user_message=turn.user_message, assistant_message=turn.assistant_message,
            metadata=turn.metadata, embedding=to_bytes(vector), embedding_model=self.embedder.model_id,
            passages=[Passage(start=a + lead, end=b + lead, embedding=to_bytes(v)) for a, b, v in passages])

    def given_up(self, r: Record, turn: TurnRecorded, vector: Embedded, exc: ModelRefused
                  ) -> tuple[list[Decision], str]:
        # One user's turn the model will not answer must not hold up the partition: its episode
        # is kept (it needs no model), the turn dead-lettered to be formed again.
        log.warning("the model refused turn %s at %s: %s", turn.event_id, r.where, exc)
        return [self.episode(r, turn, vector)], f"its episode recorded without facts or relations: {exc}"

    def forgot_turns(self, user_id: str, turns) -> None:
        held = self._forgotten_turns.setdefault(user_id, set())
        self._forgotten_n -= len(held)
        held.update(turns)
        self._forgotten_n += len(held)
        self._forgotten_turns.move_to_end(user_id)
        while self.pool is not None and len(self._forgotten_turns) > 1 and self._forgotten_n > FORGOTTEN_KEPT:
            self._forgotten_n -= len(self._forgotten_turns.popitem(last=False)[1])

    async def was_forgotten(self, turn: TurnRecorded) -> bool:
        return await self.forgotten(turn.user_id, turn.event_id)

    async def forgotten(self, user_id: str, turn_id: uuid.UUID) -> bool:
        """Whether the user forgot turn ``turn_id``: decided here (its forget may not be projected
        yet) or before (the episodes projection's record of forgotten turns)."""
        if turn_id in self._forgotten_turns.get(user_id, ()):
            return True
        if self.pool is None:  # a reform: every forget before this turn was formed here
            return False
        return await self.pool.fetchval(
            "SELECT EXISTS (SELECT FROM forgotten_episodes WHERE user_id = $1 AND episode_id = $2)",
            user_id, episodes.episode_id(turn_id))

    async def ask(self, call, *args):
        client = id(getattr(call, "__self__", call))  # the extractor and the resolver may be two services
        async with self._slots.slot(_RANK.get()):
            try:
                answer = await call(*args)
            except ModelUnavailable as exc:
                exc.client = client  # whose service failed (``_retried``)
                raise
        self.answered_at[client] = time.monotonic()
        return answer

    async def load_graph(self, user_id: str):
        async with self.pool.acquire() as conn:
            return await graph_store.load_user(conn, user_id)


def _refused(ctx: Context, n: int, cand, kind: str, why: str) -> FactRefused:
    log.info("REFUSED a %s candidate (%s) [event %s]", cand.category, kind, ctx.turn.event_id)
    log.debug("REFUSED %r for user %s: %s [event %s]", cand.text, ctx.turn.user_id, why, ctx.turn.event_id)
    return FactRefused(decision_id=uuid.uuid5(ctx.turn.event_id, f"refused:{n}"), source_event_id=ctx.turn.event_id,
                       source=ctx.source, recorded_at=ctx.recorded_at, user_id=ctx.turn.user_id, extractor=ctx.extractor,
                       resolver="junk-guard-v1", reason=why, confidence=float(cand.confidence), explicit=cand.explicit,
                       text=cand.text, category=cand.category, attribute=cand.attribute, value=cand.value,
                       refusal=kind, evidence=cand.evidence)


def _own_facts(overlay: FactView, turn: TurnRecorded) -> list:
    """The facts the view holds that ``turn`` created (when it was formed before)."""
    return [f for fid in facts_core.turn_decisions(turn.event_id) if (f := overlay.rows.get((turn.user_id, fid)))]


def _related(cand, neighbours) -> bool:
    """Whether a resolver has anything to weigh ``cand`` against: a fact of its slot, or one near
    it in meaning. Without one it cannot update, delete or repeat a fact: it is new."""
    return any(nb.attribute == cand.attribute or nb.similarity >= RELATED for nb in neighbours)


def _repeated(cand, neighbours) -> Resolution | None:
    """NOOP on the current fact ``cand`` states again (its slot and value, not a retraction):
    nothing for a resolver to weigh, so no call — every resolver would say the same."""
    if cand.negated:
        return None
    same = next((nb for nb in neighbours if nb.attribute == cand.attribute
                 and nb.value.casefold().strip() == cand.value.casefold().strip()), None)
    return None if same is None else Resolution(Operation.NOOP, same.fact_id, "already known")


def _bears_on(m: int, n: int, candidates, shown, vectors) -> bool:
    """Whether candidate ``m``'s decision can change what candidate ``n`` is weighed against: the
    same slot, a fact related to both (one ``m`` may update, delete or repeat), or a fact near
    ``n`` in meaning that ``m`` may add. Facts unrelated to ``n`` weigh nothing in its decision."""
    def related(k):
        return {nb.fact_id for nb in shown[k] if nb.attribute == candidates[k].attribute or nb.similarity >= RELATED}

    return (candidates[m].attribute == candidates[n].attribute or not related(m).isdisjoint(related(n))
            or float(vectors[m] @ vectors[n]) >= RELATED)


async def together(*coroutines) -> list:
    """Run ``coroutines`` at once and return their results; the first to fail cancels the others
    and is raised as itself (the runtime retries a batch by its error's kind, not an
    ``ExceptionGroup``)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coroutines]
    except BaseExceptionGroup as failed:
        first = failed.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [t.result() for t in tasks]


def _log(turn: TurnRecorded, cand, resolution, decision) -> None:
    # What was said, and the facts it touched, only at DEBUG (personal content).
    if isinstance(decision, FactChangeDeferred):
        log.info("GATE REFUSED %s of a %s fact [event %s]", decision.operation, cand.category, turn.event_id)
        log.debug("GATE REFUSED %s for user %s: %s [event %s]", decision.operation, turn.user_id, decision.reason,
                  turn.event_id)
    elif isinstance(decision, FactDecision):
        op = {"FactAdded": "ADD", "FactUpdated": "UPDATE", "FactDeleted": "DELETE", "FactReinforced": "NOOP+reinforce"}[
            type(decision).__name__]
        log.debug("%s %r for user %s: %s [event %s]", op, cand.text, turn.user_id, decision.reason, turn.event_id)
    else:
        log.debug("NOOP %r for user %s: %s [event %s]", cand.text, turn.user_id, resolution.reason, turn.event_id)

