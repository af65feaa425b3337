"""Formation on the real stack: facts appear, get superseded, keep history, and replay equal."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from memstream.embedding import default_embedder
from memstream.projections.compare import TABLES, diff_counts
from memstream.projections.db import create_pool, drop_schema
from memstream.read_client import MemoryReader
from memstream.schemas import TurnRecorded
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.replay import replay

from .conftest import wait_until
from .helpers import BASE

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


def turn(user, text, minutes, answer="I see.", conv="c1"):
    return TurnRecorded.new(user_id=user, conversation_id=conv, user_message=text, assistant_message=answer,
                            occurred_at=BASE + timedelta(minutes=minutes))


async def append_and_wait(settings, conn, turns):
    async with TurnLog(settings) as log:
        positions = await log.append_many(turns)
    last = {}
    for p in positions:
        last[p.partition] = max(last.get(p.partition, -1), p.offset)

    async def formed():
        rows = await conn.fetch("SELECT partition, next_offset FROM projection_positions WHERE projection='formation'")
        done = {r["partition"]: r["next_offset"] for r in rows}
        if not all(done.get(p, 0) > o for p, o in last.items()):
            return False
        dec = await conn.fetch("SELECT partition, next_offset FROM projection_positions WHERE projection='facts'")
        return bool(dec)

    await wait_until(formed, timeout=90, what="formation to pass the turns")
    # The projections trail formation by one hop, the graph its batch's last step: wait until
    # each holds every decision (a test may stop the worker next and compare a replay).
    await wait_until(lambda: _caught_up(settings, conn), timeout=60, what="the episodes, facts and graph projections")


async def _caught_up(settings, conn, projections=("episodes", "facts", "graph")):
    from aiokafka import TopicPartition

    from memstream.streams.log.kafka_util import groupless_consumer

    async with groupless_consumer(settings.kafka_bootstrap) as c:
        tps = [TopicPartition(settings.decisions_topic, p) for p in range(settings.partitions)]
        ends = await c.end_offsets(tps)
    rows = {(r["projection"], r["partition"]): r["next_offset"] for r in await conn.fetch(
        "SELECT projection, partition, next_offset FROM projection_positions WHERE projection = ANY($2::text[]) "
        "AND topic = $1", settings.decisions_topic, list(projections))}
    return all(rows.get((name, tp.partition), 0) >= end for name in projections for tp, end in ends.items())


async def current(conn, user, attribute):
    return await conn.fetch("SELECT * FROM memory_facts WHERE user_id=$1 AND attribute=$2 AND status='current'", user, attribute)


async def test_a_move_supersedes_the_old_home_and_keeps_it_in_history(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [
        turn("ana", "I live in Lisbon.", 0),
        turn("ana", "I love hiking in the hills.", 1),
        turn("ana", "I moved to Berlin last month, the flat is great.", 60 * 24 * 40),
    ])
    homes = await current(conn, "ana", "home")
    assert [h["value"] for h in homes] == ["Berlin"]
    reader = MemoryReader(pool=await create_pool(dsn, settings.postgres_schema), redis=None, embedder=embedder,
                          schema=settings.postgres_schema)
    try:
        history = await reader.fact_history("ana", homes[0]["fact_id"])
        assert [(v.value, v.status) for v in history] == [("Lisbon", "superseded"), ("Berlin", "current")]
        lisbon, berlin = history
        assert lisbon.superseded_by == berlin.fact_id and lisbon.superseded_at == berlin.recorded_at
        assert lisbon.valid_to == berlin.valid_from == BASE + timedelta(days=40) - timedelta(days=30)
        assert "home changed" in berlin.reason and lisbon.end_reason == berlin.reason
        ctx = await reader.read("ana", "c1", "where do I live?")
        assert ctx.facts[0].text == "Lives in Berlin"
        assert "Lives in Lisbon" not in [f.text for f in ctx.facts]
        assert await reader.fact_history("someone-else", homes[0]["fact_id"]) == []
    finally:
        await reader.close()


async def test_a_repeated_statement_reinforces_instead_of_duplicating(settings, conn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("bo", "I'm allergic to peanuts.", i) for i in range(3)]
                          + [turn("bo", "I am severely allergic to peanuts", 5)])
    rows = await conn.fetch("SELECT * FROM memory_facts WHERE user_id='bo'")
    assert len(rows) == 1 and rows[0]["observation_count"] == 4 and rows[0]["status"] == "current"


async def test_the_assistants_unconfirmed_guess_is_refused_and_recorded_not_stored(settings, conn, workers, caplog):
    """The assistant calling the user "Mark" is its guess, never the user's word: the junk guard
    refuses it before the safety gate would weigh it (the gate's own rules: tests/unit/test_decide.py),
    and the refusal, with its kind and reason, is the user's history."""
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [
        turn("cy", "Hi, my name is Maria.", 0, answer="Nice to meet you, Maria!"),
        turn("cy", "What's the weather like?", 1, answer="Thanks, Mark! It's sunny."),  # the assistant's guess: Mark
    ])
    names = await current(conn, "cy", "name")
    assert [n["value"] for n in names] == ["Maria"]
    assert json.loads(names[0]["deferred"]) == {}
    refused = await conn.fetch("SELECT refusal, value, evidence, reason FROM fact_refusals WHERE user_id = 'cy'")
    assert [(r["refusal"], r["value"]) for r in refused] == [("assistant_only", "Mark")]
    assert "Mark" in refused[0]["evidence"] and refused[0]["reason"]
    assert "REFUSED a identity candidate (assistant_only)" in w.log()
    # An explicit statement passes the gate at once.
    await append_and_wait(settings, conn, [turn("cy", "Sorry for the confusion: my name is Marta.", 2)])
    assert [n["value"] for n in await current(conn, "cy", "name")] == ["Marta"]


