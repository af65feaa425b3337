"""The tracking table: how far each projection has applied each topic partition.

Rows are written in the same transaction as the projection rows they cover, so a crash can
never leave rows without their position or a position without its rows. ``next_offset`` only
moves forward (GREATEST), so a stale redelivery cannot rewind it."""
from __future__ import annotations

from typing import Mapping

import asyncpg

Positions = Mapping[tuple[str, int], int]  # (topic, partition) -> next offset to apply


async def load(conn: asyncpg.Connection | asyncpg.Pool, projection: str, topic: str) -> dict[int, int]:
    rows = await conn.fetch(
        "SELECT partition, next_offset FROM projection_positions WHERE projection = $1 AND topic = $2",
        projection, topic,
    )
    return {r["partition"]: r["next_offset"] for r in rows}


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
