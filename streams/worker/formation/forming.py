"""The formation step: each turn becomes an ``EpisodeRecorded`` decision (its embedding) and,
through extract -> resolve -> classify -> safety gate -> near-duplicate merge, fact decisions.

Formation for a turn must see every earlier decision for the same user, even when the facts
projection lags. Two mechanisms give that:

* an **overlay**: a user's turns are decided one after another on the user's views, the
  projections' rows under the decisions made since, folded with the projections' own pure cores;
  the views are carried from batch to batch while the projections may not hold what they overlay;
* a **barrier**, for a user without carried views: wait until the facts and graph projections
  have applied every decision formation produced for them on that partition (on a fresh
  assignment: every decision already in the partition). Decisions go to the same partition
  number as their source event, so a user's events and decisions share one partition.

Formation is pipelined (``start``): docs/architecture.md, "Formation is a pipeline".
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import time
import uuid
from typing import Awaitable, Callable, NamedTuple, Sequence

import asyncpg
import numpy as np

from memstream.embedding import Embedder, embed_with_passages, to_bytes
from memstream.llm.protocols import (ExtractionClient, ModelRefused, Operation, Resolution, ResolutionClient,
                                     ModelUnavailable, TurnExtractionClient, Unanswered)
from memstream.projections import positions as pos
from memstream.projections.episodes import core as episodes
from memstream.projections.facts import core as facts_core
from memstream.schemas import (SYSTEM_USER, Decision, EdgeForgotten, EpisodeForgotten, EpisodeRecorded, Event,
                               FactChangeDeferred, FactCorrected, FactDecision, FactForgotten, FactUpdated,
                               InvalidEvent, LogPosition, MemoryForgotten, NothingDecided, TurnRecorded,
                               UserForgotten, decode_event)
from memstream.schemas.events import CONTROL_TYPES, MAX_PASSAGES, Passage
from memstream.schemas.vocabulary import attributes_of, relation_of
from memstream.schemas.errors import Refused, Retryable
from memstream.streams.log.screening import screen, imported
from memstream.streams.log.dead_letter import InputRefused
from memstream.llm.relations import RelationExtractionClient
from memstream.projections.graph import store as graph_store
from memstream.projections.graph.core import EdgeRow, EntityRow
from memstream.streams.worker.formation.decide import Context, decide
from memstream.streams.worker.formation import slot_edges
from memstream.streams.worker.formation.graph import EdgeDecider, GraphContext, GraphView
from memstream.streams.worker.formation.slots import OldestFirst
from memstream.streams.worker.formation.views import FactView, MemoryView, PostgresView
from memstream.streams.log.errors import BrokerUnavailable, retried
from memstream.streams.log.records import Record, first_offsets, next_offsets
from memstream.keys.data_keys import Shredded
from memstream.streams.log.sealing import RecordSealer

log = logging.getLogger("memstream.formation")

# A turn's episode vector and its passages ``(start, end, vector)`` (``embed_with_passages``).
Embedded = tuple[np.ndarray, list[tuple[int, int, np.ndarray]]]


def episode_text(turn: TurnRecorded) -> str:
    return f"{turn.user_message}\n{turn.assistant_message}".strip()


def decode_turns(records: Sequence[Record], stage: str, partitions: int | None = None
                 ) -> tuple[list[tuple[Record, Event]], list]:
    """Turns, and commands about a user's memory (``CONTROL_TYPES``), to form in log order; and
    ``(record, stage, reason)`` for records that must be dead-lettered (``screening.screen``;
    ``partitions``: the events topic's partition count)."""
    events, letters = screen(records, stage, partitions)
    return [(r, e) for r, e in events if isinstance(e, (TurnRecorded, *CONTROL_TYPES)) and not imported(r)], letters


class CommandRefused(Refused):
    """A command names a fact or edge its user does not hold (current): dead-lettered, nothing changes."""

    users_input = True


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


class Abandoned(Retryable):
    """Records given up before they were recorded (their partitions revoked): form them again."""


PRUNE_AT = 10_000  # the barrier's users from which it drops those the projections have applied


class ProjectionBarrier:
    """Waits until the projections formation reads (facts, graph) have applied what formation
    produced to a partition."""

    projections = ("facts", "graph")

    def __init__(self, pool: asyncpg.Pool, decisions_topic: str,
                 end_offset: Callable[[int], Awaitable[int]], timeout: float = 30.0):
        self._pool, self._topic, self._end_offset, self._timeout = pool, decisions_topic, end_offset, timeout
        self._whole: set[int] = set()  # waited for as a whole since assigned (the previous owner's decisions too)
        # (partition, user) -> the offset past that user's last decision: a batch waits only for
        # the users in it (others' decisions cannot change what it decides).
        self._by_user: dict[tuple[int, str], int] = {}
        self._prune_at = PRUNE_AT
        self._applied: dict[int, int] = {}  # partition -> the projections' position, as last read
        self._reading: dict[int, asyncio.Future] = {}
        self._ending: dict[int, asyncio.Future] = {}  # partition -> its end offset when assigned

    def produced(self, partition: int, next_offset: int, user_id: str) -> None:
        key = (partition, user_id)
        self._by_user[key] = max(self._by_user.get(key, 0), next_offset)

    def forget(self, partitions) -> None:
        for p in partitions:
            self._whole.discard(p)
            self._applied.pop(p, None)
            self._ending.pop(p, None)
        gone = set(partitions)
        self._by_user = {k: v for k, v in self._by_user.items() if k[0] not in gone}

    def applied_for(self, partition: int, user_id: str) -> bool:
        """Whether the projections have applied every decision produced for ``user_id`` on
        ``partition`` by the last position this barrier read (positions only move forward)."""
        return (partition in self._whole
                and self._applied.get(partition, 0) >= self._by_user.get((partition, user_id), 0))

    async def wait(self, partition: int, users) -> None:
        """Until the projections have applied what formation produced for ``users`` on
        ``partition``; on a fresh assignment, every decision already there."""
        if partition not in self._whole:
            ending = self._ending.get(partition)
            if ending is None or (ending.done() and (ending.cancelled() or ending.exception() is not None)):
                ending = self._ending[partition] = asyncio.ensure_future(self._end_offset(partition))  # one ask for all
                ending.add_done_callback(_retrieved)  # by its waiters, unless all were cancelled
            # Until a first wait there is over, formation records on the partition no facts
            # or edges (a turn's chain waits first): the end offset is all there is to wait for.
            needed = await asyncio.shield(ending)
        else:
            needed = max((self._by_user.get((partition, u), 0) for u in users), default=0)
        deadline = asyncio.get_running_loop().time() + self._timeout
        delay = 0.002
        while True:
            applied = await self._read(partition)
            if applied >= needed:
                self._whole.add(partition)
                if len(self._by_user) > self._prune_at:  # users applied need no entry
                    self._by_user = {k: v for k, v in self._by_user.items() if v > self._applied.get(k[0], 0)}
                    self._prune_at = max(PRUNE_AT, 2 * len(self._by_user))  # scanned again once it doubled
                return
            if asyncio.get_running_loop().time() > deadline:
                # The facts projection may be restarting or on another worker.
                raise ProjectionLagging(f"facts/graph projections are at {self._topic}/{partition}@{applied}, formation needs {needed}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _read(self, partition: int) -> int:
        # Users waiting on one partition share one read of its position at a time.
        reading = self._reading.get(partition)
        if reading is None or reading.done():
            reading = self._reading[partition] = asyncio.ensure_future(self._pool.fetchval(
                "SELECT coalesce(min(next_offset), 0) FROM projection_positions WHERE projection = ANY($3::text[]) "
                "AND topic = $1 AND partition = $2 HAVING count(*) = cardinality($3::text[])",
                self._topic, partition, list(self.projections)))
            reading.add_done_callback(_retrieved)
        applied = await asyncio.shield(reading) or 0
        self._applied[partition] = max(self._applied.get(partition, 0), applied)
        return applied


class Formation:
    name = "formation"

    def __init__(self, *, producer, decisions_topic: str, embedder: Embedder, extractor: ExtractionClient,
                 resolver: ResolutionClient, dead_letters, pool: asyncpg.Pool, barrier: ProjectionBarrier | None,
                 relations: RelationExtractionClient | None = None, gate_observations: int = 3,
                 record_position: bool = True, partitions: int | None = None,
                 sealer: RecordSealer | None = None, ends_keys: bool = False, decided=None,
                 turn_extractor: TurnExtractionClient | None = None, concurrency: int = 16,
                 in_flight: int = 1024, on_fatal: Callable[[BaseException], None] | None = None,
                 timed: Callable[[float], None] | None = None, model_attempts: int = 5,
                 positions: asyncpg.Pool | None = None):
        """``positions``: the pool this formation's position is claimed and saved on, a connection
        held while a part is produced; apart from ``pool`` (the default) wherever producing reads
        or writes through ``pool`` (sealing with keys in the same database, a forget destroying
        its key), else claims waiting on ``pool`` while holding its connections could leave none."""
        self._relations, self._partitions = relations, partitions
        self._model_attempts = model_attempts  # a turn's extraction, or resolution, asked at most this often
        self._answered_at: dict[int, float] = {}  # per client: when a call of it last succeeded (monotonic)
        # One call for a turn's facts and relations when the model offers it (fewer calls per turn).
        self._turn_extractor = turn_extractor
        self._slots = OldestFirst(concurrency)  # LLM calls in flight for this worker
        # ``ends_keys``: this formation destroys a forgotten user's data key once it has sealed
        # every decision before the forget (the live one; a reform rebuilds after the fact).
        self._sealer, self._ends_keys = sealer or RecordSealer(None), ends_keys
        self._decided = decided or (lambda decisions: None)  # told every decision produced (metrics)
        self._producer, self._topic, self._embedder = producer, decisions_topic, embedder
        self._extractor, self._resolver = extractor, resolver
        self._dead, self._pool, self._barrier = dead_letters, pool, barrier
        self._positions = positions or pool
        self._gate_observations, self._record_position = gate_observations, record_position
        # Fact texts repeat ("Lives in Berlin"); vectors are a pure function of (model, text).
        self._fact_vectors: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        # Turns whose episodes this process forgot (Postgres holds the ones before: the barrier),
        # by user, the users who forgot last at the end; beyond FORGOTTEN_KEPT turns the oldest
        # users' go (their forgets applied long since: Postgres answers), except in a reform.
        self._forgotten_turns: collections.OrderedDict[str, set[uuid.UUID]] = collections.OrderedDict()
        self._forgotten_n = 0
        # The pipeline (``start``): records in flight, each user's last chain, each partition's
        # last finish, and the views of users whose decisions the projections may not hold yet.
        self._in_flight, self._max_in_flight = 0, in_flight
        self._room = asyncio.Condition()
        self._tails: dict[str, _Tail] = {}
        self._finishing: dict[int, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._recording: set[asyncio.Future] = set()
        self._views: collections.OrderedDict[str, _Views] = collections.OrderedDict()
        self._unfinished: collections.Counter[str] = collections.Counter()
        self._failed: BaseException | None = None
        self._ranked = 0
        self._epoch = 0  # abandoned so far: a part of an earlier epoch records nothing
        self._on_fatal, self._timed = on_fatal, timed or (lambda seconds: None)

    async def process(self, records: list[Record]) -> None:
        recorded = []
        await self.start(records, recorded=lambda: recorded.append(True))
        await self.drain()
        if not recorded:
            raise Abandoned(f"{len(records)} records given up before they were recorded (partitions revoked)")

    async def start(self, records: list[Record], recorded: Callable[[], None] | None = None) -> None:
        """``PipelinedStep.start``: room means fewer than ``in_flight`` records in flight. Each
        user's turns and commands are formed in log order, each after the one before, beside
        other users' (a user's next batch does not wait for the rest of this one); a fatal error
        goes to ``on_fatal``."""
        self._raise_failed()
        turns, letters = decode_turns(records, self.name, self._partitions)
        partitions = list(dict.fromkeys(r.partition for r in records))
        left = len(partitions)

        def one_recorded() -> None:
            nonlocal left
            left -= 1
            if not left and recorded is not None:
                recorded()

        for partition in partitions:
            self._start(_Part([r for r in records if r.partition == partition],
                              [(r, e) for r, e in turns if r.partition == partition],
                              [x for x in letters if x[0].partition == partition], one_recorded, self._epoch))
        if not partitions and recorded is not None:
            recorded()
        async with self._room:
            await self._room.wait_for(lambda: self._in_flight < self._max_in_flight or self._failed is not None)
        self._raise_failed()

    async def drain(self) -> None:
        """Until everything started is durable or abandoned (or raise what stopped it)."""
        while self._finishing:
            await asyncio.wait(list(self._finishing.values()))
        self._raise_failed()

    async def abandon(self) -> None:
        """Give up what is in flight (partitions revoked): every chain cancelled, a batch whose
        decisions are being produced finished first. What was not recorded is formed again from
        the stored positions by whoever holds the partitions next."""
        # At once, before any wait: a batch started meanwhile starts afresh, after none of these.
        self._epoch += 1
        tasks, recording = list(self._tasks), list(self._recording)
        self._tails.clear()
        self._finishing.clear()
        self._views.clear()
        self._unfinished.clear()
        self._fact_vectors.clear()  # fact texts of users this worker may no longer form (nor see forgotten)
        self._forgotten_turns.clear()
        self._forgotten_n = 0
        self._in_flight = 0
        for t in tasks:
            t.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        if recording:
            done, late = await asyncio.wait(recording, timeout=RECORDING_GRACE_S)
            outcomes += [t.exception() for t in done if not t.cancelled()]
            if late:  # Kafka or Postgres gone: the next owner must not find this worker still recording
                outcomes.append(BrokerUnavailable(f"{len(late)} batches still recording after {RECORDING_GRACE_S} s"))
                for t in late:
                    t.cancel()
        for failed in outcomes:
            if isinstance(failed, Exception) and not isinstance(failed, ModelRefused):  # its chain's to settle
                self._fail(failed)
        async with self._room:
            self._room.notify_all()

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    def _fail(self, exc: BaseException) -> None:
        if self._failed is not None:
            return
        self._failed = exc
        if self._on_fatal is not None:
            self._on_fatal(exc)
            return
        log.error("formation failed: %r", exc)
        for t in self._tasks:  # nothing more can be recorded: let ``drain`` and ``start`` raise
            if t is not asyncio.current_task():
                t.cancel()

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _start(self, part: "_Part") -> None:
        embedding, part.where = self._episodes(part.turns)
        part.embedded = self._spawn(embedding)
        for i, _ in enumerate(part.turns):
            self._ranked += 1
            part.ranks[i] = self._ranked
        if self._turn_extractor is not None:
            # What the model reads in a turn does not depend on what came before: asked for at
            # once, beside the user's earlier turns (only resolving them must wait).
            for i in part.where:
                part.extracted[i] = self._spawn(self._extract(part.turns[i][1], part.ranks[i], part.epoch))
        users = _by_user(part.turns)
        p = part.records[0].partition
        part.finish = self._spawn(self._finish(part, self._finishing.get(p)))
        self._finishing[p] = part.finish
        part.finish.add_done_callback(lambda t: self._finishing.pop(p) if self._finishing.get(p) is t else None)
        for user, indices in users.items():
            self._unfinished[user] += 1
            before = self._tails.get(user)
            task = self._spawn(self._chain(part, user, indices, before))
            self._tails[user] = _Tail(task, part)  # until the part is recorded
            part.chains.append(task)
        part.users = list(users)
        self._in_flight += len(part.records)

    def _episodes(self, turns: list[tuple[Record, Event]]) -> tuple[Awaitable[list], dict[int, int]]:
        """The embedding of ``turns``' episodes, to ask for at once (while the model is asked
        about their turns), and each turn's index in it."""
        said = [(i, t) for i, (_, t) in enumerate(turns) if isinstance(t, TurnRecorded)]
        texts = [episode_text(t) for _, t in said]
        embed = lambda: asyncio.to_thread(embed_with_passages, self._embedder, texts, MAX_PASSAGES)  # noqa: E731
        return (retried("embedding episodes", embed) if said else asyncio.sleep(0, [])), {
            i: n for n, (i, _) in enumerate(said)}

    async def _chain(self, part: "_Part", user: str, indices: list[int], before: "_Tail | None") -> bool:
        # One user's turns and commands of this batch, after their previous batch's; True once formed.
        if before is not None:
            await asyncio.wait([before.chain])
            if before.chain.cancelled() or before.chain.exception() is not None or not before.chain.result():
                return False  # abandoned, or fatal: its partition records nothing from here on
        if self._failed is not None or part.epoch != self._epoch:
            return False
        views = await self._views_for(part.records[0].partition, user, before)
        for i in indices:
            r, event = part.turns[i]
            _RANK.set(part.ranks[i])

            async def attempt():
                # On forks: a turn that fails half way is retried as if never begun.
                facts, graph = views.facts.fork(), views.graph.fork()
                made, refused = await self._form(r, event, facts, graph, part.embedded, part.where.get(i),
                                                 part.extracted.get(i))
                views.facts, views.graph = facts, graph
                return made, refused

            try:
                part.made[i], why = await self._retried(f"formation of {type(event).__name__} {event.event_id}",
                                                        part.epoch, attempt)
            except ModelRefused as exc:
                # Its half-made decisions were on forks, dropped: the turn can be given up anywhere.
                if not isinstance(event, TurnRecorded):
                    raise
                part.made[i], why = self._given_up(r, event, (await part.embedded)[part.where[i]], exc)
            if why is not None:
                part.refused[i] = why
            for d in part.made[i]:
                if isinstance(d, MemoryForgotten) and d.kind == "user":
                    # Nothing of theirs is left: the store's rows, until the forget is applied, would mislead.
                    views.facts, views.graph = MemoryView(self._embedder.model_id), GraphView(None)
                elif isinstance(d, MemoryForgotten) and d.kind == "episode":
                    views.settle = True  # what it forgot stays in the store until it is recorded and applied
        return True

    async def _views_for(self, partition: int, user: str, before: "_Tail | None") -> "_Views":
        views = self._views.pop(user, None)
        if views is not None and (views.settle or len(views.facts.rows) > VIEW_ROWS or views.graph.grown > VIEW_ROWS):
            # Read afresh once the store holds what the views overlay: after a forget of some of
            # it, or once they have grown (a busy user's are seldom idle enough to be dropped).
            if before is not None:  # their last part not recorded yet
                await asyncio.wait([before.part.finish])
            views = None
        elif views is not None and self._unfinished[user] == 1 and (
                self._barrier is None or self._barrier.applied_for(partition, user)):
            views = None  # no decision of theirs in flight but this batch's, and the store holds the rest
        if views is None:
            if self._barrier is not None:
                await retried("formation's barrier", lambda: self._barrier.wait(partition, {user}))
            views = _Views(PostgresView(self._pool, self._embedder.model_id), GraphView(self._load_graph))
        self._views[user] = views
        while len(self._views) > VIEWS_KEPT:  # the least recent that nothing in flight needs
            idle = next((u for u in self._views if not self._unfinished[u]), None)
            if idle is None:
                break
            del self._views[idle]
        return views

    async def _finish(self, part: "_Part", before: asyncio.Task | None) -> bool:
        # A partition's batches are recorded one after another, in log order; True once recorded.
        try:
            if before is not None:
                await asyncio.wait([before])
                if before.cancelled() or before.exception() is not None or not before.result():
                    return False
            tasks = [part.embedded, *part.chains, *part.extracted.values()]
            await asyncio.wait(tasks)
            # A refused extraction is its turn's chain's to settle (the episode alone).
            failed = [e for t in tasks if not t.cancelled() and (e := t.exception()) is not None
                      and not isinstance(e, ModelRefused)]
            if failed:
                self._fail(failed[0])
            if (failed or any(t.cancelled() for t in tasks) or not all(t.result() for t in part.chains)
                    or self._failed is not None or part.epoch != self._epoch):
                return False
            decisions = [(part.turns[i][0], d) for i in range(len(part.turns)) for d in part.made[i]]
            letters = part.letters + [(part.turns[i][0], self.name, why) for i, why in sorted(part.refused.items())]
            # Shielded: once producing, a batch is finished even when what is in flight is abandoned.
            recording = asyncio.ensure_future(
                retried("formation", lambda: self._record(part.records, decisions, letters)))
            self._recording.add(recording)
            recording.add_done_callback(self._recording.discard)
            # Said once recorded, even across an abandon (whose caller then acknowledges nothing).
            recording.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or part.recorded())
            await asyncio.shield(recording)
            if part.epoch != self._epoch:
                return True  # abandoned meanwhile: the bookkeeping below was cleared with it
            for user in part.users:
                self._unfinished[user] -= 1
                if not self._unfinished[user]:
                    del self._unfinished[user]
                if self._tails.get(user, _NO_TAIL).part is part:
                    del self._tails[user]
            self._in_flight -= len(part.records)
            self._timed(time.perf_counter() - part.started)
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
            return False
        finally:
            async with self._room:
                self._room.notify_all()

    async def _record(self, records: list[Record], decisions: list[tuple[Record, Decision]], letters: list) -> None:
        """Produce a part's decisions, dead letters and position (idempotent: retried whole), all
        under a claim of the partition's position (``positions.claim``): a part whose first record
        the position has passed was formed and recorded by another worker too (the partition's
        next owner: this one was dropped from its group without its knowing), on views this one
        never saw, so this one records nothing and stops."""
        if not self._record_position:
            return await self._produce(records, decisions, letters)
        firsts = first_offsets(records)
        async with self._positions.acquire() as conn, conn.transaction():
            for (topic, partition), at in (await pos.claim(conn, self.name, firsts)).items():
                if at > firsts[topic, partition]:
                    raise pos.PositionMoved(f"{self.name}'s position on {topic}/{partition} is at {at}, past "
                                            f"{firsts[topic, partition]}: another worker recorded it")
            await _busy(conn, self._produce(records, decisions, letters))
            await pos.save(conn, self.name, next_offsets(records))

    async def _produce(self, records: list[Record], decisions: list[tuple[Record, Decision]], letters: list) -> None:
        decisions = decisions + nothing_decided(records, decisions)
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
                    await self._sealer.destroy(d.user_id, d.generation)
        if self._barrier is not None:
            for m, d in zip(metas, sent):
                self._barrier.produced(m.partition, m.offset + 1, d.user_id)
        await self._dead.send(letters)
        self._dead.observe(len(records) - len(letters))

    async def decide(self, turns: list[tuple[Record, Event]], view: FactView | None = None,
                     graph: GraphView | None = None, letters: list | None = None) -> list[tuple[Record, Decision]]:
        """Every decision for ``turns``, in order: each turn's fact and edge decisions, then its
        ``EpisodeRecorded``. Facts are decided against ``view`` and edges against ``graph``
        (default: the projections under an overlay of this batch's decisions). A command about a
        user's memory becomes its decisions in its place; one naming what its user does not hold
        goes to ``letters`` as ``(record, stage, reason)``, as does a turn whose one extraction
        call (``turn_extractor``) the model refuses (its episode alone). Nothing is retried here,
        and a refusal later in a turn is raised: the shared view has no forks to drop its
        half-made decisions from."""
        if not turns:
            return []
        embedding, where = self._episodes(turns)
        embedded = asyncio.ensure_future(embedding)
        overlay = view if view is not None else PostgresView(self._pool, self._embedder.model_id)
        graph = graph if graph is not None else GraphView(self._load_graph)
        made: list[list[Decision]] = [[] for _ in turns]
        refused: dict[int, str] = {}

        async def in_order(indices: list[int]) -> None:
            # One user's turns and commands, each after the one before: it sees their decisions.
            for i in indices:
                r, event = turns[i]
                made[i], why = await self._form(r, event, overlay, graph, embedded, where.get(i))
                if why is not None:
                    refused[i] = why

        # Users are independent (per-user order is the only order formation owes): their turns
        # wait on the model side by side. The decisions leave in the batch's order all the same.
        try:
            await _together(*(in_order(indices) for indices in _by_user(turns).values()))
        finally:
            if not embedded.done():
                embedded.cancel()
            elif not embedded.cancelled():
                embedded.exception()  # retrieved: a failed embedding fails the turns that needed it
        if letters is not None:
            letters += [(turns[i][0], self.name, why) for i, why in sorted(refused.items())]
        return [(turns[i][0], d) for i in range(len(turns)) for d in made[i]]

    async def _form(self, r: Record, event: Event, overlay: FactView, graph: GraphView, embedded: asyncio.Future,
                    n: int | None, extracted: asyncio.Future | None = None) -> tuple[list[Decision], str | None]:
        """One turn's or command's decisions, applied to ``overlay`` and ``graph``; and why a
        command was refused (it makes none) or a turn given up (its episode alone). ``extracted``:
        the turn's extraction, if asked for already."""
        if isinstance(event, TurnRecorded):
            return await self._turn(r, event, embedded, n, overlay, graph, extracted)
        try:
            made = await self._command(r, event, overlay, graph)
        except CommandRefused as exc:
            log.warning("%s at %s refused: %s", type(event).__name__, r.where, exc)
            return [], InputRefused(exc)
        for d in made:
            overlay.apply(d)
            graph.apply(d)
        return made, None

    async def _turn(self, r: Record, turn: TurnRecorded, embedded: asyncio.Future, n: int, overlay: FactView,
                    graph: GraphView, extracted: asyncio.Future | None = None) -> tuple[list[Decision], str | None]:
        """A turn's fact and edge decisions (the two pipelines side by side), then its episode;
        or, if the model refuses its one extraction call, its episode alone and why; or nothing,
        if the user forgot this turn (it is on the log again: a retried letter, a host's retry)."""
        if await self._was_forgotten(turn):
            return [], None
        if self._turn_extractor is not None:
            try:
                found = await (extracted or self._llm(self._turn_extractor.extract_turn, turn))
            except ModelRefused as exc:  # nothing decided yet: ``decide`` (no forks) can give it up too
                return self._given_up(r, turn, (await embedded)[n], exc)
            facts, edges = await _together(self._facts(r, turn, overlay, list(found.facts)),
                                           self._edges(r, turn, graph, list(found.relations)))
        else:
            facts, edges = await _together(self._facts(r, turn, overlay), self._edges(r, turn, graph))
        relations = slot_edges.touched([*facts, *edges], overlay, graph, turn.user_id)
        # A turn formed again (its decisions sent, or some of them, before a crash) follows its own
        # facts' slots too: what it decided is in the view, not in ``facts``, and its slot edges may
        # not have been sent.
        relations |= {x for f in _own_facts(overlay, turn) if (x := relation_of(f.attribute)) is not None}
        if relations:
            model = (self._turn_extractor or self._extractor).model_id
            edges += await self._follow(r, turn, overlay, graph, relations, extractor=model)
        # Last: a projection that has applied a turn's episode has seen all of its decisions.
        return [*facts, *edges, self._episode(r, turn, (await embedded)[n])], None

    async def _follow(self, r: Record, event: Event, overlay: FactView, graph: GraphView, relations: set[str], *,
                      extractor: str, why: str | None = None, forgot: tuple | None = None) -> list[Decision]:
        """The graph decisions that make the user's edges of ``relations`` say what their facts
        say (``slot_edges``), with their sentences embedded."""
        ctx = GraphContext(turn=event, extractor=extractor, why=why, common=dict(
            source_event_id=event.event_id, source=LogPosition(r.topic, r.partition, r.offset),
            recorded_at=r.timestamp, user_id=event.user_id))
        decider = EdgeDecider(ctx, graph, prefix="slot-")
        await slot_edges.follow(decider, overlay, relations, forgot=forgot)
        sentences = decider.sentences()
        vectors = dict(zip(sentences, (to_bytes(v) for v in await self._embed_facts(sentences)))) if sentences else {}
        return decider.finish(vectors, self._embedder.model_id)

    def _forgot_turns(self, user_id: str, turns) -> None:
        held = self._forgotten_turns.setdefault(user_id, set())
        self._forgotten_n -= len(held)
        held.update(turns)
        self._forgotten_n += len(held)
        self._forgotten_turns.move_to_end(user_id)
        while self._pool is not None and len(self._forgotten_turns) > 1 and self._forgotten_n > FORGOTTEN_KEPT:
            self._forgotten_n -= len(self._forgotten_turns.popitem(last=False)[1])

    async def _was_forgotten(self, turn: TurnRecorded) -> bool:
        if turn.event_id in self._forgotten_turns.get(turn.user_id, ()):
            return True
        if self._pool is None:  # a reform: every forget before this turn was formed here
            return False
        return await self._pool.fetchval(
            "SELECT EXISTS (SELECT FROM forgotten_episodes WHERE user_id = $1 AND episode_id = $2)",
            turn.user_id, episodes.episode_id(turn.event_id))

    def _given_up(self, r: Record, turn: TurnRecorded, vector: Embedded, exc: ModelRefused
                  ) -> tuple[list[Decision], str]:
        # One user's turn the model will not answer must not hold up the partition: its episode
        # is kept (it needs no model), the turn dead-lettered to be formed again.
        log.warning("the model refused turn %s at %s: %s", turn.event_id, r.where, exc)
        return [self._episode(r, turn, vector)], f"its episode recorded without facts or relations: {exc}"

    def _episode(self, r: Record, turn: TurnRecorded, embedded: Embedded) -> EpisodeRecorded:
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
            metadata=turn.metadata, embedding=to_bytes(vector), embedding_model=self._embedder.model_id,
            passages=[Passage(start=a + lead, end=b + lead, embedding=to_bytes(v)) for a, b, v in passages])

    async def _llm(self, call, *args):
        client = id(getattr(call, "__self__", call))  # the extractor and the resolver may be two services
        async with self._slots.slot(_RANK.get()):
            try:
                answer = await call(*args)
            except ModelUnavailable as exc:
                exc.client = client  # whose service failed (``_retried``)
                raise
        self._answered_at[client] = time.monotonic()
        return answer

    async def _extract(self, turn: TurnRecorded, rank: int, epoch: int):
        _RANK.set(rank)  # this task's own context
        return await self._retried(f"extraction of {turn.event_id}", epoch,
                                   lambda: self._llm(self._turn_extractor.extract_turn, turn))

    async def _retried(self, what: str, epoch: int, attempt_once):
        """``retried``, for work of ``epoch``: given up at the next attempt once abandoned. The
        cancel can be lost: cancelled as a model call fails, a task group (or a client) raises
        the call's error instead, and it would be retried. The ``model_attempts``-th call left
        ``Unanswered`` is raised as ``ModelRefused``; so is the ``model_attempts``-th failure of a
        model's service (``ModelUnavailable``) if that service answered other calls since this
        work's first failure: it fails this turn, not everyone's (an outage waits, however long, and the
        partition with it; one turn must not hold up the others for good)."""
        unanswered, unavailable, failing_since = 0, 0, None

        async def once():
            nonlocal unanswered, unavailable, failing_since
            if epoch != self._epoch:
                raise asyncio.CancelledError
            try:
                return await attempt_once()
            except Unanswered as exc:
                unanswered += 1
                if epoch != self._epoch:  # abandoned as it failed: nothing of it is to be recorded
                    raise asyncio.CancelledError from exc
                if unanswered >= self._model_attempts:
                    raise ModelRefused(f"no usable answer of the model in {unanswered} attempts: {exc}") from exc
                raise
            except ModelUnavailable as exc:
                unavailable += 1
                failing_since = failing_since or time.monotonic()
                if epoch != self._epoch:
                    raise asyncio.CancelledError from exc
                if (unavailable >= self._model_attempts
                        and self._answered_at.get(getattr(exc, "client", None), 0.0) > failing_since):
                    raise ModelRefused(f"the model's service failed this turn {unavailable} times while it "
                                       f"answered others: {exc}") from exc
                raise

        return await retried(what, once)

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
            # Explicit and the user's own word: it passes the safety gate by construction. A
            # correction says the old value was never true, not that it stopped being true: the
            # new version holds from the old one's start, which ends where it began (system
            # time still shows what was believed until the correction).
            updated = FactUpdated(**common, decision_id=fid, extractor=f"control:{e.actor}",
                                  resolver=f"control:{e.actor}", confidence=1.0, explicit=True, fact_id=fid, text=text,
                                  category=old.category, attribute=old.attribute, value=e.value,
                                  valid_from=old.valid_from, embedding=to_bytes(vector),
                                  embedding_model=self._embedder.model_id, supersedes=old.fact_id,
                                  reason=f"corrected{why}")
            overlay.apply(updated)
            # The edge stating the same slot is corrected in the same step: one truth.
            relations = {relation_of(old.attribute)} - {None}
            return [updated, *await self._follow(r, e, overlay, graph, relations, extractor=f"control:{e.actor}",
                                                 why=f"corrected{why}")]
        forget = dict(**common, actor=e.actor, reason=e.reason)
        if isinstance(e, FactForgotten):
            await overlay.ensure(e.user_id, [e.fact_id])
            row = overlay.rows.get((e.user_id, e.fact_id))

            def named(f) -> bool:  # the slot and value the command names, when it names them
                return e.attribute is None or (f.attribute == e.attribute
                                               and (e.value or "").casefold() == f.value.casefold())

            if row is not None and row.current and named(row):
                targets = [row.fact_id]
            else:
                # Re-formed with another extractor, the fact may have another id, and its id be
                # another fact's: the same slot and value.
                targets = sorted(f.fact_id for f in overlay.rows.values() if f.user_id == e.user_id and f.current
                                 and e.attribute is not None and named(f))
                if not targets:
                    raise CommandRefused(f"FactForgotten names {e.fact_id}, not a current fact of this user")
            # Earlier versions of the fact saying the same value go too (a correction that kept the
            # value, a slot said again): the value, not one version of it, is what is forgotten.
            for t in list(targets):
                f = overlay.rows[e.user_id, t]
                targets += [v.fact_id for v in await overlay.slot(e.user_id, [f.attribute])
                            if v.lineage_id == f.lineage_id and v.fact_id not in targets and v.status != "forgotten"
                            and v.value.casefold() == f.value.casefold()]
            made: list[Decision] = [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten:{n}"),
                                                    kind="fact", target=t) for n, t in enumerate(targets)]
            rows = [overlay.rows[e.user_id, t] for t in targets]
            for d in made:
                overlay.apply(d)
            # The edges stating it go with it, and so do the turns it was read from (their other
            # facts and edges stay, noted), unless the caller keeps them.
            made += await self._follow(r, e, overlay, graph, {relation_of(f.attribute) for f in rows} - {None},
                                       extractor=f"control:{e.actor}", why=f"forgotten{why}",
                                       forgot=(e.actor, e.reason, [f.value for f in rows]))
            if not e.keep_episodes:
                turns = list(dict.fromkeys(t for f in rows for t in (f.source_event_id, *f.observed_in)))
                self._forgot_turns(e.user_id, turns)
                made += [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-turn:{n}"),
                                         kind="episode", target=t, keep_derived=True) for n, t in enumerate(turns)]
            return made
        if isinstance(e, EdgeForgotten):
            await graph.ensure_user(e.user_id)
            edge = graph.rows.get((e.user_id, e.edge_id))
            if isinstance(edge, EdgeRow) and _says(graph, edge, e):
                targets = [e.edge_id]
            else:  # re-formed with another extractor: the same relation between the same ends
                targets = sorted(x.edge_id for x in graph.of(e.user_id).values() if isinstance(x, EdgeRow)
                                 and not x.forgotten and e.relation is not None
                                 and _says(graph, x, e))
                if not targets:
                    raise CommandRefused(f"EdgeForgotten names {e.edge_id}, not an edge of this user")
            made = [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten" if n == 0 else
                                                                     f"forgotten:{n}"), kind="edge", target=t)
                    for n, t in enumerate(targets)]
            # The facts stating the same relationship of the user go with it, and any other edge
            # of theirs: one truth.
            for d in made:
                graph.apply(d)
            said = await self._facts_of_edges(overlay, graph, e.user_id, targets)
            made += [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-fact:{n}"),
                                     kind="fact", target=f.fact_id) for n, f in enumerate(said)]
            for d in made[len(targets):]:
                overlay.apply(d)
            return made + await self._follow(r, e, overlay, graph, {relation_of(f.attribute) for f in said} - {None},
                                             extractor=f"control:{e.actor}", why=f"forgotten{why}",
                                             forgot=(e.actor, e.reason, [f.value for f in said]))
        if isinstance(e, EpisodeForgotten):
            self._forgot_turns(e.user_id, [e.turn_event_id])
            # The turn goes; what it alone said goes with it, decided here one by one rather than
            # by the projections' episode rule (``keep_derived``): a fact another turn said again
            # stays, noted, and so does the user's edge stating it — one truth.
            await overlay.ensure(e.user_id, facts_core.turn_decisions(e.turn_event_id))
            await graph.ensure_user(e.user_id)
            user = slot_edges.user_entity_id(e.user_id)
            alone = [f for fid in facts_core.turn_decisions(e.turn_event_id)
                     if (f := overlay.rows.get((e.user_id, fid))) is not None and f.status != "forgotten"
                     and f.source_event_id == e.turn_event_id and f.observation_count == 1]
            edges = sorted((x for x in graph.of(e.user_id).values() if isinstance(x, EdgeRow) and not x.forgotten
                            and x.source_event_id == e.turn_event_id), key=lambda x: x.edge_id)
            slots = {x.relation for x in edges if x.source_entity_id == user and attributes_of(x.relation)}
            made: list[Decision] = [
                MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten"), kind="episode",
                                target=e.turn_event_id, keep_derived=True),
                *(MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-fact:{n}"), kind="fact",
                                  target=f.fact_id) for n, f in enumerate(alone)),
                *(MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-edge:{n}"), kind="edge",
                                  target=x.edge_id)
                  for n, x in enumerate(x for x in edges if not (x.source_entity_id == user and x.relation in slots)))]
            for d in made:
                overlay.apply(d)
                graph.apply(d)
            relations = ({relation_of(f.attribute) for f in alone} | slots) - {None}
            return made + await self._follow(r, e, overlay, graph, relations, extractor=f"control:{e.actor}",
                                             why=f"forgotten{why}", forgot=(e.actor, e.reason, [f.value for f in alone]))
        if isinstance(e, UserForgotten):
            self._fact_vectors.clear()  # fact texts, some of them theirs
            self._forgotten_n -= len(self._forgotten_turns.pop(e.user_id, ()))
            return [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten"), kind="user",
                                    generation=await self._sealer.stamp(e))]
        return []

    @staticmethod
    async def _facts_of_edges(overlay: FactView, graph: GraphView, user_id: str, edge_ids) -> list:
        """The user's fact versions (not forgotten) of the slot and value these edges of the user
        state, believed while the edge was."""
        user, out = slot_edges.user_entity_id(user_id), {}
        for edge_id in edge_ids:
            edge = graph.rows.get((user_id, edge_id))
            if not isinstance(edge, EdgeRow) or edge.source_entity_id != user:
                continue
            names = slot_edges.target_names(graph, edge)
            out.update((f.fact_id, f) for f in await overlay.slot(user_id, attributes_of(edge.relation))
                       if f.status != "forgotten" and f.value.casefold() in names and slot_edges.overlap(f, edge))
        return list(out.values())

    @staticmethod
    async def _current_fact(overlay: FactView, user_id: str, fact_id: uuid.UUID, e: Event):
        await overlay.ensure(user_id, [fact_id])
        row = overlay.rows.get((user_id, fact_id))
        if row is None or not row.current:
            raise CommandRefused(f"{type(e).__name__} names {fact_id}, not a current fact of this user")
        return row

    async def _load_graph(self, user_id: str):
        async with self._pool.acquire() as conn:
            return await graph_store.load_user(conn, user_id)

    async def _edges(self, r: Record, turn: TurnRecorded, graph: GraphView, candidates=None) -> list[Decision]:
        if candidates is None:
            if self._relations is None:
                return []
            candidates = list(await self._llm(self._relations.extract, turn))
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
            decider.add(c)
        sentences = decider.sentences()
        vectors = dict(zip(sentences, (to_bytes(v) for v in await self._embed_facts(sentences)))) if sentences else {}
        decisions = decider.finish(vectors, self._embedder.model_id)
        for d in decisions:
            log.debug("%s for user %s: %s [event %s]", type(d).__name__,
                      turn.user_id, getattr(d, "fact_sentence", None) or d.reason, turn.event_id)
        # The view saw the edges without vectors; it only needs ids, targets and intervals.
        return decisions

    async def _embed_facts(self, texts: list[str], keep: int = 10_000) -> list[np.ndarray]:
        # Held here across the wait: other users' turns may evict from the cache, or clear it.
        have = {t: self._fact_vectors[t] for t in dict.fromkeys(texts) if t in self._fact_vectors}
        missing = [t for t in dict.fromkeys(texts) if t not in have]
        if missing:
            have.update(zip(missing, await asyncio.to_thread(self._embedder.embed, missing)))
        for t, vec in have.items():
            self._fact_vectors[t] = vec
            self._fact_vectors.move_to_end(t)
        while len(self._fact_vectors) > keep:
            self._fact_vectors.popitem(last=False)
        return [have[t] for t in texts]

    async def _facts(self, r: Record, turn: TurnRecorded, overlay, candidates=None) -> list[Decision]:
        if candidates is None:
            candidates = list(await self._llm(self._extractor.extract, turn))
            model = self._extractor.model_id
        else:
            model = self._turn_extractor.model_id
        if not candidates:
            return []
        if len(candidates) > facts_core.MAX_CANDIDATES:  # the rest would have ids a forget cannot name
            log.info("turn %s: %d candidate facts, the first %d decided", turn.event_id,
                     len(candidates), facts_core.MAX_CANDIDATES)
            candidates = candidates[:facts_core.MAX_CANDIDATES]
        vectors = await self._embed_facts([c.text for c in candidates])
        ctx = Context(turn=turn, source=LogPosition(r.topic, r.partition, r.offset), recorded_at=r.timestamp,
                      extractor=model, resolver=self._resolver.model_id,
                      embedding_model=self._embedder.model_id, gate_observations=self._gate_observations)
        shown = [await overlay.neighbours(turn.user_id, c.attribute, v) for c, v in zip(candidates, vectors)]
        # The turn's own fact ids too: a turn formed again (a crash before its position was saved,
        # a host's retry) must not decide again what its facts' rows already hold.
        own = [facts_core.fact_id(turn.event_id, n) for n in range(len(candidates))]
        await overlay.ensure(turn.user_id, {*own, *(nb.fact_id for nbs in shown for nb in nbs)})
        # One resolution call for the candidates no earlier one of this turn bears on (another
        # slot, other neighbours, far in meaning): the facts held before the turn are the ones
        # they would be weighed against after the earlier candidates, too. The others are
        # resolved one by one, each against the facts as the candidates before it left them.
        alone = {n for n in range(len(candidates)) if not any(_bears_on(m, n, candidates, shown, vectors)
                                                               for m in range(n))}
        batched = [n for n in sorted(alone) if _related(candidates[n], shown[n])]
        answers = dict(zip(batched, await self._llm(self._resolver.resolve_all, [(candidates[n], shown[n])
                                                                                 for n in batched])
                           if batched else []))
        out: list[Decision] = []
        for n, (cand, vector) in enumerate(zip(candidates, vectors)):
            if (turn.user_id, own[n]) in overlay.rows:
                continue  # decided when the turn was formed before
            if n in alone:  # less what this turn ended since (unrelated to it: nothing to weigh)
                neighbours = [nb for nb in shown[n]
                              if (row := overlay.rows.get((turn.user_id, nb.fact_id))) is None or row.current]
                resolution = answers.get(n, NEW)
            else:
                neighbours = await overlay.neighbours(turn.user_id, cand.attribute, vector)
                await overlay.ensure(turn.user_id, [nb.fact_id for nb in neighbours])
                resolution = (await self._llm(self._resolver.resolve, cand, neighbours)
                              if _related(cand, neighbours) else NEW)
            decision = decide(ctx, n, cand, vector, resolution, neighbours, overlay.rows)
            _log(turn, cand, resolution, decision)
            if decision is not None:
                overlay.apply(decision)
                out.append(decision)
        return out


