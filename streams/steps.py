"""The two processing steps of a worker, each a batch of records in, durable effects out.

Contract of ``Step.process(records)``: records arrive in partition order and already admitted
by the position gate. A successful return means every record's effect is durable (decisions or
dead letters acknowledged by Kafka, rows and positions committed in Postgres). A raise means
nothing may be assumed: the caller retries the same batch (transient errors) or stops the
process (anything else). Retrying is safe because every effect is idempotent.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import asyncpg

from memstream.embedding import Embedder, to_bytes
from memstream.projections import positions as pos
from memstream.projections import session_cache
from memstream.projections.episodes import core as episodes
from memstream.projections.episodes.store import EpisodeStore
from memstream.schemas import EpisodeRecorded, InvalidEvent, LogPosition, TurnRecorded, decode_decision, decode_event, encode
from memstream.streams.dead_letter import DeadLetters
from memstream.streams.records import Record

log = logging.getLogger("memstream.streams")


class Step(Protocol):
    name: str

    async def process(self, records: list[Record]) -> None: ...


def _next_offsets(records: list[Record]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for r in records:
        out[(r.topic, r.partition)] = max(out.get((r.topic, r.partition), 0), r.offset + 1)
    return out


def episode_text(turn: TurnRecorded) -> str:
    return f"{turn.user_message}\n{turn.assistant_message}".strip()


class Formation:
    """events -> decisions. Decides once what is not deterministic (here: the embedding) and
    records it, so projections and replays never recompute it."""

    name = "formation"

    def __init__(self, *, producer, decisions_topic: str, embedder: Embedder,
                 dead_letters: DeadLetters, pool: asyncpg.Pool):
        self._producer, self._topic, self._embedder = producer, decisions_topic, embedder
        self._dead, self._pool = dead_letters, pool

    async def process(self, records: list[Record]) -> None:
        turns: list[tuple[Record, TurnRecorded]] = []
        letters = []
        for r in records:
            try:
                event = decode_event(r.value or b"")
            except InvalidEvent as exc:
                letters.append((r, self.name, f"undecodable event: {exc}"))
                continue
            if r.key != event.user_id.encode():
                letters.append((r, self.name, "record key does not match user_id: per-user order is not guaranteed"))
                continue
            if isinstance(event, TurnRecorded):
                turns.append((r, event))
        vectors = await asyncio.to_thread(self._embedder.embed, [episode_text(t) for _, t in turns]) if turns else []
        futures = []
        for (r, turn), vector in zip(turns, vectors):
            decision = EpisodeRecorded(
                decision_id=episodes.episode_id(turn.event_id),
                source_event_id=turn.event_id,
                source=LogPosition(r.topic, r.partition, r.offset),
                recorded_at=r.timestamp,
                user_id=turn.user_id,
                conversation_id=turn.conversation_id,
                occurred_at=turn.occurred_at,
                user_message=turn.user_message,
                assistant_message=turn.assistant_message,
                metadata=turn.metadata,
                embedding=to_bytes(vector),
                embedding_model=self._embedder.model_id,
            )
            futures.append(await self._producer.send(self._topic, encode(decision), key=r.key))
        await asyncio.gather(*futures)
        await self._dead.send(letters)
        self._dead.observe(len(records) - len(letters))
        async with self._pool.acquire() as conn, conn.transaction():
            await pos.save(conn, self.name, _next_offsets(records))


class EpisodesProjection:
    """decisions -> episodes rows (Postgres) and Tier 0 turns (Redis)."""

    name = "episodes"

    def __init__(self, *, pool: asyncpg.Pool, redis, schema: str, events_topic: str,
                 dead_letters: DeadLetters, tier0_turns: int):
        self._pool, self._redis, self._schema = pool, redis, schema
        self._events_topic, self._dead, self._keep = events_topic, dead_letters, tier0_turns
        self._store = EpisodeStore()
        self._epoch: int | None = None

    async def process(self, records: list[Record]) -> None:
        rows, letters = [], []
        for r in records:
            try:
                decision = decode_decision(r.value or b"")
            except InvalidEvent as exc:
                letters.append((r, self.name, f"undecodable decision: {exc}"))
                continue
            if isinstance(decision, EpisodeRecorded):
                rows.append((r, episodes.apply(decision)))
        # Dead letters first: the position must not pass a record before its letter is durable.
        await self._dead.send(letters)
        self._dead.observe(len(records) - len(letters))
        async with self._pool.acquire() as conn:
            try:
                await self._store.apply_batch(conn, [row for _, row in rows], self._positions(records, rows))
            except asyncpg.PostgresError as exc:
                if not _refused_by_server(exc):
                    raise
                await self._apply_one_by_one(conn, records, rows, exc)
            if self._epoch is None:
                self._epoch = await conn.fetchval("SELECT epoch FROM projection_epochs WHERE projection = 'episodes'")
        if self._redis is None or not rows:
            return
        try:
            await session_cache.push_turns(self._redis, self._schema, self._epoch, (row for _, row in rows), self._keep)
        except Exception:  # a derived cache: the read path falls back to Postgres
            log.exception("tier 0 cache update failed for %d turns", len(rows))

    def _positions(self, records, rows) -> dict[tuple[str, int], int]:
        return {**_next_offsets(records), **episodes.source_watermarks([row for _, row in rows], self._events_topic)}

    async def _apply_one_by_one(self, conn, records, rows, batch_error) -> None:
        """A batch the database refused: isolate the record(s) at fault, dead-letter them with
        the database's reason, apply the rest."""
        log.warning("episodes batch refused (%s); applying record by record", batch_error)
        refused = []
        for r, row in rows:
            try:
                await self._store.apply_batch(conn, [row], self._positions([r], [(r, row)]))
            except asyncpg.PostgresError as exc:
                if not _refused_by_server(exc):
                    raise
                refused.append((r, self.name, f"database refused the row: {exc}"))
        if len(refused) == len(rows) > 1:
            raise batch_error  # every row fails alike: our bug or our schema, not bad records
        await self._dead.send(refused)
        await self._store.apply_batch(conn, [], _next_offsets(records))


def _refused_by_server(exc: asyncpg.PostgresError) -> bool:
    """The server rejected this data (data exception or constraint violation, SQLSTATE 22/23).
    Client-side encoding errors carry no severity: those are bugs, never a record's fault."""
    return getattr(exc, "severity", None) is not None and (exc.sqlstate or "")[:2] in ("22", "23")


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (
        asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
        asyncpg.TooManyConnectionsError, asyncpg.SerializationError, asyncpg.DeadlockDetectedError,
        asyncpg.QueryCanceledError, asyncpg.AdminShutdownError,
    ))
