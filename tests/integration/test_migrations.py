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


async def test_partitioning_a_populated_schema_keeps_every_row_and_the_overlap_constraint(dsn):
    """0006/0007 rebuild episodes, facts and edges as tables partitioned by user: a deployment
    upgrading with data must come out with the same rows (generated tsvectors included)."""
    import uuid

    import asyncpg

    schema, tables = "t_partition_upgrade", ("episodes", "memory_facts", "memory_edges")
    await drop_schema(dsn, schema)
    c = await asyncpg.connect(dsn)
    try:
        await c.execute(f"CREATE SCHEMA {schema}; SET search_path = {schema}, public")
        for version, _, sql in _migrations():
            if version <= 5:
                await c.execute(sql)
        vec, e, f, ent, edge = "[" + ",".join(["0.05"] * 384) + "]", uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        await c.execute(
            "INSERT INTO episodes (episode_id, source_event_id, user_id, conversation_id, occurred_at, recorded_at, source_partition, "
            "source_offset, user_message, assistant_message, metadata, embedding, embedding_model) "
            "VALUES ($1, $1, 'u1', 'c1', now(), now(), 0, 0, 'I live in Oslo', 'Nice', '{}', $2::vector, 'm')", e, vec)
        await c.execute(
            "INSERT INTO memory_facts (fact_id, lineage_id, version, user_id, text, category, attribute, value, confidence, explicit, "
            "status, valid_from, recorded_at, observation_count, last_observed_at, observed_by, deferred, source_event_id, extractor, "
            "resolver, reason, embedding, embedding_model) VALUES ($1, $1, 1, 'u1', 'Lives in Oslo', 'location', 'home', 'Oslo', 0.9, "
            "true, 'current', now(), now(), 1, now(), ARRAY[$1]::uuid[], '{}', $1, 'x', 'x', 'new', $2::vector, 'm')", f, vec)
        await c.execute("INSERT INTO entities VALUES ($1, 'u1', 'the user', '{}', true, now(), $1)", ent)
        edge_sql = ("INSERT INTO memory_edges (edge_id, user_id, source_entity_id, relation, target_value, multi_valued, valid_from, "
                    "recorded_at, fact_sentence, confidence, explicit, source_event_id, extractor, reason, embedding, embedding_model) "
                    "VALUES ($1, 'u1', $2, 'lives_in', $3, false, now(), now(), 'x', 0.9, true, $1, 'x', 'x', $4::vector, 'm')")
        await c.execute(edge_sql, edge, ent, "Oslo", vec)

        columns = {t: [r["column_name"] for r in await c.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 "
            "ORDER BY ordinal_position", schema, t)] for t in tables}

        async def digest():  # of the columns there were: later migrations may add some
            return {t: await c.fetchval(f"SELECT md5(string_agg(row({', '.join(columns[t])})::text, '|')) FROM {t}")
                    for t in tables}

        before = await digest()
        for version, _, sql in _migrations():
            if version > 5:
                await c.execute(sql)
        assert await digest() == before
        kinds = {r["relname"]: r["relkind"] for r in await c.fetch(
            "SELECT relname, relkind FROM pg_class WHERE relnamespace = $1::regnamespace AND relname = ANY($2::text[])", schema, list(tables))}
        assert kinds == {t: b"p" for t in tables}
        with pytest.raises(asyncpg.exceptions.ExclusionViolationError):  # one home at a time, still
            await c.execute(edge_sql, uuid.uuid4(), ent, "Bergen", vec)
    finally:
        await c.close()
        await drop_schema(dsn, schema)


async def test_every_edges_partition_refuses_overlaps_without_btree_gist(conn):
    """0011's exclusion is built from ranges only (the local Postgres ships no btree_gist) and
    lives on each partition, since a partitioned table refuses it on the parent."""
    assert await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'btree_gist'") == 0
    parts = await conn.fetch(
        "SELECT c.relname, (SELECT count(*) FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'x') AS x "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'memory_edges'::regclass")
    assert len(parts) == 32 and all(p["x"] == 1 for p in parts)


async def test_an_install_with_the_old_overlap_constraint_gets_the_new_form(dsn):
    """Installs migrated before 0011 carry 0007's constraint on the parent: 0011 drops it by name
    (the old form needs btree_gist, so a stand-in of the same name plays it here)."""
    import asyncpg

    schema = "t_overlap_upgrade"
    await drop_schema(dsn, schema)
    c = await asyncpg.connect(dsn)
    try:
        await c.execute(f"CREATE SCHEMA {schema}; SET search_path = {schema}, public")
        for version, _, sql in _migrations():
            if version <= 10:
                await c.execute(sql)
        await c.execute("ALTER TABLE memory_edges ADD CONSTRAINT memory_edges_single_valued_no_overlap CHECK (true)")
        for version, _, sql in _migrations():
            if version > 10:
                await c.execute(sql)
        names = {r["conname"] for r in await c.fetch(
            "SELECT conname FROM pg_constraint WHERE connamespace = $1::regnamespace AND contype IN ('x', 'c')", schema)}
        assert "memory_edges_single_valued_no_overlap" not in names
        assert {f"memory_edges_p{i}_no_overlap" for i in range(32)} <= names
    finally:
        await c.close()
        await drop_schema(dsn, schema)
