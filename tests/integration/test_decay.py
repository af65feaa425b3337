"""Decay on the real stack: a sweep weighs facts at its own recorded time, asks on each user's log
for the faded ones to be archived, and formation archives them in order with the user's turns;
an archived fact leaves the read path, is listed as archived, comes back when the user says it
again, and a replay (no model, no embedder, no sweep) lands on the same rows."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from memstream.embedding import default_embedder
from memstream.projections.compare import TABLES, diff_counts
from memstream.projections.db import drop_schema
from memstream.schemas import MemoriesUsed, TurnRecorded, new_event_id
from memstream.stack.worker_process import worker_env
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.reform import reform
from memstream.streams.ops.replay import replay
from memstream.streams.ops.sweep import sweep_decay

from .conftest import wait_until
from .helpers import BASE, assert_equal_to_a_rebuild, assert_equal_to_a_replay
from .test_formation import append_and_wait, turn
from .test_read_path import make_reader

pytestmark = pytest.mark.asyncio
LATER = BASE + timedelta(days=3 * 365)  # the sweep's own time: three years on


async def test_a_sweep_archives_faded_facts_a_mention_restores_them_and_a_replay_agrees(
        settings, conn, dsn, workers, forbid_llm_and_embedder, tmp_path):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [
        turn("dee", "I live in Porto.", 0), turn("dee", "I'm allergic to peanuts.", 1),
        turn("dee", "I like jazz.", 2), turn("dee", "I like sudoku.", 3), turn("dee", "I like kayaking.", 4),
        turn("eli", "I like sudoku.", 5)])
    facts = {(r["user_id"], r["value"]): r["fact_id"] for r in await conn.fetch(
        "SELECT user_id, value, fact_id FROM memory_facts WHERE status = 'current'")}
    # The host used jazz in an answer the day before the sweep: in use, it stays.
    async with TurnLog(settings) as log:
        await log.append(MemoriesUsed(event_id=new_event_id(), user_id="dee", occurred_at=LATER - timedelta(days=1),
                                      fact_ids=[facts["dee", "jazz"]]))
    await append_and_wait(settings, conn, [turn("dee", "thanks", 6)])
    await wait_until(lambda: conn.fetchval("SELECT uses FROM fact_uses WHERE user_id = 'dee'"), what="the use counted")

    # The cold index on (it is off by default): the same sweep moves dee's old episodes out of it.
    cooling = settings.model_copy(update={"episode_cold_after_days": 365})
    cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "memstream.cli", "sweep", "decay", "--user",
                                                   "dee", "--dry-run", "--as-of", LATER.strftime("%Y-%m-%dT%H:%M:%S")],
                                  env=worker_env(cooling), capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    said = cli.stdout.splitlines()
    assert "would archive 2; would move 6 episodes to the cold index and 0 back; 1 users" in said[0], cli.stdout
    assert sorted(line.rsplit("  ", 1)[1] for line in said if "strength" in line) == ["Likes kayaking",
                                                                                      "Likes sudoku"]
    assert [line for line in said if "episodes:" in line] == [
        "  dee  episodes: 6 to the cold index (not said or used in 365 days), 0 back (used since)"]
    dry = await sweep_decay(cooling, dsn, user_id="dee", dry_run=True, at=LATER)
    assert sorted(dry.texts["dee", f.fact_id] for f in dry.weak["dee"]) == ["Likes kayaking", "Likes sudoku"]
    assert all(f.strength < 0.2 and f.idle_days > 800 and f.rate > 0 for f in dry.weak["dee"])
    assert not await conn.fetchval("SELECT count(*) FROM decay_sweeps")  # a dry run records nothing

    done = await sweep_decay(cooling, dsn, user_id="dee", at=LATER)
    assert done.archiving == 2 and await conn.fetchval("SELECT sum(archived) FROM decay_sweeps") == 2
    assert done.cooling == 6 and await conn.fetchval("SELECT sum(cooled) FROM decay_sweeps") == 6

    async def archived():
        return {r["value"] for r in await conn.fetch(
            "SELECT value FROM memory_facts WHERE user_id = 'dee' AND status = 'archived'")}
    assert await wait_until(lambda: archived(), what="the sweep's facts archived") == {"sudoku", "kayaking"}
    # Who they are, what they must not eat, where they live, what is in use: never archived; nor
    # is another user's fact of the same words.
    assert {r["value"] for r in await conn.fetch("SELECT value FROM memory_facts WHERE user_id = 'dee' AND "
                                                 "status = 'current'")} == {"Porto", "peanuts", "jazz"}
    assert await conn.fetchval("SELECT status FROM memory_facts WHERE user_id = 'eli'") == "current"
    # Off the read path and its keyword postings, listed as archived, with why in its history.
    reader = await make_reader(dsn, settings, default_embedder())
    try:
        ctx = await reader.read("dee", "c1", "what puzzles and games do I like, sudoku?")
        assert not any("sudoku" in f.text for f in ctx.facts)
        assert not await conn.fetchval("SELECT count(*) FROM memory_facts_terms t JOIN memory_facts f USING (user_id, "
                                       "fact_id) WHERE f.status = 'archived'")
        asked = await reader.read("dee", "c1", "what puzzles and games do I like, sudoku?", include_archived=True)
        assert [f.archived for f in asked.facts if "sudoku" in f.text] == [True]
        import httpx

        from memstream.api.app import create_app
        from memstream.api.keys import ApiKeys

        from .conftest import served

        keys = ApiKeys(tmp_path / "api-keys.json")
        key = keys.create("ops")
        async with served(create_app(settings, keys=keys, dsn=dsn, embedder=default_embedder())) as url, \
                httpx.AsyncClient(base_url=url, timeout=30) as client:  # over HTTP alike
            got = await client.post("/v1/users/dee/context", headers={"Authorization": f"Bearer {key}"}, json={
                "conversation_id": "c1", "message": "what puzzles and games do I like, sudoku?",
                "include_archived": True})
        assert [f["archived"] for f in got.json()["facts"] if "sudoku" in f["text"]] == [True], got.text
        page = await reader.memories("dee", "archived")
        assert sorted(f.text for f in page.items) == ["Likes kayaking", "Likes sudoku"]
        [version] = await reader.fact_history("dee", facts["dee", "sudoku"])
        assert version.status == "archived" and version.valid_to is None  # still believed: nothing ended

        # Said again: current again, observed once more.
        await append_and_wait(settings, conn, [turn("dee", "I like sudoku.", 7)])
        await wait_until(lambda: conn.fetchval("SELECT status = 'current' FROM memory_facts WHERE fact_id = $1",
                                               facts["dee", "sudoku"]), what="sudoku restored")
        assert await conn.fetchval("SELECT observation_count FROM memory_facts WHERE fact_id = $1",
                                   facts["dee", "sudoku"]) == 2
        ctx = await reader.read("dee", "c1", "what puzzles and games do I like, sudoku?")
        assert any("sudoku" in f.text for f in ctx.facts)

        # Believed still, an archived fact is retracted or corrected as a current one.
        await append_and_wait(settings, conn, [turn("dee", "Forget that I like kayaking.", 9)])
        await wait_until(lambda: conn.fetchval("SELECT status = 'deleted' FROM memory_facts WHERE fact_id = $1",
                                               facts["dee", "kayaking"]), what="the archived fact retracted")
    finally:
        await reader.close()
    await append_and_wait(settings, conn, [turn("dee", "bye", 10)])
    w.stop()

    forbid_llm_and_embedder()  # a replay applies what was decided: no sweep, model or embedder
    await assert_equal_to_a_replay(settings, conn, dsn, "re", ["episodes", "facts", "graph", "commands"],
                                   [t for tables in TABLES.values() for t in tables])


async def test_a_reform_decides_the_recorded_sweep_again(settings, conn, dsn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("fay", "I like chess.", 0), turn("fay", "I like tennis.", 1)])
    await sweep_decay(settings, dsn, at=LATER)
    await append_and_wait(settings, conn, [turn("fay", "I like tennis.", 2)])  # restored
    await wait_until(lambda: conn.fetchval("SELECT status = 'current' FROM memory_facts WHERE value = 'tennis'"),
                     what="tennis restored")
    w.stop()
    reformed = settings.postgres_schema + "_rf"
    try:
        await reform(settings, extractor="offline", topic=settings.decisions_topic + ".v2")
        await replay(settings, dsn, reformed, ["episodes", "facts", "graph"], topic=settings.decisions_topic + ".v2")
        for table in TABLES["facts"]:
            assert await diff_counts(conn, settings.postgres_schema, reformed, table) == (0, 0), table
        assert [r["status"] for r in await conn.fetch(
            f'SELECT status FROM "{reformed}".memory_facts ORDER BY value')] == ["archived", "current"]
    finally:
        await drop_schema(dsn, reformed)


async def test_a_formation_worker_sweeps_the_users_of_its_partitions_on_its_timer(settings, conn, workers):
    # A threshold no decaying fact of confidence below 1 reaches, and a timer of seconds: the
    # worker's own sweep, as of its clock, archives the like and keeps the name.
    swept = settings.model_copy(update={"decay_threshold": 0.99, "decay_sweep_every_s": 2.0})
    w = workers(settings=swept)
    await w.wait_assigned()
    await append_and_wait(swept, conn, [turn("gus", "Hi, I'm Gus. I like chess.", 0)])
    assert await wait_until(lambda: conn.fetchval(
        "SELECT status = 'archived' FROM memory_facts WHERE user_id = 'gus' AND value = 'chess'"),
        timeout=60, what="the worker's sweep")
    assert await conn.fetchval("SELECT status FROM memory_facts WHERE user_id = 'gus' AND attribute = 'name'") == \
        "current"
    # The sweep records itself once its requests are appended: formation may answer them first.
    assert await wait_until(lambda: conn.fetchval("SELECT sum(archived) FROM decay_sweeps"),
                            what="the worker's sweep recorded") >= 1


async def test_an_archived_relationship_keeps_its_edge_and_an_archived_fact_can_be_corrected(settings, conn, dsn, workers):
    from memstream import control

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("hal", "My sister Anna is visiting.", 0), turn("hal", "I like chess.", 1)])
    await sweep_decay(settings, dsn, at=LATER)
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 2 FROM memory_facts WHERE user_id = 'hal' AND "
                                           "status = 'archived'"), what="both archived")

    async def sisters():
        return sorted(r["name"] for r in await conn.fetch(
            "SELECT n.name FROM memory_edges e JOIN entities n ON n.user_id = e.user_id AND n.entity_id = "
            "e.target_entity_id WHERE e.user_id = 'hal' AND e.relation = 'has_sibling' AND e.valid_to IS NULL "
            "AND NOT e.forgotten"))

    assert await sisters() == ["Anna"]  # archived, believed still: the graph says so too
    await append_and_wait(settings, conn, [turn("hal", "My sister Bea is visiting.", 2)])
    assert await wait_until(lambda: _listed(sisters, 2), what="Bea's edge") == ["Anna", "Bea"]
    reader = await make_reader(dsn, settings, default_embedder())
    try:
        [chess] = [f for f in (await reader.memories("hal", "archived")).items if f.value == "chess"]
        async with TurnLog(settings) as log:
            pos = await control.correct_fact(log, reader, "hal", chess.fact_id, "checkers")
        assert await reader.caught_up(pos, timeout=30)
        versions = await reader.fact_history("hal", chess.fact_id)
        assert [(v.value, v.status) for v in versions] == [("chess", "superseded"), ("checkers", "current")]
    finally:
        await reader.close()


async def _listed(names, n: int):
    got = await names()
    return got if len(got) >= n else None


async def test_a_sweep_moves_old_unused_episodes_to_the_cold_index_and_a_use_brings_one_back(
        settings, conn, dsn, workers, forbid_llm_and_embedder):
    from memstream.projections.episodes import query as episodes_q
    from .test_long_turns import FILLER, PHRASE

    # Dated by the wall clock: a turn's idle time runs from when it was said or logged, whichever
    # is earlier (a host cannot keep a turn hot by dating it ahead), so the sweep is as of now.
    now = datetime.now(timezone.utc)

    def said(user, text, days_ago, conv="c1"):
        return TurnRecorded.new(user_id=user, conversation_id=conv, user_message=text, assistant_message="I see.",
                                occurred_at=now - timedelta(days=days_ago))

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [
        said("ivy", "I adopted a greyhound named Comet.", 800), said("ivy", f"{FILLER} {PHRASE} {FILLER}", 800),
        said("ivy", "My favourite tea is oolong.", 800),
        said("ivy", "Just had lunch.", 2, "c2"), said("ivy", "The weather is grey today.", 2, "c2"),
        said("jon", "I adopted a greyhound named Comet.", 800)])
    ids = {r["user_message"][:12]: r["episode_id"] for r in await conn.fetch(
        "SELECT user_message, episode_id FROM episodes WHERE user_id = 'ivy'")}
    # The host used the tea turn in an answer the day before the sweep: in use, it stays hot.
    async with TurnLog(settings) as log:
        await log.append(MemoriesUsed(event_id=new_event_id(), user_id="ivy", occurred_at=now - timedelta(days=1),
                                      episode_ids=[ids["My favourite"]]))
    await append_and_wait(settings, conn, [said("ivy", "ok", 1, "c2")])
    await wait_until(lambda: conn.fetchval("SELECT uses FROM episode_uses WHERE user_id = 'ivy'"), what="the use")

    off = await sweep_decay(settings, dsn, user_id="ivy", at=now + timedelta(hours=1), dry_run=True)
    assert not off.cooling  # off by default
    cooling = settings.model_copy(update={"episode_cold_after_days": 365})
    done = await sweep_decay(cooling, dsn, user_id="ivy", at=now + timedelta(hours=1))
    assert done.cooling == 2 and not done.warming and await conn.fetchval("SELECT sum(cooled) FROM decay_sweeps") == 2

    async def cold():
        return {r["user_message"][:12] for r in await conn.fetch(
            "SELECT user_message FROM episodes WHERE user_id = 'ivy' AND cooled_at IS NOT NULL")}
    assert await wait_until(cold, what="the episodes cooled") == {"I adopted a ", FILLER[:12]}
    # Passages follow their episode; the other user's turn of the same words is not theirs to move.
    assert not await conn.fetchval("SELECT count(*) FROM episode_passages WHERE user_id = 'ivy' AND cooled_at IS NULL")
    assert await conn.fetchval("SELECT cooled_at IS NULL FROM episodes WHERE user_id = 'jon'")

    embedder = default_embedder()
    [vec] = embedder.embed(["my greyhound Comet"])
    async with conn.transaction():
        # Four hot episodes answer a search of two: the cold index is not asked.
        hot = await episodes_q.nearest(conn, "ivy", vec, 2, embedder.model_id)
        # A search of ten comes back short of the hot index: the cold one is searched, and its
        # nearest (the greyhound) ranks first, by distance.
        every = await episodes_q.nearest(conn, "ivy", vec, 10, embedder.model_id)
    assert ids["I adopted a "] not in {r["episode_id"] for r in hot}
    assert every[0]["episode_id"] == ids["I adopted a "] and len(every) == 6
    reader = await make_reader(dsn, settings, embedder)
    try:
        ctx = await reader.read("ivy", "c2", "what is the name of my greyhound?")
        assert any("greyhound" in e.user_message for e in ctx.episodes)  # keyword search covers cold turns
    finally:
        await reader.close()

    # Used after it cooled: the next sweep brings it back to the hot index.
    async with TurnLog(settings) as log:
        await log.append(MemoriesUsed(event_id=new_event_id(), user_id="ivy", occurred_at=now + timedelta(hours=2),
                                      episode_ids=[ids["I adopted a "]]))
    await append_and_wait(settings, conn, [said("ivy", "ok again", 0, "c2")])
    await wait_until(lambda: conn.fetchval("SELECT uses FROM episode_uses WHERE episode_id = $1", ids["I adopted a "]),
                     what="the second use")
    # With cooling turned off since (0 days): nothing more goes cold, and what was cold comes back when used.
    off = settings.model_copy(update={"episode_cold_after_days": 0})
    again = await sweep_decay(off, dsn, user_id="ivy", at=now + timedelta(hours=3))
    assert again.warming == 1 and not again.cooling

    async def warmed():
        return await cold() == {FILLER[:12]}
    await wait_until(warmed, what="the greyhound back in the hot index")
    await append_and_wait(settings, conn, [said("ivy", "bye", 0, "c2")])
    w.stop()

    forbid_llm_and_embedder()  # a replay and a rebuild apply what the sweeps decided: no clock, no sweep
    await assert_equal_to_a_replay(settings, conn, dsn, "cold", ["episodes", "commands"],
                                   ["episodes", "episode_passages", "episode_uses"])
    await assert_equal_to_a_rebuild(settings, conn, dsn, "coldrb")
