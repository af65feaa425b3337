"""The tracking table: how far each projection has applied each topic partition.

Rows are written in the same transaction as the projection rows they cover, so a crash can
never leave rows without their position or a position without its rows. ``next_offset`` only
moves forward (GREATEST), so a stale redelivery cannot rewind it."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import asyncpg

from memstream.schemas import Decision, EpisodeRecorded, NothingDecided
from memstream.schemas.errors import MemstreamError

Positions = Mapping[tuple[str, int], int]  # (topic, partition) -> next offset to apply


async def load(conn: asyncpg.Connection | asyncpg.Pool, projection: str, topic: str) -> dict[int, int]:
    rows = await conn.fetch(
        "SELECT partition, next_offset FROM projection_positions WHERE projection = $1 AND topic = $2",
        projection, topic,
    )
    return {r["partition"]: r["next_offset"] for r in rows}


async def epoch(conn, projection: str) -> int:
    """The projection's epoch: part of every Redis key it writes, so caches of another build are never read."""
    return await conn.fetchval("SELECT epoch FROM projection_epochs WHERE projection = $1", projection)


async def applied_through(conn, projections: Sequence[str], topic: str, partition: int) -> int:
    """The next offset of ``topic``/``partition`` that some of ``projections`` has not applied
    (0 until each of them has a position there)."""
    return await conn.fetchval(
        "SELECT min(next_offset) FROM projection_positions WHERE projection = ANY($1::text[]) AND topic = $2 "
        "AND partition = $3 HAVING count(*) = cardinality($1::text[])", list(projections), topic, partition) or 0


async def save(conn: asyncpg.Connection, projection: str, positions: Positions) -> None:
    if not positions:
        return
    await conn.executemany(
        """INSERT INTO projection_positions (projection, topic, partition, next_offset)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (projection, topic, partition)
           DO UPDATE SET next_offset = GREATEST(projection_positions.next_offset, EXCLUDED.next_offset)""",
        [(projection, topic, partition, offset) for (topic, partition), offset in positions.items()],
    )


class PositionMoved(MemstreamError):
    """Another process recorded a topic partition past the records this one is about to: it is
    not the partition's owner any more (its group dropped it without its knowing, after a pause
    longer than the session timeout). Neither passing nor a record's fault: the worker stops."""


# How long a claim outlives a holder that stops answering (a process frozen while it holds one):
# Postgres ends the session then, and the next owner's claim goes through. A live holder that
# waits longer on something else keeps its transaction busy meanwhile (``Formation._record``).
CLAIM_IDLE_S = 30


async def claim(conn: asyncpg.Connection, projection: str,
                partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Lock ``projection``'s positions on ``partitions`` (``(topic, partition)``) until
    ``conn``'s transaction ends, and return them (0 where none was stored). Until then no other
    claimant of them writes: a second one's claim waits for the first's transaction to end, then
    finds the positions where the first left them. So what is written under a claim from the
    returned positions on, and ``save``d in the same transaction, is written once, in order —
    whichever worker the group thinks owns the partitions, even one it dropped without its knowing
    (a pause past the session timeout). A claimant must not wait on anything else holding
    ``conn``'s pool, and must keep its transaction busy while it waits longer than
    ``CLAIM_IDLE_S`` on anything: Postgres ends a claim idle that long."""
    keys = sorted(set(partitions))  # locked in one order: two claimants never deadlock
    rows = await conn.fetch(
        """WITH bounded AS MATERIALIZED (SELECT set_config('idle_in_transaction_session_timeout', $4, true))
           INSERT INTO projection_positions (projection, topic, partition, next_offset)
           SELECT $1, k.topic, k.partition, 0 FROM unnest($2::text[], $3::int[]) AS k (topic, partition), bounded
           ORDER BY k.topic, k.partition
           ON CONFLICT (projection, topic, partition) DO UPDATE SET next_offset = projection_positions.next_offset
           RETURNING topic, partition, next_offset""",
        projection, [t for t, _ in keys], [p for _, p in keys], f"{CLAIM_IDLE_S}s")
    return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}


def events_covered(decisions: Iterable[Decision]) -> dict[tuple[str, int], int]:
    """How far along the events topic these decisions take a projection of the decisions topic
    that has applied them: next offset per events partition. A turn's ``EpisodeRecorded`` and
    formation's ``NothingDecided`` are each the last decision made for the events up to their
    ``source``, so every projection (whatever kinds it applies) has then seen all decisions of
    those events. Read-your-writes and ``memstream status`` read these positions."""
    marks: dict[tuple[str, int], int] = {}
    for d in decisions:
        if isinstance(d, (EpisodeRecorded, NothingDecided)):
            key = (d.source.topic, d.source.partition)
            marks[key] = max(marks.get(key, 0), d.source.offset + 1)
    return marks
