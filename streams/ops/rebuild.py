"""Fast rebuild of the episodes projection: load first, index after.

``replay`` applies decisions through the live projection's store, batch after batch, each
row paying for its HNSW, GIN and keyword-postings updates as it lands (BENCHMARKS.md,
"Rebuild"). A rebuild into a fresh schema needs none of that in between: this reads the whole
decisions topic (opening sealed records, folding episode forgets in log order in memory),
COPYs the surviving rows into the table with its vector and text indexes dropped and its
postings trigger off, writes the postings in one statement, then builds the indexes once
with a large ``maintenance_work_mem`` — the same rows, postings and positions a replay
writes (tested), in a fraction of the time. The other projections are rebuilt by ``replay``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass, field

import asyncpg
import numpy as np
from pgvector import Vector

from memstream.config import Settings
from memstream.embedding import dimensions_of
from memstream.projections import db
from memstream.projections import positions as pos
from memstream.projections.episodes import core as episodes
from memstream.projections.episodes.store import passage_records
from memstream.schemas import EpisodeRecorded, EpisodesSwept, InvalidEvent, MemoryForgotten, decode_decision
from memstream.keys import data_keys
from memstream.streams.log.kafka_util import drain, groupless_consumer
from memstream.streams.log.records import next_offsets
from memstream.streams.ops.replay import ReplayError, from_the_beginning, refuse_unfinished
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.worker import switch_lock

log = logging.getLogger("memstream.rebuild")

_COLUMNS = ["episode_id", "source_event_id", "user_id", "conversation_id", "occurred_at", "recorded_at",
            "source_partition", "source_offset", "user_message", "assistant_message", "metadata", "embedding",
            "embedding_model", "cooled_at"]
# Dropped for the load and built again after it, exactly as the migrations define them.
_DEFERRED = ("episodes_embedding_hnsw", "episodes_embedding_cold_hnsw", "episodes_tsv_gin",
             "episode_passages_embedding_hnsw", "episode_passages_embedding_cold_hnsw")
_PASSAGE_COLUMNS = ["user_id", "episode_id", "passage", "start_char", "end_char", "embedding", "embedding_model",
                    "cooled_at"]


@dataclass
class RebuildReport:
    schema: str
    topic: str
    records: int
    episodes: int
    shredded: int
    skipped: int
    seconds: dict[str, float] = field(default_factory=dict)  # per phase

    @property
    def total_s(self) -> float:
        return round(sum(self.seconds.values()), 2)

    def as_dict(self) -> dict:
        per_s = {phase: round(self.records / s, 1) if s else None for phase, s in self.seconds.items()}
        return {**asdict(self), "total_s": self.total_s, "records_per_s": per_s}

    def render(self) -> str:
        phases = ", ".join(f"{p} {s:.1f}s" for p, s in self.seconds.items())
        return (f"rebuilt episodes from {self.topic} into schema {self.schema}: {self.records} records -> "
                f"{self.episodes} episodes ({self.shredded} shredded, {self.skipped} skipped) in {self.total_s:.1f}s "
                f"({phases})")


def _storable(d: EpisodeRecorded, dimensions: int) -> bool:
    """Whether Postgres takes the episode (the live projection dead-letters one it refuses, and
    here one refused row would fail the whole COPY): text without NUL, and a vector of the
    column's dimensions."""
    texts = [d.user_id, d.conversation_id, d.user_message, d.assistant_message, d.embedding_model]
    texts += [str(x) for kv in (d.metadata or {}).items() for x in kv]
    return (len(d.embedding) == 4 * dimensions and all(len(p.embedding) == 4 * dimensions for p in d.passages)
            and not any("\x00" in t for t in texts))


