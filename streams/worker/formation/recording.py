"""Recording a part of a batch: its decisions (sealed with their users' keys), its dead letters
and its position, all under a claim of the partition's position, retried whole (idempotent)."""
from __future__ import annotations

import asyncio
import uuid
from typing import Awaitable, Callable, Sequence

import asyncpg

from memstream.keys.data_keys import Shredded
from memstream.projections import positions as pos
from memstream.schemas import (SYSTEM_USER, Decision, EpisodeRecorded, InvalidEvent, LogPosition, NothingDecided,
                               decode_event)
from memstream.streams.log.records import Record, first_offsets, next_offsets
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.worker.formation.barrier import ProjectionBarrier
from memstream.streams.worker.formation.control import end_keys


class Recorder:
    """Where a formation's parts go: the decisions topic, the dead-letter topic, its positions."""

    def __init__(self, *, name: str, producer, decisions_topic: str, dead_letters, positions: asyncpg.Pool | None,
                 sealer: RecordSealer, barrier: ProjectionBarrier | None, record_position: bool = True,
                 ends_keys: bool = False, decided: Callable[[list[Decision]], None] | None = None):
        """``ends_keys``: destroy a forgotten user's data key once every decision before the forget
        is sealed (the live formation; a reform rebuilds after the fact). ``decided``: told every
        decision produced (metrics)."""
        self._name, self._producer, self._topic, self._dead = name, producer, decisions_topic, dead_letters
        self._positions, self._sealer, self._barrier = positions, sealer, barrier
        self._record_position, self._ends_keys = record_position, ends_keys
        self._decided = decided or (lambda decisions: None)

    async def record(self, records: list[Record], decisions: list[tuple[Record, Decision]], letters: list) -> None:
        """Produce a part's decisions, dead letters and position (idempotent: retried whole), all
        under a claim of the partition's position (``positions.claim``): a part whose first record
        the position has passed was formed and recorded by another worker too (the partition's
        next owner: this one was dropped from its group without its knowing), on views this one
        never saw, so this one records nothing and stops."""
        if not self._record_position:
            return await self._produce(records, decisions, letters)
        firsts = first_offsets(records)
        async with self._positions.acquire() as conn, conn.transaction():
            for (topic, partition), at in (await pos.claim(conn, self._name, firsts)).items():
                if at > firsts[topic, partition]:
                    raise pos.PositionMoved(f"{self._name}'s position on {topic}/{partition} is at {at}, past "
                                            f"{firsts[topic, partition]}: another worker recorded it")
            await _busy(conn, self._produce(records, decisions, letters))
            await pos.save(conn, self._name, next_offsets(records))

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
            await end_keys(self._sealer, decisions)
        if self._barrier is not None:
            for m, d in zip(metas, sent):
                self._barrier.produced(m.partition, m.offset + 1, d.user_id)
        await self._dead.send(letters)
        self._dead.observe(len(records) - len(letters))


def nothing_decided(records: Sequence[Record], made: Sequence[tuple[Record, Decision]]
                    ) -> list[tuple[Record, NothingDecided]]:
    """A ``NothingDecided`` for each partition whose last record in ``records`` is not a turn
    formed in ``made``, to be written after ``made``: without it the projections could not tell
    that a trailing record which is not a formed turn (a request, accepted or refused; a host
    record) or a dead letter left nothing to apply (their lag never cleared, and a read waiting
    ``after`` a correction or forget would wait out its timeout: positions count only episodes
    and these)."""
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

