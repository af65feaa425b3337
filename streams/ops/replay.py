"""Replay: rebuild projections from offset 0 of a decisions topic into a fresh schema.

The live projection keeps serving meanwhile. Replay reads the decisions topic only — never the
LLM, never the embedder — up to the high-water marks seen when it starts, opening sealed records
with the deployment's data keys (those of forgotten users are counted as shredded and skipped), through the same
``EpisodesProjection.process`` the worker uses, minus side effects that belong to the live
deployment (Tier 0 cache, dead-letter topic). Positions are written in the target schema, so a
worker pointed at it continues exactly where the replay stopped.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from aiokafka import TopicPartition

from memstream.config import Settings
from memstream.embedding import dimensions_of
from memstream.schemas.errors import MemstreamError
from memstream.projections import db
from memstream.keys import data_keys
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.log.dead_letter import DeadLetterSink
from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.log import reform_marks
from memstream.streams.worker import switch_lock
from memstream.streams.worker.projecting import CommandsProjection, EpisodesProjection, FactsProjection, GraphProjection

log = logging.getLogger("memstream.replay")


class ReplayError(MemstreamError, RuntimeError):
    """A replay that cannot start as asked (unknown projection, live or non-empty target schema)."""


class SkippedLetters(DeadLetterSink):
    """Replay's dead-letter sink: records that were dead-lettered live are skipped again,
    counted and logged, but not sent twice."""

    def __init__(self) -> None:
        self.count = 0

    def observe(self, n_ok: int) -> None:
        pass

    async def send(self, letters) -> None:
        for rec, stage, reason in letters:
            log.warning("replay skipped %s at %s", rec.where, stage)  # why: as the live letter says
            log.debug("why replay skipped %s at %s: %s", rec.where, stage, reason)
        self.count += len(letters)


PROJECTIONS = ("episodes", "facts", "graph", "commands")
_TABLES = {"episodes": "episodes", "facts": "memory_facts", "graph": "memory_edges", "commands": "reminders"}


@dataclass
class ReplayReport:
    projections: list[str]
    schema: str
    topic: str
    records: int
    rows: dict[str, int]
    skipped: int
    seconds: float
    high_water: dict[int, int]
    shredded: int = 0  # records sealed with a destroyed key (forgotten users): skipped, by design

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "records_per_s": round(self.records_per_s, 1)}

    def merge(self, other: ReplayReport) -> ReplayReport:
        return ReplayReport(self.projections + other.projections, self.schema, f"{self.topic}+{other.topic}",
                            self.records + other.records, {**self.rows, **other.rows}, self.skipped + other.skipped,
                            self.seconds + other.seconds, {**self.high_water, **{f"{other.topic}/{p}": o for p, o in other.high_water.items()}},
                            self.shredded + other.shredded)

    def render(self) -> str:
        return (f"replayed {'+'.join(self.projections)} from {self.topic} into schema {self.schema}: "
                f"{self.records} records -> rows {self.rows}, {self.skipped} skipped, {self.shredded} shredded, "
                f"{self.seconds:.2f}s "
                f"({self.records_per_s:.0f} records/s); high-water marks {self.high_water}")


async def replay_episodes(settings: Settings, dsn: str, into: str, **kw) -> ReplayReport:
    return await replay(settings, dsn, into, ["episodes"], **kw)


async def replay(settings: Settings, dsn: str, into: str, projections: list[str], *,
                 topic: str | None = None, batch_size: int = 500, on_progress=None) -> ReplayReport:
    """Rebuild ``projections`` from ``topic`` (default: the live decisions topic) into ``into``.
    ``on_progress(done, total)`` is told the records applied of each topic read, after each batch."""
    unknown = set(projections) - set(PROJECTIONS)
    if unknown:
        raise ReplayError(f"unknown projections {sorted(unknown)}; known: {PROJECTIONS}")
    if into == settings.postgres_schema:
        raise ReplayError("refusing to replay into the live schema; pick a fresh one")
    if into == settings.keys_schema:
        raise ReplayError("refusing to replay into the key store's schema; pick a fresh one")
    await refuse_unfinished(settings, dsn, topic)
    async with switch_lock.building(dsn, into):
        return await _replay_into(settings, dsn, into, projections, topic, batch_size, on_progress)


async def refuse_unfinished(settings: Settings, dsn: str, topic: str | None) -> None:
    """Refuses ``topic`` (a decisions version) when a reform into it never finished."""
    if not topic:
        return
    live = await db.create_pool(dsn, settings.postgres_schema, min_size=0, max_size=1)
    try:
        begun = await reform_marks.unfinished(live, settings.postgres_schema, topic)
    finally:
        await live.close()
    if begun is not None:
        raise ReplayError(f"topic {topic} holds what a reform started {begun.isoformat()} left unfinished: its "
                          "projections would miss whatever it never formed; run the reform again into a new topic")


async def _replay_into(settings: Settings, dsn: str, into: str, projections: list[str], topic: str | None,
                       batch_size: int, on_progress) -> ReplayReport:
    await db.migrate(dsn, into, dimensions_of(settings))
    pool = await db.create_pool(dsn, into, max_size=2)
    try:
        if await pool.fetchval("SELECT count(*) FROM projection_positions WHERE projection = ANY($1::text[])", projections):
            raise ReplayError(f"schema {into} already holds {'/'.join(projections)} positions; drop it first")
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest",
                                      max_poll_records=batch_size) as consumer:
            # Commands come from the events topic; every other projection from decisions.
            report = None
            groups = [(topic or settings.decisions_topic, [p for p in projections if p != "commands"]),
                      (settings.events_topic, [p for p in projections if p == "commands"])]
            keys = await data_keys(settings, pool)
            for source, names in groups:
                if names:
                    part = await _replay(settings, consumer, pool, into, names, source, RecordSealer(keys),
                                         on_progress or (lambda done, total: None))
                    report = part if report is None else report.merge(part)
            return report
    finally:
        await pool.close()


async def from_the_beginning(consumer, topic: str) -> tuple[list[TopicPartition], dict[TopicPartition, int]]:
    """Every partition of ``topic`` assigned at offset 0, and the high-water marks now."""
    tps = [TopicPartition(topic, p) for p in await partitions_of(consumer, topic)]
    if not tps:
        raise ReplayError(f"topic {topic} does not exist")
    consumer.assign(tps)
    high = await consumer.end_offsets(tps)
    await consumer.seek_to_beginning(*tps)
    return tps, high


def replay_steps(settings: Settings, pool, into: str, sink, names, events_partitions: int | None) -> list:
    """The live projections' steps ``names`` writing into schema ``into``, without the live
    deployment's side effects (Tier 0, the dead-letter topic: ``sink``)."""
    available = {
        "episodes": lambda: EpisodesProjection(pool=pool, redis=None, schema=into, dead_letters=sink,
                                               tier0_turns=settings.tier0_turns),
        "facts": lambda: FactsProjection(pool=pool, dead_letters=sink),
        "graph": lambda: GraphProjection(pool=pool, dead_letters=sink),
        "commands": lambda: CommandsProjection(pool=pool, dead_letters=sink, partitions=events_partitions),
    }
    return [available[name]() for name in names]


async def _replay(settings: Settings, consumer, pool, into: str, projections: list[str], topic: str,
                  sealer: RecordSealer, on_progress) -> ReplayReport:
    tps, high = await from_the_beginning(consumer, topic)
    sink = SkippedLetters()
    steps = replay_steps(settings, pool, into, sink, projections, len(tps))
    records = 0

    total = sum(high.values())

    async def apply(batch) -> None:
        nonlocal records
        batch = await sealer.open(batch)
        for step in steps:
            await step.process(batch)
        records += len(batch)
        on_progress(records, total)

    t0 = time.perf_counter()
    await drain(consumer, tps, high, apply)
    seconds = time.perf_counter() - t0
    rows = {name: await pool.fetchval(f"SELECT count(*) FROM {_TABLES[name]}") for name in projections}
    report = ReplayReport(projections, into, topic, records, rows, sink.count, seconds,
                          {tp.partition: off for tp, off in high.items()}, sealer.shredded)
    log.info(report.render())
    return report