_RANK: contextvars.ContextVar[int] = contextvars.ContextVar("rank", default=0)  # of the turn a call is for
FORGOTTEN_KEPT = 100_000  # forgotten turns held in memory (beyond, Postgres answers: the barrier passed them)
VIEWS_KEPT = 2_000  # users whose views formation keeps between their turns (a dropped one is read afresh)


RECORDING_GRACE_S = 30.0  # a revoke waits this long for batches being recorded, then the worker stops
VIEW_ROWS = 1_000  # a user's fact view past this many rows, or graph view grown by as many, is read afresh


class _Views:
    """One user's facts and graph as formation has decided them so far."""

    def __init__(self, facts: FactView, graph: GraphView):
        self.facts, self.graph = facts, graph
        self.settle = False  # read afresh once what they overlay is recorded and applied


class _Tail(NamedTuple):
    """A user's last chain, and the part it is in."""
    chain: asyncio.Task
    part: "_Part"


_NO_TAIL = _Tail(None, None)


class _Part:
    """One partition's records of an started batch, in flight."""

    def __init__(self, records: list[Record], turns: list[tuple[Record, Event]], letters: list,
                 recorded: Callable[[], None], epoch: int):
        self.records, self.turns, self.letters, self.recorded, self.epoch = records, turns, letters, recorded, epoch
        self.finish: asyncio.Task
        self.made: list[list[Decision]] = [[] for _ in turns]
        self.refused: dict[int, str] = {}
        self.chains: list[asyncio.Task] = []
        self.users: list[str] = []
        self.embedded: asyncio.Future
        self.where: dict[int, int] = {}
        self.extracted: dict[int, asyncio.Task] = {}  # turn index -> its extraction, asked for when the batch starts
        self.ranks: dict[int, int] = {}  # turn index -> its place among the turns started
        self.started = time.perf_counter()


