"""Which Kafka topics hold the log now.

A deployment's settings name its first events and decisions topics. Growing the partition
count (``streams.ops.partition_growth``) moves the log to new topics and records the move here, in
the host-wide schema beside the data keys (``Settings.keys_schema``: state the log cannot
rebuild, since it says where the log is). Every process that touches the log — ``TurnLog``,
the workers, the CLI — follows the recorded moves from its settings' names to the live topics;
a worker whose topics were moved restarts itself on the new ones.

A move is ``copying`` (the old topics live, the new ones filling), then ``fenced`` (the old
topics refuse every write: their ``max.message.bytes`` is 0; appends wait), then ``moved``.
"""
from __future__ import annotations

import json

import asyncpg

from memstream.config import Settings
from memstream.projections.schema_names import check_schema_name


def _ddl(schema: str) -> str:
    return (f'CREATE SCHEMA IF NOT EXISTS "{schema}"; '
            f'CREATE TABLE IF NOT EXISTS "{schema}".log_moves ('
            "from_events text PRIMARY KEY, from_decisions text NOT NULL, "
            "to_events text NOT NULL UNIQUE, to_decisions text NOT NULL UNIQUE, "
            "from_partitions int NOT NULL, partitions int NOT NULL, "
            "state text NOT NULL CHECK (state IN ('copying', 'fenced', 'moved')), "
            "progress jsonb NOT NULL DEFAULT '{}', "
            "started_at timestamptz NOT NULL DEFAULT now(), fenced_at timestamptz, moved_at timestamptz); "
            # Where each identity command landed: the commands projection orders identity
            # statements by their offset on the events partition (projections.commands).
            f'CREATE TABLE IF NOT EXISTS "{schema}".log_moved_offsets ('
            "from_topic text NOT NULL, user_key bytea NOT NULL, old_offset bigint NOT NULL, "
            "new_partition int NOT NULL, new_offset bigint NOT NULL, PRIMARY KEY (from_topic, user_key, old_offset))")


async def create_tables(pool: asyncpg.Pool, settings: Settings) -> None:
    schema = check_schema_name(settings.keys_schema)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"memstream-log:{schema}")
        await conn.execute(_ddl(schema))


async def moves(conn, settings: Settings) -> list[asyncpg.Record]:
    """Every recorded move of the log (none if nothing was ever moved)."""
    schema = check_schema_name(settings.keys_schema)
    try:
        return await conn.fetch(f'SELECT * FROM "{schema}".log_moves ORDER BY started_at')
    except asyncpg.UndefinedTableError:
        return []


async def live_log(settings: Settings, conn) -> Settings:
    """``settings`` with the events and decisions topics the log lives in now, and the workers'
    consumer group for them (a new one per move: its offsets are committed at the cut-over, so
    workers resume there instead of reading the copied log to skip it)."""
    by_source = {m["from_events"]: m for m in await moves(conn, settings)}
    s = settings
    while (m := by_source.get(s.events_topic)) is not None and m["state"] == "moved":
        s = moved(s, m)
    return s


async def live_log_at(settings: Settings, dsn: str) -> Settings:
    """``live_log`` over a connection of its own to ``dsn``."""
    conn = await asyncpg.connect(dsn)
    try:
        found = await live_log(settings, conn)
    except BaseException:
        conn.terminate()  # given up on (a timeout, a cancel): a close would wait on the server again
        raise
    await conn.close()
    return found


def moved(settings: Settings, move) -> Settings:
    return settings.model_copy(update={"events_topic": move["to_events"], "decisions_topic": move["to_decisions"],
                                       "group_id": f"{settings.group_id}.p{move['partitions']}"})


async def move_from(settings: Settings, conn) -> asyncpg.Record | None:
    """The move recorded out of ``settings``' events topic, if any (in whatever state)."""
    return next((m for m in await moves(conn, settings) if m["from_events"] == settings.events_topic), None)


def progress(move: asyncpg.Record) -> dict:
    value = move["progress"]
    return json.loads(value) if isinstance(value, str) else dict(value or {})