class _Fold:
    """The episodes a replay would leave, folded from decisions in log order; ``dimensions``:
    the episodes' vector column's."""

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self.rows: dict[tuple[str, object], episodes.EpisodeRow] = {}
        self.by_user: dict[str, set] = {}
        self.covered: dict[tuple[str, int], int] = {}
        self.skipped = 0
        self.forgotten: dict[str, set] = {}  # user -> forgotten_episodes: their turns are not recorded again

    def add(self, r) -> None:
        if r.sealing is not None:
            self.skipped += not r.shredded
            return
        try:
            d = decode_decision(r.value or b"")
        except InvalidEvent:
            self.skipped += 1  # dead-lettered live
            return
        for key, mark in pos.events_covered([d]).items():
            self.covered[key] = max(self.covered.get(key, 0), mark)
        if isinstance(d, EpisodeRecorded):
            if not _storable(d, self.dimensions):
                self.skipped += 1  # dead-lettered live
                return
            row = episodes.apply(d)
            key = (row.user_id, row.episode_id)
            if key not in self.rows and key[1] not in self.forgotten.get(key[0], ()):  # the first one stays
                self.rows[key] = row
                self.by_user.setdefault(row.user_id, set()).add(key)
        elif isinstance(d, EpisodesSwept):
            for key in {(d.user_id, e) for e in (*d.cooled, *d.warmed)} & self.by_user.get(d.user_id, set()):
                self.rows[key] = episodes.swept(self.rows[key], d)
        elif isinstance(d, MemoryForgotten) and d.kind == "episode":
            key = (d.user_id, episodes.episode_id(d.target))
            self.rows.pop(key, None)
            self.by_user.get(d.user_id, set()).discard(key)
            self.forgotten.setdefault(d.user_id, set()).add(key[1])
        elif isinstance(d, MemoryForgotten) and d.kind == "user":
            for key in self.by_user.pop(d.user_id, set()):
                self.rows.pop(key, None)
            self.forgotten.pop(d.user_id, None)


async def _definitions(conn, index: str) -> tuple[str, list[tuple[str, str]]]:
    """``index`` on the partitioned table (as ``ON ONLY``: built empty, invalid until every
    partition's index is attached) and ``(name, definition)`` of each partition's index."""
    parent = await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                                 "AND indexname = $1", index)
    children = await conn.fetch(
        "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass($1) ORDER BY 1", index)
    return parent, [(r[0], r[1]) for r in children]


async def _build(dsn: str, schema: str, parent: str, children: list[tuple[str, str]], workers: int = 2) -> None:
    """The partitions' indexes on ``workers`` connections at once (Postgres builds a partitioned
    index one partition after another, and a partition of 3k rows gets no parallel workers), then
    attached to the parent: the same indexes, under the same names, as the migrations make."""
    queue = list(children)

    async def work() -> None:
        conn = await asyncpg.connect(dsn, server_settings={"search_path": f'"{schema}", public',
                                                           "maintenance_work_mem": "1GB",
                                                           "max_parallel_maintenance_workers": "0"})
        try:
            while queue:
                _, definition = queue.pop()
                await conn.execute(definition)
        finally:
            await conn.close()

    conn = await asyncpg.connect(dsn, server_settings={"search_path": f'"{schema}", public'})
    try:
        await conn.execute(parent)  # ON ONLY: the partitioned index, empty
        await asyncio.gather(*(work() for _ in range(workers)))
        index = parent.split()[2]
        for name, _ in children:
            await conn.execute(f'ALTER INDEX "{index}" ATTACH PARTITION "{name}"')
    finally:
        await conn.close()


def _record(row: episodes.EpisodeRow) -> tuple:
    return (row.episode_id, row.source_event_id, row.user_id, row.conversation_id, row.occurred_at, row.recorded_at,
            row.source_partition, row.source_offset, row.user_message, row.assistant_message,
            None if row.metadata is None else json.dumps(row.metadata, sort_keys=True),
            Vector(np.frombuffer(row.embedding, dtype="<f4")), row.embedding_model, row.cooled_at)


async def rebuild_episodes(settings: Settings, dsn: str, into: str, *, topic: str | None = None,
                           on_progress=None) -> RebuildReport:
    """Rebuild the episodes projection of ``topic`` (default: the live decisions topic) into the
    fresh schema ``into``; ``on_progress(done, total)`` is told the records read."""
    await refuse_unfinished(settings, dsn, topic)
    async with switch_lock.building(dsn, into):
        return await _rebuild_episodes(settings, dsn, into, topic, on_progress)