NEW = Resolution(Operation.ADD, None, "new fact")
RELATED = 0.5  # cosine from which a fact of another slot may still be the same fact in other words


def _own_facts(overlay: FactView, turn: TurnRecorded) -> list:
    """The facts the view holds that ``turn`` created (when it was formed before)."""
    return [f for fid in facts_core.turn_decisions(turn.event_id) if (f := overlay.rows.get((turn.user_id, fid)))]


def _related(cand, neighbours) -> bool:
    """Whether a resolver has anything to weigh ``cand`` against: a fact of its slot, or one near
    it in meaning. Without one it cannot update, delete or repeat a fact: it is new."""
    return any(nb.attribute == cand.attribute or nb.similarity >= RELATED for nb in neighbours)


def _bears_on(m: int, n: int, candidates, shown, vectors) -> bool:
    """Whether candidate ``m``'s decision can change what candidate ``n`` is weighed against: the
    same slot, a fact related to both (one ``m`` may update, delete or repeat), or a fact near
    ``n`` in meaning that ``m`` may add. Facts unrelated to ``n`` weigh nothing in its decision."""
    def related(k):
        return {nb.fact_id for nb in shown[k] if nb.attribute == candidates[k].attribute or nb.similarity >= RELATED}

    return (candidates[m].attribute == candidates[n].attribute or not related(m).isdisjoint(related(n))
            or float(vectors[m] @ vectors[n]) >= RELATED)


