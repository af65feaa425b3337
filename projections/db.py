"""Connections and migrations. Every connection runs with ``search_path = <schema>, public`` so
one set of SQL serves the live schema and any rebuild schema alike."""
from __future__ import annotations

import logging
from importlib import resources
from typing import Awaitable, Callable

import asyncpg
from pgvector.asyncpg import register_vector

from memstream.schemas.errors import MemstreamError

log = logging.getLogger("memstream.projections")


def quote(schema: str) -> str:
    # Schema names are validated by Settings (lower-case identifiers), quoting is belt and braces.
    return '"' + schema.replace('"', '""') + '"'


async def _init(conn: asyncpg.Connection) -> None:
    await register_vector(conn)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without asyncpg's default reset (RESET ALL, UNLISTEN, CLOSE ALL...): one round trip
    saved per acquire, which is most of a short read's. Safe because memstream sets session
    state only at connect (``server_settings``; a ``prepare`` hook restores what it sets) and
    everything else with ``SET LOCAL``; an open transaction is still rolled back by the pool."""


async def create_pool(dsn: str, schema: str, *, min_size: int = 1, max_size: int = 8,
                      statement_timeout_ms: int | None = None, generic_plans: bool = False,
                      prepare: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
                      command_timeout_s: float | None = None, connect_timeout_s: float = 60.0) -> asyncpg.Pool:
    """A pool bound to ``schema``; pgvector types registered; iterative HNSW scans on, so a
    per-user filter after the index scan still returns the k rows asked for (pgvector >= 0.8);
    custom plans per execution, so each user gets the plan that fits its row count — or, with
    ``generic_plans``, one plan per statement and connection, planned once, for statements whose
    best plan is the same for every user (the reader's text lane). ``prepare`` runs on every new
    connection, after the types are registered: e.g. to plan statements before any read needs them.
    With ``generic_plans`` idle connections are kept (their plans with them). ``command_timeout_s``
    bounds each call on the client (the statement timeout is the server's: a server that stops
    answering never sends it), ``connect_timeout_s`` each new connection."""
    settings = {
        "search_path": f"{quote(schema)}, public",
        "hnsw.iterative_scan": "relaxed_order",
        # Candidate list per HNSW scan: 100 instead of 40 raises recall against exact search for
        # a heavy user at little cost (BENCHMARKS.md, "Read path").
        "hnsw.ef_search": "100",
        # Plan every statement with its real parameters: whether HNSW (big users) or the user_id
        # btree plus an exact sort (small users) is right depends on the user. asyncpg prepares
        # statements, and a generic plan picks one for everybody, ten times slower for a heavy
        # user (BENCHMARKS.md, "Read path").
        "plan_cache_mode": "force_generic_plan" if generic_plans else "force_custom_plan",
    }
    if statement_timeout_ms is not None:
        settings["statement_timeout"] = str(statement_timeout_ms)

    async def init(conn: asyncpg.Connection) -> None:
        await _init(conn)
        if prepare is not None:
            await prepare(conn)

    return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=init, reset=_keep_session,
                                     command_timeout=command_timeout_s, timeout=connect_timeout_s,
                                     max_inactive_connection_lifetime=0 if generic_plans else 300,
                                     server_settings=settings)


def text_array(values) -> str:
    """A Postgres text[] literal (for arrays passed as text through ``unnest``)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


async def fetch_by_keys(conn, table: str, columns, id_column: str, keys) -> list[asyncpg.Record]:
    """``columns`` of the rows of ``table`` whose ``(user_id, id_column)`` is one of ``keys``: every
    projection loads by user and id, so a row is found only under its own user (another user's
    with the same id is not theirs)."""
    if not keys:
        return []
    users, ids = zip(*set(keys))
    return await conn.fetch(f"SELECT {', '.join('r.' + c for c in columns)} FROM unnest($1::text[], $2::uuid[]) "
                            f"k(user_id, id) JOIN {table} r ON r.user_id = k.user_id AND r.{id_column} = k.id",
                            list(users), list(ids))


def _migrations() -> list[tuple[int, str, str]]:
    found = []
    for item in resources.files("memstream.projections").joinpath("migrations").iterdir():
        if item.name.endswith(".sql"):
            found.append((int(item.name.split("_", 1)[0]), item.name, item.read_text()))
    return sorted(found)


async def migrate(dsn: str, schema: str, dimensions: int | None = None) -> list[str]:
    """Create ``schema`` and apply every migration not yet applied there. Safe to re-run and to
    run concurrently (an advisory lock serialises runners). Returns the names applied now.
    ``dimensions``: the embedder's, which the vector columns take (``ensure_dimensions``)."""
    conn = await asyncpg.connect(dsn)
    applied_now: list[str] = []
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('memstream.migrate'))")
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}")
            await conn.execute(f"SET LOCAL search_path = {quote(schema)}, public")
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in _migrations():
                if version in done:
                    continue
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
                applied_now.append(name)
                log.info("applied migration %s to schema %s", name, schema)
            if dimensions is not None and await ensure_dimensions(conn, dimensions):
                applied_now.append(f"vectors of {dimensions} dimensions")
    finally:
        await conn.close()
    return applied_now


# The vector columns: each holds one embedder's vectors (``embedding_model`` beside them).
VECTOR_TABLES = ("episodes", "episode_passages", "memory_facts", "memory_edges")


class DimensionMismatch(MemstreamError):
    """The store holds vectors of another dimension than the configured embedder makes."""


async def ensure_dimensions(conn: asyncpg.Connection, dimensions: int) -> bool:
    """Give the schema's vector columns ``dimensions`` (its indexes rebuilt alike) while they hold
    no row; True if anything changed. Vectors are never converted: a store that already holds
    another embedder's vectors raises ``DimensionMismatch`` (switch models by ``memstream reform``
    into a new decisions version, ``replay --into`` a new schema, then ``switch``)."""
    rows = await conn.fetch(
        "SELECT c.relname, a.atttypmod FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND a.attname = 'embedding' "
        "AND c.relname = ANY($1::text[]) AND c.relkind IN ('r', 'p')", list(VECTOR_TABLES))
    wrong = sorted(r["relname"] for r in rows if r["atttypmod"] != dimensions)
    if not wrong:
        return False
    held = [t for t in wrong if await conn.fetchval(f"SELECT EXISTS (SELECT FROM {t})")]
    if held:
        have = {r["relname"]: r["atttypmod"] for r in rows}
        raise DimensionMismatch(
            f"the store holds {have[held[0]]}-dimensional vectors ({', '.join(held)}), the configured embedder makes "
            f"{dimensions}: switch models with `memstream reform`, `memstream replay all --into` a new schema and "
            "`memstream switch` (docs/models.md)")
    for table in wrong:
        indexes = await conn.fetch(
            "SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS definition FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = $1::regclass AND a.attname = 'embedding'", table)
        for ix in indexes:
            await conn.execute(f"DROP INDEX {ix['name']}")
        await conn.execute(f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector({int(dimensions)})")
        for ix in indexes:
            await conn.execute(ix["definition"].replace(" ON ONLY ", " ON "))
        log.info("vector column of %s made %d-dimensional", table, dimensions)
    return True


async def drop_schema(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote(schema)} CASCADE")
    finally:
        await conn.close()
