"""The worker: Faust apps wired to our own decode / gate / step code.

Two roles, each its own Faust app, consumer group and process:

* ``formation`` (group ``<group_id>``): events -> decisions;
* ``projections`` (group ``<group_id>-projections``): decisions -> Postgres and Redis, and the
  ingress topic's plain records -> sealed onto the events topic (``streams.worker.ingress``).

They must not share a consumer: formation waits for the facts projection (its barrier), and a
Faust consumer stops delivering to every agent when one agent's buffer is full — one shared
consumer could deadlock under a backlog. ``memstream worker`` runs both roles as two child
processes; each role can also be run and scaled on its own.

Agents consume raw bytes, open the sealed ones (``streams.log.sealing``) and hand batches to
``Step.process`` through ``run_batch``, which
retries a ``Retryable`` error in place (other libraries' passing errors are translated into one
by ``streams.log.errors.as_retryable``) and *stops the process* on anything else: a Faust agent
that raises would acknowledge the batch, so raising is never an option. Formation is
pipelined: ``run_batch`` only starts its batches (``Formation.start``), which it records in
order later, retrying and stopping the process the same way; their events are acknowledged to
Faust once recorded, not when ``take_events`` moves on. Records a step cannot
apply (``Refused``) never reach it: the step dead-letters them and applies the rest.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

import faust
from faust.types import TP

from memstream.config import Settings
from memstream.embedding import embedder_for
from memstream.llm.clients import llm_clients
from memstream.projections import db, redis_client
from memstream.projections import positions as pos
from memstream.projections.redaction import redact_logs
from memstream.streams.log.dead_letter import DeadLetters
from memstream.streams.log.errors import retried
from memstream.streams.worker.position_gate import RESEEK_AFTER_S, PositionGate, align
from memstream.streams.log.producer import idempotent_producer
from memstream.streams.log.records import from_faust
from memstream.streams.worker.ingress import IngressSealing
from memstream.streams.worker.sweep_timers import sweep_on_timer
from memstream.streams.worker.metrics import ObservedLlm, TimedEmbedder, WorkerMetrics, tracer
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.log.topics import step_routes
from memstream.keys import data_keys
from memstream.streams.worker.formation.barrier import ProjectionBarrier
from memstream.streams.worker.formation.pipeline import Formation
from memstream.streams.log.kafka_util import groupless_consumer, partitions_of
from memstream.streams.worker.projecting import CommandsProjection, EpisodesProjection, FactsProjection, GraphProjection
from memstream.streams.worker.step import PipelinedStep, Step

log = logging.getLogger("memstream.worker")

EXIT_FATAL = 70
EXIT_PARTITIONS = 78  # EX_CONFIG: the deployment changed under the worker; restarting will not help
LAG_EVERY_S = 5.0


class Runtime:
    """Resources shared by the agents, created lazily on the worker's event loop."""

    def __init__(self, settings: Settings, dsn: str, role: str):
        self.settings, self.dsn, self.role = settings, dsn, role
        self.metrics = WorkerMetrics(usd_per_mtok=(settings.llm_usd_per_mtok_input, settings.llm_usd_per_mtok_output))
        self._lock = asyncio.Lock()
        self._shredded: dict[str, int] = {}
        self._plain: dict[str, int] = {}
        self.partitions: int | None = None
        self.steps: dict[str, tuple[Step, PositionGate]] = {}
        self._revocations = 0  # so far: a batch begun before the last one is not formation's any more
        self._revoked_generation: int | None = None  # the consumer generation revoked, until assigned again
        self.app: faust.App | None = None
        self.embedding_model: str | None = None  # formation's embedder, once ready

    async def ready(self) -> None:
        async with self._lock:
            if self.steps:
                return
            s = self.settings
            self.pool = await db.create_pool(self.dsn, s.postgres_schema, max_size=4)
            keys = await data_keys(s, self.pool)
            # One sealer per topic: each follows its own topic's order (a forget read on one
            # topic says nothing of where another topic stands).
            self.sealers = {t: RecordSealer(keys, seal=s.seal_records) for t in (s.events_topic, s.decisions_topic)}
            self.sealer = RecordSealer(keys, seal=s.seal_records)  # for what this role produces
            self.redis = redis_client.connect(s.redis_url, timeout_s=2)
            self.producer = idempotent_producer(s.kafka_bootstrap)
            await self.producer.start()
            dead = DeadLetters(self.producer, s.dead_letter_topic, s.max_dead_letters_per_1000,
                               counted=lambda stage: self.metrics.dead_letters.labels(stage).inc())
            steps: list[Step] = []
            self._offsets = groupless_consumer(s.kafka_bootstrap)
            self.offsets = await self._offsets.__aenter__()
            # A record on another partition than Kafka's default partitioner gives its user is
            # dead-lettered (screening): that needs the events topic's partition count.
            partitions = len(await partitions_of(self.offsets, s.events_topic)) or None
            self.partitions = self.sealers[s.events_topic].partitions = partitions
            if self.role == "formation":
                m = self.metrics
                embedder = TimedEmbedder(await asyncio.to_thread(embedder_for, s), m)
                self.embedding_model = embedder.model_id  # what a reflection sweep clusters by
                extractor, resolver, relations, turn = llm_clients(s)
                from memstream.llm.clients import reflection_client
                extractor, resolver, relations, turn = (
                    ObservedLlm(extractor, "extraction", ("extract",), m),
                    ObservedLlm(resolver, "resolution", ("resolve", "resolve_all"), m),
                    ObservedLlm(relations, "relations", ("extract",), m),
                    ObservedLlm(turn, "extraction", ("extract_turn",), m))  # the turn's one extraction call
                self.barrier = ProjectionBarrier(self.pool, s.decisions_topic, self._end_offset)
                steps.append(Formation(producer=self.producer, decisions_topic=s.decisions_topic,
                                       embedder=embedder, extractor=extractor, resolver=resolver,
                                       dead_letters=dead, pool=self.pool, barrier=self.barrier,
                                       # A connection per part being recorded (up to one a partition).
                                       positions=await db.create_pool(self.dsn, s.postgres_schema,
                                                                      max_size=min(16, partitions or 4)),
                                       relations=relations, gate_observations=s.gate_observations,
                                       partitions=partitions, sealer=self.sealer, ends_keys=True,
                                       decided=self.metrics.decided, turn_extractor=turn,
                                       concurrency=s.formation_concurrency, in_flight=s.formation_in_flight,
                                       model_attempts=s.formation_model_attempts,
                                       on_fatal=lambda exc: _fatal("formation", exc),
                                       reflector=ObservedLlm(reflection_client(s), "reflection", ("reflect",), m),
                                       timed=self.metrics.batch.labels("formation").observe))
                log.info("formation ready: embedder=%s extractor=%s resolver=%s",
                         embedder.model_id, extractor.model_id, resolver.model_id)
            else:
                steps.append(EpisodesProjection(pool=self.pool, redis=self.redis, schema=s.postgres_schema,
                                                dead_letters=dead, tier0_turns=s.tier0_turns,
                                                tier0_ttl_s=s.tier0_ttl_s))
                steps.append(FactsProjection(pool=self.pool, dead_letters=dead, redis=self.redis,
                                             schema=s.postgres_schema))
                steps.append(GraphProjection(pool=self.pool, dead_letters=dead))
                steps.append(CommandsProjection(pool=self.pool, dead_letters=dead, partitions=partitions))
                steps.append(IngressSealing(producer=self.producer, settings=s, sealer=self.sealer,
                                            dead_letters=dead, pool=self.pool))
            for step in steps:
                self.steps[step.name] = (step, PositionGate(step.name, self._loader(step.name), self._seek,
                                                            self._log_start, self._hold))
            log.info("%s ready: schema=%s", self.role, s.postgres_schema)

    async def _end_offset(self, partition: int) -> int:
        from aiokafka import TopicPartition

        tp = TopicPartition(self.settings.decisions_topic, partition)
        return (await self.offsets.end_offsets([tp]))[tp]

    def _loader(self, projection: str):
        async def load(topic: str) -> dict[int, int]:
            return await pos.load(self.pool, projection, topic)
        return load

    def _lowest(self, topic: str, partition: int, offset: int) -> int:
        """``offset``, or lower where another step on this consumer (its gate) expects less of
        the partition: one consumer serves them all, and a seek past one step's position would
        leave it records short."""
        behind = [at for _, gate in self.steps.values() if (at := gate.expecting(topic, partition)) is not None]
        return min([offset, *behind])

    async def _seek(self, topic: str, partition: int, offset: int) -> None:
        assert self.app is not None
        await self.app.consumer.seek(TP(topic, partition), self._lowest(topic, partition, offset))

    def _hold(self, topic: str, partition: int, offset: int) -> None:
        """Set Faust's read offset back as ``Consumer.seek`` does: records fetched before a seek,
        handed on after it, move it past the re-read ones, which it would drop."""
        assert self.app is not None
        offset = self._lowest(topic, partition, offset)
        self.app.consumer._read_offset[TP(topic, partition)] = offset if offset else None

    async def _log_start(self, topic: str, partition: int) -> int:
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, partition)
        return (await self.offsets.beginning_offsets([tp]))[tp]

    async def align(self, topics: dict[str, str]) -> None:
        """Once Faust has resumed the consumer at Kafka's committed offsets (it does so *after*
        signalling rebalance-complete), move every assigned partition back to what Postgres says
        was applied. ``topics`` maps topic -> step name."""
        assert self.app is not None
        await self.ready()
        consumer = self.app.consumer
        deadline = asyncio.get_running_loop().time() + 60
        while not consumer.flow_active and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assigned = [tp for tp in consumer.assignment() if tp.topic in topics]
        for topic, steps in topics.items():
            mine = [tp for tp in assigned if tp.topic == topic]
            if mine:
                positions = {tp.partition: await consumer.position(tp) for tp in mine}
                # One consumer serves every step of the topic: resume at the least advanced one.
                await align([self.steps[step][1] for step in steps], topic, positions, self._seek)

    async def check_partitions(self) -> None:
        """Stop the process if the events or decisions topic's partition count changed under it:
        Kafka's partitioner then sends a user's new records to another partition than their
        history, and per-user order — what every projection rests on — is gone for them."""
        if not self.steps or self.partitions is None:
            return
        s = self.settings
        await self.check_moved()
        await self.check_switch()
        try:
            now = {t: len(await partitions_of(self.offsets, t)) for t in (s.events_topic, s.decisions_topic)}
        except Exception:  # a broker between answers: the next check or rebalance sees it
            log.warning("could not check the topics' partition counts", exc_info=True)
            return
        if any(n and n != self.partitions for n in now.values()):  # 0: metadata not there yet
            log.critical(
                "the partition count changed under this worker: it started with %d partitions, the topics now have %s. "
                "Someone added partitions (kafka-topics --alter): users' new records may land on another partition "
                "than their history. Stop the producers, and see docs/operations.md, 'Partitions'.",
                self.partitions, now)
            logging.shutdown()
            os._exit(EXIT_PARTITIONS)

    async def check_moved(self) -> None:
        """Restart this process on the log's new topics once it moved (``streams.ops.partition_growth``):
        the old ones are fenced and every record of them applied; positions wait on the new ones."""
        from memstream.streams.log.log_topics import move_from

        try:
            move = await move_from(self.settings, self.pool)
        except Exception:
            log.warning("could not check whether the log moved", exc_info=True)
            return
        if move is not None and move["state"] == "moved":
            log.warning("the log moved from %s to %s (%d partitions): restarting on the new topics",
                        self.settings.events_topic, move["to_events"], move["partitions"])
            _restart(self.app)

    async def check_switch(self) -> None:
        """Restart if a switch of the live schema is under way (``streams.worker.switch_lock``): the
        restarted process waits for it, then goes on on the switched-in schema."""
        from memstream.streams.worker.switch_lock import switching

        try:
            now = await switching(self.pool, self.settings.postgres_schema)
        except Exception:
            log.warning("could not check for a schema switch", exc_info=True)
            return
        if now:
            log.warning("a switch of schema %s is under way: restarting, to go on on the switched-in one",
                        self.settings.postgres_schema)
            _restart(self.app)

    async def measure_lag(self, topics: dict[str, tuple[str, ...]]) -> None:
        """Each step's lag per partition of its topic, into the metrics: stored positions
        against the high-water marks."""
        from aiokafka import TopicPartition

        if not self.steps:
            return
        for topic, names in topics.items():
            tps = [TopicPartition(topic, p) for p in await partitions_of(self.offsets, topic)]
            ends = await self.offsets.end_offsets(tps)
            for name in names:
                stored = await pos.load(self.pool, name, topic)
                for tp, end in ends.items():
                    self.metrics.lag.labels(name, topic, str(tp.partition)).set(max(0, end - stored.get(tp.partition, 0)))

    def _acknowledger(self, events: Sequence, revocations: int) -> Callable[[], None]:
        """Acknowledges ``events`` to Faust when called, once their batch is recorded: so the
        group's committed offsets stay behind what Postgres holds, and after a rebalance the
        consumer resumes where the positions are, with no seeking back (``position_gate``)."""
        for e in events:
            e.message.incref()  # held past ``take_events``' own acknowledgement

        def acknowledge() -> None:
            if revocations == self._revocations:  # else its offsets are not this consumer's to commit
                for e in events:
                    e.ack()
        return acknowledge

    async def revoke(self, tps) -> None:
        """Partitions revoked: no batch opened before is started, what pipelined steps have in
        flight is given up (formed again from the stored positions, here or by the partitions'
        next owner), and what was cached of the partitions forgotten — before and after the
        batches being recorded finish (they tell the barrier what they produced)."""
        self._revocations += 1
        self._revoked_generation = self.app.consumer_generation_id  # Faust sets the next one on assignment
        self.forget(tps)
        for step, _ in self.steps.values():
            if isinstance(step, PipelinedStep):
                await step.abandon()
        self.forget(tps)

    def assigned(self) -> None:
        # Kafka may assign again under the revoked generation (a member rejoining a stable
        # group): its events are this consumer's. Any it was fed before this are sought back to.
        self._revoked_generation = None

    def forget(self, tps) -> None:
        for _, gate in self.steps.values():
            gate.forget([(tp.topic, tp.partition) for tp in tps])
        if self.role == "formation" and self.steps:
            self.barrier.forget([tp.partition for tp in tps if tp.topic == self.settings.events_topic])

    async def run_batch(self, names: Sequence[str], events: Sequence) -> None:
        """Hand the batch to each step of ``names`` (one topic's): the records each step's gate
        passes, opened once and in log order by that topic's sealer (a record the gates turn
        away is never opened, so a forget is never read ahead of the records before it)."""
        name, revocations = "opening", self._revocations
        # Faust checks an event's consumer generation when it buffers it, not when the buffer
        # is handed on: events of partitions revoked since are not this consumer's to apply —
        # nor, while a revoke is under way (no generation assigned yet), any event at all.
        generation = self.app.consumer_generation_id
        events = [e for e in events if e.message.generation_id == generation != self._revoked_generation]
        try:
            records = [from_faust(e) for e in events]
            passed = {n: await self.steps[n][1].filter(records) for n in names}
            wanted = {id(r) for mine in passed.values() for r in mine}
            opened: dict[int, object] = {}
            topic = records[0].topic if records else None
            if wanted and topic != self.settings.ingress_topic:  # ingress records are plain, sealed by their step
                order = [r for r in records if id(r) in wanted]
                done = await retried("opening", lambda: self.sealers[topic].open(order))
                opened = {id(r): o for r, o in zip(order, done)}
            if topic in self.sealers:
                sealer = self.sealers[topic]
                self.metrics.shredded.labels(topic).inc(sealer.shredded - self._shredded.get(topic, 0))
                self._shredded[topic] = sealer.shredded
                self.metrics.plain_records.labels(topic).inc(sealer.plain_records - self._plain.get(topic, 0))
                self._plain[topic] = sealer.plain_records
            for name in names:
                step = self.steps[name][0]
                if mine := [opened.get(id(r), r) for r in passed[name]]:
                    if isinstance(step, PipelinedStep):  # it times and records its batches itself
                        if revocations != self._revocations:
                            return  # partitions revoked while it was opened: formed from the positions again
                        with tracer.start_as_current_span(f"memstream.step.{name}.start",
                                                          attributes={"memstream.records": len(mine)}):
                            await step.start(mine, recorded=self._acknowledger(events, revocations))
                    else:
                        with self.metrics.batch.labels(name).time(), tracer.start_as_current_span(
                                f"memstream.step.{name}", attributes={"memstream.records": len(mine),
                                                                      "messaging.destination.name": topic}):
                            await retried(name, lambda: step.process(mine))
                    self.metrics.records.labels(name).inc(len(mine))
        except asyncio.CancelledError:
            raise
        except BaseException:
            # Not Retryable, or a Refused a step should have dead-lettered: our bug or a broken
            # deployment. Not acknowledging is the only safe move: exit before Faust's finally can ack.
            _fatal(name)


