"""The lock a schema switch (``streams.ops.switch``) holds while it swaps the live schema.

Workers look at it every few seconds (``streams.worker.runtime``): while a switch holds it they restart
and wait on it before they start again, so none writes into the schema being swapped out; once
the switch commits they continue on the switched-in schema. Readers never take it."""
from __future__ import annotations

import contextlib
import logging
import time

import asyncpg

log = logging.getLogger("memstream.worker")


def _key(schema: str) -> str:
    return f"memstream-switch:{schema}"


async def hold(conn: asyncpg.Connection, schema: str) -> None:
    """Take the lock for the session of ``conn`` (released when it closes)."""
    await conn.execute("SELECT pg_advisory_lock(hashtext($1))", _key(schema))


async def switching(pool, schema: str) -> bool:
    """Whether a switch of ``schema`` is under way now."""
    async with pool.acquire() as conn:
        if await conn.fetchval("SELECT pg_try_advisory_lock_shared(hashtext($1))", _key(schema)):
            await conn.execute("SELECT pg_advisory_unlock_shared(hashtext($1))", _key(schema))
            return False
        return True


async def wait_for_switch(dsn: str, schema: str) -> None:
    """Return once no switch of ``schema`` is under way (at once if none is)."""
    conn = await asyncpg.connect(dsn)
    try:
        t = time.monotonic()
        if not await conn.fetchval("SELECT pg_try_advisory_lock_shared(hashtext($1))", _key(schema)):
            log.warning("a switch of schema %s is under way: waiting for it", schema)
            await conn.execute("SELECT pg_advisory_lock_shared(hashtext($1))", _key(schema))
            log.warning("the switch is done after %.1f s: starting on the switched-in schema", time.monotonic() - t)
        await conn.execute("SELECT pg_advisory_unlock_shared(hashtext($1))", _key(schema))
    finally:
        await conn.close()


def _building_key(schema: str) -> str:
    return f"memstream-build:{schema}"


@contextlib.asynccontextmanager
async def building(dsn: str, schema: str):
    """Held (shared: two replays may fill one schema) while a replay or rebuild writes ``schema``;
    a switch of it refuses meanwhile (its checks would pass a build that is not done)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock_shared(hashtext($1))", _building_key(schema))
        yield
    finally:
        await conn.close()


async def being_built(conn: asyncpg.Connection, schema: str) -> bool:
    """Whether a replay or rebuild is writing ``schema`` now."""
    if await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", _building_key(schema)):
        await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", _building_key(schema))
        return False
    return True
