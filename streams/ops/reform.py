"""``memstream reform``: re-run formation over the events log with another extractor, into a
separate decisions stream version (a topic of its own), leaving the live one untouched.

Decisions of events before ``--since`` are copied from the live decisions topic as they are;
events from ``--since`` on are formed again with the chosen extractor. Formation's view of
current facts lives in memory (the same pure core as the facts projection), so a backfill
needs no projection of its own. The new version is then rebuilt into a schema with
``memstream replay all --from-topic <topic> --into <schema>`` and compared or switched to.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.config import Settings
from memstream.llm.clients import llm_clients, reflection_client
from memstream.schemas.errors import MemstreamError, Refused
from memstream.embedding import embedder_for
from memstream.projections import db
from memstream.schemas import FactDecision, GraphDecision, InvalidEvent, decode_decision, decode_event
from memstream.keys import Shredded, data_keys
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.pipeline import Formation, decode_turns
from memstream.streams.worker.formation.recording import nothing_decided
from memstream.streams.worker.formation.views import MemoryView
from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.log import reform_marks
from memstream.streams.log.producer import idempotent_producer
from memstream.streams.log.records import Record
from memstream.streams.log.screening import imported
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.log.topics import FOREVER

log = logging.getLogger("memstream.reform")


class ReformError(MemstreamError, RuntimeError):
    """A reform that cannot start as asked (its topic is the live one, or already holds decisions)."""


@dataclass
class ReformReport:
    topic: str
    extractor: str
    copied_decisions: int
    reformed_events: int
    new_decisions: int
    skipped_events: int
    seconds: float
    shredded: int = 0  # records sealed with a destroyed key (forgotten users): skipped
    refused_events: int = 0  # requests naming what their user does not hold, turns the model refused (episode only)
    skipped_decisions: int = 0  # undecodable or refused by a projection, not copied (dead-lettered live)

    def as_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        return (f"reformed with {self.extractor} into {self.topic}: copied {self.copied_decisions} decisions, "
                f"formed {self.reformed_events} events -> {self.new_decisions} decisions "
                f"({self.skipped_events} undecodable skipped, {self.refused_events} refused, {self.shredded} shredded"
                f"{f', {self.skipped_decisions} undecodable or refused decisions not copied' if self.skipped_decisions else ''}) "
                f"in {self.seconds:.1f}s")


async def reform(settings: Settings, *, extractor: str, topic: str, since: datetime | None = None,
                 on_progress=None) -> ReformReport:
    """Form the events again into ``topic`` (``on_progress(done, total)``: events formed so far)."""
    on_progress = on_progress or (lambda done, total: None)
    chosen = settings.model_copy(update={"extractor": extractor})
    extraction, resolution, relations, turn = llm_clients(chosen)
    reflector = reflection_client(chosen)  # the reflection requests on the log are asked of it again
    embedder = await asyncio.to_thread(embedder_for, settings)
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    pool = await db.create_pool(settings.dsn(), settings.postgres_schema, min_size=0, max_size=2)
    t0 = time.perf_counter()
    try:
        sealer = RecordSealer(await data_keys(settings, pool), seal=settings.seal_records)
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest", max_poll_records=256) as c:
            partitions = await partitions_of(c, settings.events_topic)
            await _create_version_topic(settings, topic, len(partitions), c, pool)
            await reform_marks.started(pool, topic, extraction.model_id, since)
            events = [TopicPartition(settings.events_topic, p) for p in partitions]
            decisions = [TopicPartition(settings.decisions_topic, p) for p in partitions]
            c.assign(events + decisions)
            high = await c.end_offsets(events + decisions)
            start = {tp: 0 for tp in events}
            if since is not None:
                found = await c.offsets_for_times({tp: int(since.timestamp() * 1000) for tp in events})
                start = {tp: (found[tp].offset if found.get(tp) else high[tp]) for tp in events}
            async def start_of(tp: TopicPartition) -> int:
                # A decision copied by a move of the log names its event's place on the old topic.
                if tp not in start:
                    found = await c.offsets_for_times({tp: int(since.timestamp() * 1000)}) if since else {}
                    start[tp] = found[tp].offset if found.get(tp) else (await c.end_offsets([tp]))[tp] if since else 0
                return start[tp]

            view = MemoryView(embedder.model_id)
            graph = GraphView(None)
            counts = {"copied": 0, "events": 0, "new": 0, "skipped": 0, "refused": 0, "uncopied": 0}

            async def held(d) -> bool:
                """``d``, copied as it is, applied to the views formation decides on; False if a
                projection refused it live (it names what its user does not hold): so here."""
                try:
                    if isinstance(d, FactDecision):
                        view.apply(d)
                    elif isinstance(d, GraphDecision):
                        await graph.ensure_user(d.user_id)
                        graph.apply(d)
                except Refused:
                    counts["uncopied"] += 1
                    return False
                return True

            async def copy(batch: list[Record]) -> None:
                futures = []
                for r in await sealer.open(batch):
                    if r.sealing is not None:
                        continue  # shredded: a forgotten user's
                    try:
                        d = decode_decision(r.value or b"")
                    except InvalidEvent:  # dead-lettered live: no projection of this version takes it either
                        counts["uncopied"] += 1
                        continue
                    if d.source.offset >= await start_of(TopicPartition(d.source.topic, d.source.partition)):
                        continue  # formed again below
                    if not await held(d):
                        continue
                    # A decision written before sealing existed is sealed now; a sealed one is copied as it is.
                    value = r.sealed_value if r.sealed_value is not None else await sealer.seal(d)
                    futures.append(await producer.send(topic, value, key=r.key, partition=r.partition))
                await asyncio.gather(*futures)
                counts["copied"] += len(futures)

            formation = Formation(producer=producer, decisions_topic=topic, embedder=embedder, extractor=extraction,
                                  resolver=resolution, dead_letters=None, pool=None, barrier=None, relations=relations,
                                  sealer=sealer, turn_extractor=turn, concurrency=settings.formation_concurrency,
                                  reflector=reflector, episodes=pool)

            # An imported event is not formed: its decisions came with it, from the user's export.
            # Those of the events formed again below are copied in their place.
            came_with = await _imported_decisions(c, RecordSealer(sealer.keys), events, decisions, start, high)

            async def decided(segment: list[Record]) -> list[tuple[Record, object]]:
                turns, letters = decode_turns(segment, "reform", len(partitions))
                undecodable = len(letters)
                counts["skipped"] += undecodable
                made = await formation.decide(turns, view, graph, letters=letters)
                counts["refused"] += len(letters) - undecodable
                return made

            async def form(batch: list[Record]) -> None:
                batch = await sealer.open(batch)
                made, copied, segment = [], {}, []
                for r in [*batch, None]:
                    event_id = _imported_id(r)
                    if r is not None and event_id is None:
                        segment.append(r)
                        continue
                    made += await decided(segment) if segment else []
                    segment = []
                    for dr, d in came_with.pop(event_id, []):
                        if not await held(d):
                            continue
                        made.append((r, d))
                        copied[id(d)] = dr.sealed_value if dr.sealed_value is not None else await sealer.seal(d)
                made += nothing_decided(batch, made)
                counts["copied"] += len(copied)
                futures = []
                for r, d in made:
                    try:
                        value = copied.get(id(d)) or await sealer.seal(d, r.generation)
                    except Shredded:
                        continue  # the user was forgotten while this reform ran
                    futures.append(await producer.send(topic, value, key=r.key, partition=r.partition))
                await asyncio.gather(*futures)
                counts["events"] += len(batch)
                counts["new"] += len(made)
                on_progress(counts["events"], sum(high[tp] - start[tp] for tp in events))

            if since is not None:
                c.assign(decisions)
                await c.seek_to_beginning(*decisions)
                await drain(c, decisions, high, copy)
            c.assign(events)
            for tp in events:
                c.seek(tp, start[tp])
            await drain(c, events, high, form)
        report = ReformReport(topic, extraction.model_id, counts["copied"], counts["events"], counts["new"],
                              counts["skipped"], time.perf_counter() - t0, sealer.shredded, counts["refused"],
                              counts["uncopied"])
        await reform_marks.finished(pool, topic, report.as_dict())
    finally:
        await producer.stop()
        await pool.close()
    log.info(report.render())
    return report


def _imported_id(r: Record | None):
    """The event id of ``r`` if it is an imported event that opened, else None."""
    if r is None or r.sealing is not None or not imported(r):
        return None
    try:
        return decode_event(r.value or b"").event_id
    except InvalidEvent:
        return None  # dead-lettered, as live


async def _imported_decisions(c, sealer: RecordSealer, events: list[TopicPartition], decisions: list[TopicPartition],
                              start: dict, high: dict) -> dict:
    """The decisions on the live topic of the imported events from ``start`` on, by event id, in
    log order (opened by a ``sealer`` of their own: a forget met here says nothing of where the
    events being formed stand)."""
    ids: set = set()
    users: set[bytes] = set()  # their keys: only their decisions are opened

    async def note(batch: list[Record]) -> None:
        for r in await sealer.open([r for r in batch if imported(r)]):
            if (event_id := _imported_id(r)) is not None:  # else shredded, or dead-lettered live
                ids.add(event_id)
                users.add(r.key)

    c.assign(events)
    for tp in events:
        c.seek(tp, start[tp])
    await drain(c, events, high, note)
    held: dict = defaultdict(list)
    if not ids:
        return held

    async def keep(batch: list[Record]) -> None:
        for r in await sealer.open([r for r in batch if r.key in users]):
            try:
                d = decode_decision(r.value or b"")
            except InvalidEvent:
                continue
            if d.source_event_id in ids:
                held[d.source_event_id].append((r, d))

    c.assign(decisions)
    await c.seek_to_beginning(*decisions)
    await drain(c, decisions, high, keep)
    return held


async def _create_version_topic(settings: Settings, topic: str, partitions: int, consumer, pool) -> None:
    if topic in (settings.events_topic, settings.decisions_topic, settings.ingress_topic, settings.dead_letter_topic):
        raise ReformError(f"the new decisions version needs a topic of its own, not {topic} (one of the log's)")
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        if topic in set(await admin.list_topics()):
            tps = [TopicPartition(topic, p) for p in await partitions_of(consumer, topic)]
            if any((await consumer.end_offsets(tps)).values()):
                if (begun := await reform_marks.unfinished(pool, settings.postgres_schema, topic)) is not None:
                    raise ReformError(f"topic {topic} holds what a reform started {begun.isoformat()} left unfinished; "
                                      "delete the topic and run the reform again")
                raise ReformError(f"topic {topic} already holds decisions; pick a new version name")
        else:
            await admin.create_topics([NewTopic(topic, partitions, settings.replication_factor, topic_configs=FOREVER)])
    finally:
        await admin.close()