def _fatal(name: str, exc: BaseException | None = None) -> None:
    log.critical("%s: unrecoverable error; stopping the worker without acknowledging", name, exc_info=exc or True)
    logging.shutdown()
    os._exit(EXIT_FATAL)


ROLES = ("formation", "projections")


def create_app(settings: Settings, runtime: Runtime) -> faust.App:
    role = runtime.role
    datadir = Path(settings.home) / "faust"
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.group_id if role == "formation" else f"{settings.group_id}-projections",
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        # Faust makes "<datadir>/v1/tables" even for memory tables: under the memstream home, not the cwd.
        datadir=str(datadir / "{conf.name}"),
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=10,
        broker_heartbeat_interval=1,
        broker_commit_interval=1.0,
        topic_partitions=settings.partitions,
        producer_acks=-1,
        stream_wait_empty=False,
    )
    runtime.app = app
    raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    async def consume(names: tuple[str, ...], stream) -> None:
        await runtime.ready()
        async for batch in stream.take_events(settings.batch_size, within=settings.batch_seconds):
            await runtime.run_batch(names, batch)

    # Declare only this role's topics: Faust subscribes to every topic an app declares. The
    # projections role reads commands (reminders, identities) straight from the events topic.
    routes = step_routes(settings)[role]
    for name, step_names in routes.items():
        _agent(app, app.topic(name, **raw), step_names, consume)

    @app.timer(interval=LAG_EVERY_S)
    async def lag_into_metrics():
        await runtime.check_partitions()
        try:
            await runtime.measure_lag(routes)
        except Exception:  # a gauge, not the pipeline: try again next time
            log.warning("measuring lag for the metrics failed", exc_info=True)

    for kind, every in (("decay", settings.decay_sweep_every_s), ("reflection", settings.reflect_sweep_every_s)):
        if role == "formation" and every > 0:
            sweep_on_timer(app, runtime, kind, every)

    @app.timer(interval=RESEEK_AFTER_S)
    async def reseek_silent_partitions():
        def highwater(topic: str, partition: int) -> int | None:
            try:
                return app.consumer.highwater(TP(topic, partition)) if app.consumer.flow_active else None
            except Exception:  # not assigned here any more (a rebalance under way)
                return None

        for _, gate in list(runtime.steps.values()):
            await gate.reseek_silent()
            await gate.reseek_stalled(highwater)

    @app.on_partitions_revoked.connect
    async def on_revoked(sender, revoked, **kwargs):
        await runtime.revoke(revoked)  # every partition, at a rebalance (the eager protocol)

    @app.on_rebalance_complete.connect
    async def on_rebalance_complete(sender, **kwargs):
        task = asyncio.ensure_future(runtime.align(routes))
        task.add_done_callback(_fatal_on_failure)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender, assigned, **kwargs):
        runtime.assigned()
        await runtime.check_partitions()  # new partitions trigger a rebalance: see it at once
        # Nothing to forget: a revoke came first (eager rebalancing), and records may already
        # have been started meanwhile (Faust feeds the agents before this runs), still in flight.
        mine = sorted(f"{tp.topic}/{tp.partition}" for tp in assigned if tp.topic in routes)
        log.info("%s assigned partitions: %s", role, " ".join(mine) or "(none)")

    return app


