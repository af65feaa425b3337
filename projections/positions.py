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
    """Another process applied or recorded a topic partition past the records this one is about to:
    it is not the partition's owner any more (its group dropped it without its knowing, after a
    pause longer than the session timeout). Neither passing nor a record's fault: the worker stops."""


# How long a claim outlives a writer that stops answering while it holds it (a process frozen
# mid-record): Postgres ends the session then, and the next owner's claim goes through.
CLAIM_IDLE_S = 30


async def claim(conn: asyncpg.Connection, projection: str, firsts: Positions, nexts: Positions | None = None) -> bool:
    """Lock ``projection``'s positions on the partitions of ``firsts`` until ``conn``'s
    transaction ends, or raise ``PositionMoved`` if one is already past its first offset (the
    first record about to be applied or recorded there) — but return True, with nothing to
    apply, where ``nexts`` (the positions after those records) is given and every position has
    reached it (a deterministic step's batch applied already: its own retry after a commit whose
    answer was lost, or a dropped worker's batch that its successor applied). What is written
    under the claim, before ``save`` moves the positions in the same transaction, is written by
    the partitions' one owner: a second writer's claim waits for the first's transaction to end,
    then finds the positions moved. The transaction must not wait on anything else holding
    ``conn``'s pool."""
    keys = sorted(firsts)  # locked in one order: two claimants never deadlock
    rows = await conn.fetch(
        """WITH bounded AS MATERIALIZED (SELECT set_config('idle_in_transaction_session_timeout', $4, true))
           INSERT INTO projection_positions (projection, topic, partition, next_offset)
           SELECT $1, k.topic, k.partition, 0 FROM unnest($2::text[], $3::int[]) AS k (topic, partition), bounded
           ORDER BY k.topic, k.partition
           ON CONFLICT (projection, topic, partition) DO UPDATE SET next_offset = projection_positions.next_offset
           RETURNING topic, partition, next_offset""",
        projection, [t for t, _ in keys], [p for _, p in keys], f"{CLAIM_IDLE_S}s")
    stored = {(r["topic"], r["partition"]): r["next_offset"] for r in rows}
    if nexts is not None and stored and all(stored[tp] >= nexts[tp] for tp in stored):
        return True
    for tp, at in stored.items():
        if at > firsts[tp]:
            raise PositionMoved(f"{projection}'s position on {tp[0]}/{tp[1]} is at {at}, past {firsts[tp]}: "
                                "another worker got there first (this one was dropped from its group)")
    return False


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