async def _rebuild_episodes(settings: Settings, dsn: str, into: str, topic: str | None, on_progress) -> RebuildReport:
    topic = topic or settings.decisions_topic
    if into in (settings.postgres_schema, settings.keys_schema):
        raise ReplayError("refusing to rebuild into the live schema or the key store's; pick a fresh one")
    on_progress = on_progress or (lambda done, total: None)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    await db.migrate(dsn, into, dimensions_of(settings))
    seconds["migrate"] = time.perf_counter() - t
    pool = await db.create_pool(dsn, into, max_size=2)
    try:
        if await pool.fetchval("SELECT count(*) FROM projection_positions WHERE projection = 'episodes'"):
            raise ReplayError(f"schema {into} already holds episodes positions; drop it first")
        sealer = RecordSealer(await data_keys(settings, pool))
        dimensions = await pool.fetchval("SELECT atttypmod FROM pg_attribute WHERE attrelid = 'episodes'::regclass "
                                         "AND attname = 'embedding'")
        fold, positions, done = _Fold(dimensions), {}, 0
        t = time.perf_counter()
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest", max_poll_records=5000,
                                      fetch_max_bytes=64 * 1024 * 1024,
                                      max_partition_fetch_bytes=16 * 1024 * 1024) as consumer:
            tps, high = await from_the_beginning(consumer, topic)
            total = sum(high.values())

            async def fold_in(batch) -> None:
                nonlocal done
                for r in await sealer.open(batch):
                    fold.add(r)
                for key, mark in next_offsets(batch).items():
                    positions[key] = max(positions.get(key, 0), mark)
                done += len(batch)
                on_progress(done, total)

            await drain(consumer, tps, high, fold_in)
        seconds["read"] = time.perf_counter() - t
        async with pool.acquire() as conn:
            deferred = {name: await _definitions(conn, name) for name in _DEFERRED}
            t = time.perf_counter()
            async with conn.transaction():
                for name in _DEFERRED:
                    await conn.execute(f"DROP INDEX {name}")
                await conn.execute("ALTER TABLE episodes DISABLE TRIGGER episodes_terms")
                await conn.copy_records_to_table("episodes", records=map(_record, fold.rows.values()), columns=_COLUMNS)
                await conn.copy_records_to_table("episode_passages", columns=_PASSAGE_COLUMNS,
                                                 records=passage_records(list(fold.rows.values())))
                await conn.copy_records_to_table("forgotten_episodes", records=[(u, e) for u, ids in fold.forgotten.items() for e in ids])
                seconds["copy"] = time.perf_counter() - t
                t = time.perf_counter()
                # What the trigger would have written, row by row (migration 0008), its primary
                # key built once after the rows rather than row by row.
                key = await conn.fetchval("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                                          "WHERE conname = 'episodes_terms_pkey' AND connamespace = current_schema()::regnamespace")
                await conn.execute("ALTER TABLE episodes_terms DROP CONSTRAINT episodes_terms_pkey")
                await conn.execute("INSERT INTO episodes_terms SELECT user_id, t, occurred_at, episode_id, length(tsv) - 1 "
                                   "FROM episodes, unnest(memstream_terms(tsv, user_id)) t")
                await conn.execute("SET LOCAL maintenance_work_mem = '1GB'")
                await conn.execute(f"ALTER TABLE episodes_terms ADD CONSTRAINT episodes_terms_pkey {key}")
                await conn.execute("ALTER TABLE episodes ENABLE TRIGGER episodes_terms")
                seconds["postings"] = time.perf_counter() - t
        for name, (parent, children) in deferred.items():
            t = time.perf_counter()
            await _build(dsn, into, parent, children)
            seconds[f"index {name}"] = time.perf_counter() - t
        async with pool.acquire() as conn:
            await pos.save(conn, "episodes", {**positions, **fold.covered})
            t = time.perf_counter()
            await conn.execute("ANALYZE episodes, episode_passages, episodes_terms")
            seconds["analyze"] = time.perf_counter() - t
    finally:
        await pool.close()
    report = RebuildReport(into, topic, done, len(fold.rows), sealer.shredded, fold.skipped,
                           {p: round(s, 2) for p, s in seconds.items()})
    log.info(report.render())
    return report
