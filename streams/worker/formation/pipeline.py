"""The formation step: each turn becomes an ``EpisodeRecorded`` decision (its embedding) and
fact and edge decisions (``turn``); each request about a user's memory (a correction, a forget), its decisions (``control``).

Formation for a turn must see every earlier decision for the same user, even when the facts
projection lags. Two mechanisms give that:

* an **overlay**: a user's turns are decided one after another on the user's views, the
  projections' rows under the decisions made since, folded with the projections' own pure cores;
  the views are carried from batch to batch while the projections may not hold what they overlay;
* a **barrier** (``barrier``), for a user without carried views.

This module is the pipeline (``start``: docs/architecture.md, "Formation is a pipeline"): it
schedules each user's turns in log order beside other users', retries model calls, and records
each partition's decisions, dead letters and position, in log order, under a claim of the position.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Awaitable, Callable, Sequence

import asyncpg

from memstream.embedding import Embedder, embed_with_passages
from memstream.llm.protocols import (ExtractionClient, ModelRefused, ModelUnavailable, ResolutionClient,
                                     TurnExtractionClient, Unanswered)
from memstream.llm.relations import RelationExtractionClient
from memstream.schemas import (Decision, Event, MemoryForgotten, TurnRecorded)
from memstream.schemas.errors import Retryable
from memstream.schemas.events import CONTROL_TYPES, passages_within
from memstream.streams.log.dead_letter import InputRefused
from memstream.streams.log.errors import BrokerUnavailable, retried
from memstream.streams.log.records import Record
from memstream.streams.log.screening import imported, screen
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.worker.formation.barrier import ProjectionBarrier
from memstream.streams.worker.formation.control import ControlRequests, RequestRefused
from memstream.streams.worker.formation.recording import Recorder
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.parts import NO_TAIL, Part, Tail, Views, by_user, pieces
from memstream.streams.worker.formation.turn import _RANK, TurnDecider, episode_text, together
from memstream.streams.worker.formation.views import FactView, MemoryView, PostgresView

log = logging.getLogger("memstream.formation")


def decode_turns(records: Sequence[Record], stage: str, partitions: int | None = None
                 ) -> tuple[list[tuple[Record, Event]], list]:
    """Turns, and requests about a user's memory (``CONTROL_TYPES``), to form in log order; and
    ``(record, stage, reason)`` for records that must be dead-lettered (``screening.screen``;
    ``partitions``: the events topic's partition count)."""
    events, letters = screen(records, stage, partitions)
    return [(r, e) for r, e in events if isinstance(e, (TurnRecorded, *CONTROL_TYPES)) and not imported(r)], letters


class Abandoned(Retryable):
    """Records given up before they were recorded (their partitions revoked): form them again."""


class Formation:
    """The formation step (a ``PipelinedStep``): events in, decisions out."""

    name = "formation"

    def __init__(self, *, producer, decisions_topic: str, embedder: Embedder, extractor: ExtractionClient,
                 resolver: ResolutionClient, dead_letters, pool: asyncpg.Pool, barrier: ProjectionBarrier | None,
                 relations: RelationExtractionClient | None = None, gate_observations: int = 3,
                 record_position: bool = True, partitions: int | None = None,
                 sealer: RecordSealer | None = None, ends_keys: bool = False, decided=None,
                 turn_extractor: TurnExtractionClient | None = None, concurrency: int = 16,
                 in_flight: int = 1024, on_fatal: Callable[[BaseException], None] | None = None,
                 timed: Callable[[float], None] | None = None, model_attempts: int = 5,
                 positions: asyncpg.Pool | None = None, reflector=None, episodes: asyncpg.Pool | None = None):
        """``positions``: the pool this formation's position is claimed and saved on, a connection
        held while a part is produced; apart from ``pool`` (the default) wherever producing reads
        or writes through ``pool`` (sealing with keys in the same database, a forget destroying
        its key), else claims waiting on ``pool`` while holding its connections could leave none.
        ``episodes``: where a reflection's turns are read (``pool`` if None: a reform has none)."""
        self._partitions = partitions
        self._model_attempts = model_attempts  # a turn's extraction, or resolution, asked at most this often
        self._turn_extractor = turn_extractor
        self.turns = TurnDecider(embedder=embedder, extractor=extractor, resolver=resolver, pool=pool,
                                 relations=relations, turn_extractor=turn_extractor,
                                 gate_observations=gate_observations, concurrency=concurrency)
        sealer = sealer or RecordSealer(None)
        self._embedder, self._barrier = embedder, barrier
        self.control = ControlRequests(self.turns, sealer, reflector, episodes)
        self._recorder = Recorder(name=self.name, producer=producer, decisions_topic=decisions_topic,
                                  dead_letters=dead_letters, positions=positions or pool, sealer=sealer,
                                  barrier=barrier, record_position=record_position, ends_keys=ends_keys,
                                  decided=decided)
        # The pipeline (``start``): records in flight, each user's last chain, each partition's
        # last finish, and the views of users whose decisions the projections may not hold yet.
        self._in_flight, self._max_in_flight = 0, in_flight
        self._room = asyncio.Condition()
        self._tails: dict[str, Tail] = {}
        self._finishing: dict[int, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._recording: set[asyncio.Future] = set()
        self._views: collections.OrderedDict[str, Views] = collections.OrderedDict()
        self._imported: dict[str, list[int]] = {}  # user -> offsets of their imported events not yet waited for
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
        user's turns and requests are formed in log order, each after the one before, beside
        other users' (a user's next batch does not wait for the rest of this one); a fatal error
        goes to ``on_fatal``."""
        self._raise_failed()
        turns, letters = decode_turns(records, self.name, self._partitions)
        for r in records:
            if imported(r) and r.key:
                self._imported.setdefault(r.key.decode(errors="replace"), []).append(r.offset)
        parts = [piece for p in dict.fromkeys(r.partition for r in records)
                 for piece in pieces([r for r in records if r.partition == p])]
        left = len(parts)

        def one_recorded() -> None:
            nonlocal left
            left -= 1
            if not left and recorded is not None:
                recorded()

        for piece in parts:
            held = {id(r) for r in piece}
            self._start(Part(piece, [(r, e) for r, e in turns if id(r) in held],
                             [x for x in letters if id(x[0]) in held], one_recorded, self._epoch))
        if not parts and recorded is not None:
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
        self._imported.clear()  # whoever forms these partitions next waits for all of them
        self._unfinished.clear()
        self.turns.clear()  # what it held of users this worker may no longer form
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

    def _start(self, part: Part) -> None:
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
        users = by_user(part.turns)
        p = part.records[0].partition
        part.finish = self._spawn(self._finish(part, self._finishing.get(p)))
        self._finishing[p] = part.finish
        part.finish.add_done_callback(lambda t: self._finishing.pop(p) if self._finishing.get(p) is t else None)
        for user, indices in users.items():
            self._unfinished[user] += 1
            before = self._tails.get(user)
            task = self._spawn(self._chain(part, user, indices, before))
            self._tails[user] = Tail(task, part)  # until the part is recorded
            part.chains.append(task)
        part.users = list(users)
        self._in_flight += len(part.records)

    def _episodes(self, turns: list[tuple[Record, Event]]) -> tuple[Awaitable[list], dict[int, int]]:
        """The embedding of ``turns``' episodes, to ask for at once (while the model is asked
        about their turns), and each turn's index in it."""
        said = [(i, t) for i, (_, t) in enumerate(turns) if isinstance(t, TurnRecorded)]
        texts = [episode_text(t) for _, t in said]
        embed = lambda: asyncio.to_thread(embed_with_passages, self._embedder, texts,  # noqa: E731
                                          passages_within(self._embedder.dim))
        return (retried("embedding episodes", embed) if said else asyncio.sleep(0, [])), {
            i: n for n, (i, _) in enumerate(said)}

    async def _chain(self, part: Part, user: str, indices: list[int], before: "Tail | None") -> bool:
        # One user's turns and requests of this batch, after their previous batch's; True once formed.
        if before is not None:
            await asyncio.wait([before.chain])
            if before.chain.cancelled() or before.chain.exception() is not None or not before.chain.result():
                return False  # abandoned, or fatal: its partition records nothing from here on
        if self._failed is not None or part.epoch != self._epoch:
            return False
        views = await self._views_for(part.records[0].partition, user, before, part.turns[indices[0]][0].offset)
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
                if isinstance(event, TurnRecorded):
                    part.made[i], why = self.turns.given_up(r, event, (await part.embedded)[part.where[i]], exc)
                else:  # a request (a reflection sweep's): it makes nothing, dead-lettered with why
                    log.warning("the model refused %s at %s: %s", type(event).__name__, r.where, exc)
                    part.made[i], why = [], f"the model refused it, nothing of it recorded: {exc}"
            if why is not None:
                part.refused[i] = why
            for d in part.made[i]:
                if isinstance(d, MemoryForgotten) and d.kind == "user":
                    # Nothing of theirs is left: the store's rows, until the forget is applied, would mislead.
                    views.facts, views.graph = MemoryView(self._embedder.model_id), GraphView(None)
                elif isinstance(d, MemoryForgotten) and d.kind == "episode":
                    views.settle = True  # what it forgot stays in the store until it is recorded and applied
        return True

    async def _views_for(self, partition: int, user: str, before: "Tail | None", first: int) -> Views:
        # ``first``: the offset of the chain's first turn. One after an import of the user's
        # (parts end at one) waits for what the import appended, and reads it afresh.
        views, since = self._views.pop(user, None), self._imported.get(user, [])
        if imported_ := any(at < first for at in since):
            if not (later := [at for at in since if at > first]):
                del self._imported[user]
            else:
                self._imported[user] = later
            if self._barrier is not None:
                await retried("formation's barrier", lambda: self._barrier.imported(partition, user))
        if views is not None and (imported_ or views.settle or len(views.facts.rows) > VIEW_ROWS
                                  or views.graph.grown > VIEW_ROWS):
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
            views = Views(PostgresView(self.turns.pool, self._embedder.model_id), GraphView(self.turns.load_graph))
        self._views[user] = views
        while len(self._views) > VIEWS_KEPT:  # the least recent that nothing in flight needs
            idle = next((u for u in self._views if not self._unfinished[u]), None)
            if idle is None:
                break
            del self._views[idle]
        return views

    async def _finish(self, part: Part, before: asyncio.Task | None) -> bool:
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
                retried("formation", lambda: self._recorder.record(part.records, decisions, letters)))
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
                if self._tails.get(user, NO_TAIL).part is part:
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


    async def decide(self, turns: list[tuple[Record, Event]], view: FactView | None = None,
                     graph: GraphView | None = None, letters: list | None = None) -> list[tuple[Record, Decision]]:
        """Every decision for ``turns``, in order: each turn's fact and edge decisions, then its
        ``EpisodeRecorded``. Facts are decided against ``view`` and edges against ``graph``
        (default: the projections under an overlay of this batch's decisions). A request about a
        user's memory becomes its decisions in its place; one naming what its user does not hold
        goes to ``letters`` as ``(record, stage, reason)``, as does a turn whose one extraction
        call (``turn_extractor``) the model refuses (its episode alone). Nothing is retried here,
        and a refusal later in a turn is raised: the shared view has no forks to drop its
        half-made decisions from."""
        if not turns:
            return []
        embedding, where = self._episodes(turns)
        embedded = asyncio.ensure_future(embedding)
        overlay = view if view is not None else PostgresView(self.turns.pool, self._embedder.model_id)
        graph = graph if graph is not None else GraphView(self.turns.load_graph)
        made: list[list[Decision]] = [[] for _ in turns]
        refused: dict[int, str] = {}

        async def in_order(indices: list[int]) -> None:
            # One user's turns and requests, each after the one before: it sees their decisions.
            for i in indices:
                r, event = turns[i]
                made[i], why = await self._form(r, event, overlay, graph, embedded, where.get(i))
                if why is not None:
                    refused[i] = why

        # Users are independent (per-user order is the only order formation owes): their turns
        # wait on the model side by side. The decisions leave in the batch's order all the same.
        try:
            await together(*(in_order(indices) for indices in by_user(turns).values()))
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
        """One turn's or request's decisions, applied to ``overlay`` and ``graph``; and why a
        request was refused (it makes none) or a turn given up (its episode alone). ``extracted``:
        the turn's extraction, if asked for already."""
        if isinstance(event, TurnRecorded):
            return await self.turns.form(r, event, embedded, n, overlay, graph, extracted)
        try:
            made = await self.control.decide(r, event, overlay, graph)
        except RequestRefused as exc:
            log.warning("%s at %s refused: %s", type(event).__name__, r.where, exc)
            return [], InputRefused(exc)
        for d in made:
            overlay.apply(d)
            graph.apply(d)
        return made, None

    async def _extract(self, turn: TurnRecorded, rank: int, epoch: int):
        _RANK.set(rank)  # this task's own context
        return await self._retried(f"extraction of {turn.event_id}", epoch,
                                   lambda: self.turns.ask(self._turn_extractor.extract_turn, turn))

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
                        and self.turns.answered_at.get(getattr(exc, "client", None), 0.0) > failing_since):
                    raise ModelRefused(f"the model's service failed this turn {unavailable} times while it "
                                       f"answered others: {exc}") from exc
                raise

        return await retried(what, once)


VIEWS_KEPT = 2_000  # users whose views formation keeps between their turns (a dropped one is read afresh)

RECORDING_GRACE_S = 30.0  # a revoke waits this long for batches being recorded, then the worker stops

VIEW_ROWS = 1_000  # a user's fact view past this many rows, or graph view grown by as many, is read afresh
