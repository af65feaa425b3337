from __future__ import annotations

import asyncio

import pytest

from memstream.projections.db import _migrations, drop_schema, migrate

pytestmark = pytest.mark.asyncio


async def test_migrations_are_safe_to_rerun_and_to_run_concurrently(dsn):
    schema = "t_migrate_check"
    await drop_schema(dsn, schema)
    try:
        results = await asyncio.gather(*(migrate(dsn, schema) for _ in range(3)))
        assert sorted(len(r) for r in results) == [0, 0, len(_migrations())]
        assert await migrate(dsn, schema) == []
    finally:
        await drop_schema(dsn, schema)


async def test_the_episodes_table_has_hnsw_and_gin_indexes(conn):
    indexes = {r["indexdef"].split(" USING ")[1].split(" ")[0]
               for r in await conn.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = 'episodes' AND schemaname = current_schema()")}
    assert {"hnsw", "gin", "btree"} <= indexes
