"""Migrated schemas for tests, used again: after a test its schema is emptied and set aside
rather than dropped, and the next test takes it, when nothing but rows changed in it (a test
that dropped an index or disabled a trigger leaves its schema to be dropped). Migrating a schema
costs about 1.2 s here, and some 200 tests take one."""
from __future__ import annotations

import uuid

import asyncpg

from memstream.projections.db import drop_schema, migrate

PREFIX = "pooled_"
_reference: dict[str, tuple[str, dict]] = {}  # dsn -> (signature, seed rows) of a schema just migrated

_SIGNATURE = """
SELECT concat_ws('|',
  (SELECT string_agg(format('%s:%s:%s', c.relname, c.relkind, (SELECT count(*) FROM pg_attribute a
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)), ',' ORDER BY c.relname)
     FROM pg_class c WHERE c.relnamespace = $1::regnamespace),
  (SELECT string_agg(x.name, ',' ORDER BY x.name) FROM (  -- a constraint's own triggers are named by their oid
     SELECT CASE WHEN t.tgisinternal THEN c.relname || ':internal' ELSE t.tgname::text END || t.tgenabled::text AS name
     FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = $1::regnamespace) x),
  (SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint WHERE connamespace = $1::regnamespace),
  (SELECT string_agg(x.relname::text || i.indisvalid::text, ',' ORDER BY x.relname) FROM pg_index i
     JOIN pg_class x ON x.oid = i.indexrelid WHERE x.relnamespace = $1::regnamespace),
  (SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace))
"""


async def _tables(conn, schema: str) -> list[str]:
    """The schema's tables a TRUNCATE names (partitions go with their parent)."""
    return [r[0] for r in await conn.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p') "
        "AND NOT relispartition AND relname <> 'schema_migrations' ORDER BY 1", schema)]


async def _signature(conn, schema: str) -> str:
    applied = await conn.fetchval(
        f'SELECT string_agg(version::text, \',\' ORDER BY version) FROM "{schema}".schema_migrations')
    return f"{await conn.fetchval(_SIGNATURE, schema)}|{applied}"


async def _rename(conn, old: str, new: str) -> None:
    async with conn.transaction():
        await conn.execute(f'ALTER SCHEMA "{old}" RENAME TO "{new}"')
        for fn in await conn.fetch(  # functions fixed to their schema's name (as a switch does)
                "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = $1::regnamespace "
                "AND EXISTS (SELECT FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')", new):
            await conn.execute(f'ALTER FUNCTION {fn[0]} SET search_path = "{new}", public')


async def fresh(dsn: str, schema: str) -> None:
    """``schema`` migrated and empty: one set aside, renamed, or a new one migrated."""
    conn = await asyncpg.connect(dsn)
    try:
        if dsn not in _reference:  # a session's first: set aside by another version, perhaps
            for name, in await conn.fetch("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)", PREFIX):
                await conn.execute(f'DROP SCHEMA "{name}" CASCADE')
        elif pooled := await conn.fetchval(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1) ORDER BY 1 LIMIT 1", PREFIX):
            return await _rename(conn, pooled, schema)
        await migrate(dsn, schema)
        if dsn not in _reference:
            seeds = {t: [tuple(r) for r in await conn.fetch(f'SELECT * FROM "{schema}"."{t}"')]
                     for t in await _tables(conn, schema)}
            _reference[dsn] = (await _signature(conn, schema), {t: rows for t, rows in seeds.items() if rows})
    finally:
        await conn.close()


async def done(dsn: str, schema: str) -> None:
    """After a test: ``schema`` emptied and set aside if only its rows changed, else dropped."""
    try:
        conn = await asyncpg.connect(dsn, server_settings={"lock_timeout": "5s"})
    except (OSError, asyncpg.PostgresError):
        return
    try:
        exists = await conn.fetchval("SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema)
        if not exists:
            return
        signature, seeds = _reference.get(dsn, (None, {}))
        if signature is None or await _signature(conn, schema) != signature:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            return
        async with conn.transaction():
            tables = await _tables(conn, schema)
            for table in tables:  # DELETE, not TRUNCATE: a few rows, and TRUNCATE makes every partition's files anew
                await conn.execute(f'DELETE FROM "{schema}"."{table}"')
            for table, rows in seeds.items():
                await conn.copy_records_to_table(table, schema_name=schema, records=rows)
        await _rename(conn, schema, f"{PREFIX}{uuid.uuid4().hex[:12]}")
    except asyncpg.PostgresError:
        await drop_schema(dsn, schema)
    finally:
        await conn.close()