async def test_a_burst_of_contradicting_turns_ends_with_the_last_one_and_a_full_history(settings, conn, workers):
    cities = ["Lisbon", "Porto", "Madrid", "Paris", "Rome", "Vienna", "Prague", "Oslo", "Dublin", "Berlin",
              "Athens", "Warsaw"]
    w = workers()
    await w.wait_assigned()
    # Appended in one go: formation sees them in a few batches, far ahead of the facts projection.
    await append_and_wait(settings, conn, [turn("dee", f"I live in {c}.", i) for i, c in enumerate(cities)])
    rows = await conn.fetch("SELECT value, status FROM memory_facts WHERE user_id='dee' AND attribute='home' ORDER BY version")
    assert [r["value"] for r in rows] == cities
    assert [r["status"] for r in rows] == ["superseded"] * (len(cities) - 1) + ["current"]
    lineages = await conn.fetchval("SELECT count(DISTINCT lineage_id) FROM memory_facts WHERE user_id='dee'")
    assert lineages == 1


async def test_replaying_facts_equals_the_live_table_without_calling_any_llm_or_embedder(settings, conn, dsn, workers, forbid_llm_and_embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [
        turn("eve", "I'm Eve. I live in Lisbon and work as a nurse at Santa Maria hospital.", 0),
        turn("eve", "My daughter Lily turns 7 on October 12th.", 1),
        turn("eve", "I hate cilantro.", 2), turn("eve", "I hate cilantro.", 3),
        turn("eve", "I just joined Globex!", 4), turn("eve", "I no longer work at Globex.", 5),
    ])
    w.stop()

    forbid_llm_and_embedder()
    target = settings.postgres_schema + "_facts_rebuilt"
    try:
        report = await replay(settings, dsn, target, ["episodes", "facts"])
        assert report.rows["facts"] > 5
        for table in TABLES["facts"] + TABLES["episodes"]:
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0), table
    finally:
        await drop_schema(dsn, target)
    statuses = {r["text"]: r["status"] for r in await conn.fetch("SELECT text, status FROM memory_facts WHERE user_id='eve'")}
    assert statuses["Works at Globex"] == "deleted" and statuses["Works at Santa Maria hospital"] == "superseded"
    assert statuses["Dislikes cilantro"] == "current"
    # The keyword postings are exactly the words of the current facts and of every episode,
    # after supersessions and deletions (the triggers of migration 0008).
    for table, key, at, where in (("memory_facts", "fact_id", "recorded_at", "WHERE status = 'current'"),
                                  ("episodes", "episode_id", "occurred_at", "")):
        implied = f"SELECT user_id, t, {at}, {key} FROM {table}, unnest(memstream_terms(tsv, user_id)) t {where}"
        kept = f"SELECT user_id, term, at, {key} FROM {table}_terms"
        assert await conn.fetchval(f"SELECT count(*) FROM ({implied} EXCEPT ALL {kept}) d") == 0, table
        assert await conn.fetchval(f"SELECT count(*) FROM ({kept} EXCEPT ALL {implied}) d") == 0, table
        assert await conn.fetchval(f"SELECT count(*) FROM {table}_terms") > 0, table
