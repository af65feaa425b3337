"""The bi-temporal graph on the real stack: supersession, as-of on both axes, the overlap
constraint, one-hop expansion, replay equality."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest

from memstream.embedding import default_embedder
from memstream.projections.compare import diff_counts
from memstream.projections.db import create_pool, drop_schema
from memstream.read_client import MemoryReader
from memstream.schemas.read_models import AsOf
from memstream.streams.ops.replay import replay

from .test_formation import append_and_wait, turn
from .helpers import BASE

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


@pytest.fixture
async def reader(dsn, settings, embedder):
    r = MemoryReader(pool=await create_pool(dsn, settings.postgres_schema), redis=None, embedder=embedder,
                     schema=settings.postgres_schema, edge_candidates=1)
    yield r
    await r.close()


async def edges(conn, user):
    return await conn.fetch(
        "SELECT e.relation, t.name AS target, e.valid_from, e.valid_to, e.recorded_at, e.closed_at FROM memory_edges e "
        "LEFT JOIN entities t ON t.entity_id = e.target_entity_id WHERE e.user_id = $1 ORDER BY e.valid_from", user)


async def test_a_new_employer_closes_the_old_edge_and_both_answer_as_of_their_time(settings, conn, workers, reader):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("hal", "I work at Acme.", 0)])
    between = datetime.now(timezone.utc)
    await asyncio.sleep(0.05)
    await append_and_wait(settings, conn, [turn("hal", "I just joined Globex!", 60 * 24 * 90)])
    rows = await edges(conn, "hal")
    assert [(r["target"], r["valid_to"] is None) for r in rows] == [("Acme", False), ("Globex", True)]
    acme, globex = rows
    assert acme["valid_from"] == BASE and acme["valid_to"] == globex["valid_from"] == BASE + timedelta(days=90)
    assert acme["closed_at"] == globex["recorded_at"]

    async def works_at(as_of):
        ctx = await reader.read("hal", "c1", "where do I work?", as_of=as_of)
        return [e.target for e in ctx.edges if e.relation == "works_at"]

    assert await works_at(None) == ["Globex"]
    assert await works_at(AsOf(valid_time=BASE + timedelta(days=30))) == ["Acme"]            # true then
    assert await works_at(AsOf(valid_time=BASE + timedelta(days=120))) == ["Globex"]         # true later
    assert await works_at(AsOf(valid_time=BASE - timedelta(days=1))) == []                   # before either
    # What we believed between the two turns: Acme, open-ended — the switch was not yet recorded.
    assert await works_at(AsOf(valid_time=BASE + timedelta(days=120), recorded_time=between)) == ["Acme"]
    timeline = await reader.timeline("hal", (await conn.fetchval("SELECT entity_id FROM entities WHERE user_id='hal' AND is_user")), "employed_by")
    assert [e.target for e in timeline] == ["Acme", "Globex"]


async def test_managed_by_and_has_manager_supersede_rather_than_duplicate(settings, conn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("ivy", "My manager is David.", 0), turn("ivy", "Sara is my new boss.", 60)])
    rows = await edges(conn, "ivy")
    assert [(r["relation"], r["target"], r["valid_to"] is None) for r in rows] == [
        ("managed_by", "David", False), ("managed_by", "Sara", True)]


async def test_the_database_rejects_overlapping_intervals_for_a_single_valued_relation(settings, conn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("jo", "I work at Acme.", 0)])
    edge = await conn.fetchrow("SELECT * FROM memory_edges WHERE user_id = 'jo'")
    copy = dict(edge)
    copy.update(edge_id=__import__("uuid").uuid4(), target_entity_id=None, target_value="Globex",
                valid_from=edge["valid_from"] + timedelta(days=10))
    cols = [c for c in copy if c != "tsv"]
    with pytest.raises(asyncpg.ExclusionViolationError):
        async with conn.transaction():
            await conn.execute(f"INSERT INTO memory_edges ({', '.join(cols)}) VALUES ({', '.join(f'${i + 1}' for i in range(len(cols)))})",
                               *[copy[c] for c in cols])
    # Multi-valued relations may overlap: two children at once is fine.
    await append_and_wait(settings, conn, [turn("jo", "My daughter Lily and my son Leo are home.", 5)])
    assert await conn.fetchval("SELECT count(*) FROM memory_edges WHERE user_id='jo' AND relation='has_child' AND valid_to IS NULL") == 2


async def test_one_hop_expansion_surfaces_a_connected_fact_ranked_below_the_direct_match(settings, conn, workers, reader):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("kim", "My sister Ana works at Google.", 0), turn("kim", "I live in Oslo.", 1)])
    ctx = await reader.read("kim", "c1", "tell me about my sister")
    assert ctx.edges[0].fact_sentence == "The user has a sibling named Ana" and ctx.edges[0].hop == 0
    hop = next(e for e in ctx.edges if e.fact_sentence == "Ana works at Google")
    assert hop.hop == 1 and hop.score < ctx.edges[0].score
    assert ctx.edges.index(hop) > 0
    # Not a hop through the user: living in Oslo is connected to the sister only via the user.
    assert not any("Oslo" in e.fact_sentence for e in ctx.edges)


async def test_replaying_the_graph_equals_the_live_tables_without_any_llm(settings, conn, dsn, workers, forbid_llm_and_embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [
        turn("lu", "Hi, my name is Lu. I work at Acme and live in Lisbon.", 0),
        turn("lu", "My manager is David.", 1), turn("lu", "David works at Acme.", 2),
        turn("lu", "I just joined Globex!", 3), turn("lu", "I report to Priya now.", 4),
        turn("lu", "My friend Bo and my friend Cy.", 5),
    ])
    w.stop()

    forbid_llm_and_embedder()
    target = settings.postgres_schema + "_graph_rebuilt"
    try:
        report = await replay(settings, dsn, target, ["graph"])
        assert report.rows["graph"] >= 6
        for table in ("entities", "memory_edges"):
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0)
    finally:
        await drop_schema(dsn, target)
    names = await conn.fetchval("SELECT aliases FROM entities WHERE user_id='lu' AND is_user")
    assert names == ["Lu"]
    sentences = {r["fact_sentence"] for r in await conn.fetch("SELECT fact_sentence FROM memory_edges WHERE user_id='lu' AND valid_to IS NULL")}
    # The user is "The user" in a sentence, whatever their name (it may change; the sentence would not).
    assert {"The user works at Globex", "The user is managed by Priya", "David works at Acme",
            "The user lives in Lisbon"} <= sentences


async def test_neighbourhoods_walk_one_or_two_hops_over_current_edges(settings, conn, workers):
    from memstream.projections.graph import query as graph_q

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("mo", "My sister Ana works at Google.", 0),
                                           turn("mo", "Ana lives in Zurich.", 1), turn("mo", "I work at Acme.", 2)])
    me = await conn.fetchval("SELECT entity_id FROM entities WHERE user_id='mo' AND is_user")
    one = {r["name"]: r["depth"] for r in await graph_q.neighbourhood(conn, "mo", me, hops=1)}
    two = {r["name"]: r["depth"] for r in await graph_q.neighbourhood(conn, "mo", me, hops=2)}
    assert one == {"Ana": 1, "Acme": 1}
    assert two == {"Ana": 1, "Acme": 1, "Google": 2, "Zurich": 2}
    with pytest.raises(ValueError):
        await graph_q.neighbourhood(conn, "mo", me, hops=3)


async def test_two_users_turns_with_one_event_id_keep_their_own_graphs_and_facts(settings, conn, dsn, workers, reader):
    # A host gave both users' turns one event id, so formation derives the same entity, edge and
    # fact ids for both: the second user's must not overwrite the first's, live or rebuilt.
    import msgspec

    w = workers()
    await w.wait_assigned()
    first = turn("kit", "I work at Acme.", 0)
    await append_and_wait(settings, conn, [first])
    await append_and_wait(settings, conn, [msgspec.structs.replace(turn("lex", "I work at Globex.", 1),
                                                                   event_id=first.event_id)])
    w.stop()

    async def works_at(user):
        return await conn.fetch(
            "SELECT t.name FROM memory_edges e JOIN entities t ON t.user_id = e.user_id AND t.entity_id = e.target_entity_id "
            "WHERE e.user_id = $1 AND e.relation = 'works_at' AND e.valid_to IS NULL", user)

    assert [r["name"] for r in await works_at("kit")] == ["Acme"]
    assert [r["name"] for r in await works_at("lex")] == ["Globex"]
    facts = {r["user_id"]: r["value"] for r in await conn.fetch(
        "SELECT user_id, value FROM memory_facts WHERE user_id IN ('kit', 'lex') AND status = 'current'")}
    assert facts == {"kit": "Acme", "lex": "Globex"}
    shared = await conn.fetchval("SELECT count(*) FROM entities a JOIN entities b USING (entity_id) "
                                 "WHERE a.user_id = 'kit' AND b.user_id = 'lex'")
    assert shared >= 1  # the same ids, each user's own row
    # ... which each may see, correct and forget: the control plane finds their own row by the id.
    for table, kind, id_ in (("memory_facts", "facts", "fact_id"), ("memory_edges", "edges", "edge_id"),
                             ("episodes", "episodes", "episode_id")):
        ids = await conn.fetchval(f"SELECT array_agg({id_}) FROM {table} WHERE user_id = 'kit'")
        for user in ("kit", "lex"):
            for memory_id in ids:
                assert (await reader.holder(kind, memory_id, user))["user_id"] == user, (kind, user)

    target = settings.postgres_schema + "_same_ids_rebuilt"
    try:
        await replay(settings, dsn, target, ["graph", "facts"])
        for table in ("entities", "memory_edges", "memory_facts"):
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0)
    finally:
        await drop_schema(dsn, target)
