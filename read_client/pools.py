"""The read client's two Postgres pools: one planning every statement for its parameters, one
of kept connections whose generic plans are made when they open."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

import asyncpg

from memstream.projections import db
from memstream.projections.commands import query as commands_q
from memstream.projections.episodes import query as episodes_q
from memstream.projections.facts import query as facts_q
from memstream.projections.redaction import refusal
from memstream.read_settings import READ_DEADLINE_S

log = logging.getLogger("memstream.read")


async def connect_pools(dsn: str, schema: str, deadline_s: float = READ_DEADLINE_S) -> tuple[asyncpg.Pool, asyncpg.Pool]:
    """``(pool, text_pool)`` as ``MemoryReader`` takes them, for reads of deadline ``deadline_s``."""
    # Bounded on the client as well (a server that stops answering never sends its statement
    # timeout), past the read's deadline: that one cuts a read's statements short first, and
    # drops their connections rather than wait for the cancel (``lanes``).
    bounded = {"command_timeout_s": deadline_s + 1.0, "connect_timeout_s": 5.0}
    # A read has a latency budget: a statement stuck behind a lock fails its channel, not the read.
    pool = await db.create_pool(dsn, schema, min_size=2, max_size=8, statement_timeout_ms=1000, **bounded)
    # Fixed size and planned at connect: a new connection's first keyword statements take long
    # to plan, which no read should wait for.
    try:
        text_pool = await db.create_pool(dsn, schema, min_size=8, max_size=8, statement_timeout_ms=1000,
                                         generic_plans=True, prepare=prepare_text_lane, **bounded)
    except BaseException:
        await pool.close()
        raise
    return pool, text_pool


async def close_pools(pool: asyncpg.Pool, text_pool: asyncpg.Pool) -> None:
    """Both of a reader's pools (a reader given one pool for both closes it once)."""
    await pool.close()
    if text_pool is not pool:
        await text_pool.close()


async def prepare_text_lane(conn: asyncpg.Connection) -> None:
    """Runs the text lane's statements once on a new ``text_pool`` connection (``create_pool``'s
    ``prepare``): with generic plans each is planned at its first execution, the keyword ones
    over every partition (slow), and a read should not be that first execution. Best
    effort: a statement that cannot be planned now (its table locked, say) is left to the
    first read that runs it, and the connection is used all the same."""
    statements = [("facts keyword", facts_q.keyword, "", "memory", 1),
                  ("episodes keyword", episodes_q.keyword, "", "memory", 1),
                  ("person identity", commands_q.person_identity, ""),
                  ("due reminders", commands_q.due_reminders, "", datetime.now(timezone.utc)),
                  ("expert identity", commands_q.expert_identity, ""),
                  ("adjacent turns", episodes_q.neighbours, "", []),
                  ("recent turns", episodes_q.recent, "", "", 1)]
    await conn.execute("SET lock_timeout = '50ms'")
    try:
        for name, fn, *args in statements:
            try:
                await fn(conn, *args)
            except asyncpg.PostgresError as exc:
                log.info("%s not planned ahead on a new connection: %s", name, refusal(exc))
    finally:
        await conn.execute("RESET lock_timeout")