def _agent(app: faust.App, topic, step_names: tuple[str, ...], consume) -> None:
    @app.agent(topic, name="-".join(step_names))
    async def agent(stream):
        await consume(step_names, stream)


def _restart(app: faust.App | None = None) -> None:
    """This process again, from the start (same arguments and environment): like a crash for
    everything in flight, which positions make safe, but with the topics and schema read anew."""
    if app is not None:
        _leave_group(app)
    logging.shutdown()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def _leave_group(app: faust.App, timeout_s: float = 5.0) -> None:
    """Tell the group this member is gone, so its partitions move at once rather than after the
    session timeout (what a switch or a move waits for). Blocking on purpose: nothing else of
    this process runs meanwhile, so nothing of it writes after its partitions have moved."""
    try:
        thread = app.consumer._thread  # Faust runs aiokafka's consumer on a loop of its own
        leave = thread._consumer._coordinator._maybe_leave_group()
        asyncio.run_coroutine_threadsafe(leave, thread.thread_loop).result(timeout_s)
    except Exception:  # the group then lets it go after the session timeout, as after a crash
        log.warning("could not leave the consumer group before restarting", exc_info=True)


def _fatal_on_failure(task: asyncio.Future) -> None:
    # Unaligned partitions could resume past unapplied records: stop rather than risk it.
    if not task.cancelled() and task.exception() is not None:
        log.critical("aligning partitions with stored positions failed; stopping", exc_info=task.exception())
        logging.shutdown()
        os._exit(EXIT_FATAL)


def run_worker(settings: Settings, dsn: str, role: str, loglevel: str = "INFO") -> None:
    """Run one role until SIGTERM/SIGINT. Topics must exist (``ensure_topics``)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {ROLES}")
    from memstream.streams.worker.switch_lock import wait_for_switch

    redact_logs()
    asyncio.run(wait_for_switch(dsn, settings.postgres_schema))
    runtime = Runtime(settings, dsn, role)
    if settings.metrics_port is not None:
        runtime.metrics.serve(settings.metrics_port + ROLES.index(role), settings.metrics_host)
    app = create_app(settings, runtime)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, override_logging=True)
    worker.execute_from_commandline()
