"""The tracking table: how far each projection has applied each topic partition.

Rows are written in the same transaction as the projection rows they cover, so a crash can
never leave rows without their position or a position without its rows. ``next_offset`` only
moves forward (GREATEST), so a stale redelivery cannot rewind it."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import asyncpg

from memstream.schemas import Decision, EpisodeRecorded, NothingDecided

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