def _retrieved(future: asyncio.Future) -> None:
    # A shared ask's outcome is its waiters' to see; with none left it must not warn unretrieved.
    future.cancelled() or future.exception()


def _says(graph: GraphView, edge: EdgeRow, forget: EdgeForgotten) -> bool:
    """Whether ``edge`` is the relationship ``forget`` names, by what it says (when it says)."""
    if forget.relation is None:
        return True

    def named(entity_id, value, name) -> bool:  # an entity by its name or an alias, else the value
        entity = graph.rows.get((edge.user_id, entity_id)) if entity_id is not None else None
        said = (name or "").casefold()
        return said in entity.names() if isinstance(entity, EntityRow) else said == (value or "").casefold()

    return (edge.relation == forget.relation and named(edge.source_entity_id, None, forget.source)
            and named(edge.target_entity_id, edge.target_value, forget.target))


async def _busy(conn: asyncpg.Connection, work: Awaitable) -> None:
    """``await work``, keeping ``conn``'s transaction from looking idle meanwhile: a claim's bound
    (``positions.CLAIM_IDLE_S``) is for a holder that stopped answering, not one waiting on Kafka."""
    task = asyncio.ensure_future(work)
    try:
        while not (await asyncio.wait([task], timeout=pos.CLAIM_IDLE_S / 3))[0]:
            await conn.execute("SELECT 1")
        task.result()
    finally:
        task.cancel()  # nothing once done


def _by_user(turns: list[tuple[Record, Event]]) -> dict[str, list[int]]:
    """Each user's turns and commands (indices into ``turns``), in order."""
    users: dict[str, list[int]] = {}
    for i, (_, event) in enumerate(turns):
        users.setdefault(event.user_id, []).append(i)
    return users


async def _together(*coroutines) -> list:
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
