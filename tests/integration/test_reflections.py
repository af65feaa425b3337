"""Reflections (Tier 3) on the real stack: a sweep clusters a user's recent facts and turns and
asks on their log for a reflection; formation records one sentence naming its sources; the read path
ranks it with facts; forgetting a source forgets it; a replay (no model, no embedder, no sweep)
lands on the same rows."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta

import pytest

from memstream import control
from memstream.embedding import default_embedder
from memstream.schemas import EpisodeForgotten, TurnRecorded, new_event_id
from memstream.projections.compare import TABLES
from memstream.projections.episodes.core import episode_id
from memstream.stack.worker_process import worker_env
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.reform import reform
from memstream.streams.ops.sweep import sweep_reflect
from memstream.streams.worker.reflecting import requests

from .conftest import wait_until
from .helpers import BASE, assert_equal_to_a_replay
from .test_formation import append_and_wait, turn
from .test_read_path import make_reader

pytestmark = pytest.mark.asyncio
SOON = BASE + timedelta(days=1)  # the sweeps' time: the day after the turns


async def test_a_sweep_reflects_on_a_cluster_the_read_finds_it_and_a_forgotten_source_takes_it(
        settings, conn, dsn, workers, forbid_llm_and_embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [
        turn("ivy", "I like hiking.", 0), turn("ivy", "I like camping.", 1), turn("ivy", "I like hiking.", 2),
        turn("ivy", "I live in Porto.", 3), turn("ivy", "I'm allergic to peanuts.", 4),
        turn("jon", "I like hiking.", 5), turn("jon", "I like camping.", 6)])  # said twice only: not enough

    # As of the day after: a fact's time is when its turn says it was said (the log's, if earlier).
    cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "memstream.cli", "sweep", "reflect",
                                                   "--dry-run", "--as-of", SOON.strftime("%Y-%m-%dT%H:%M:%S")],
                                  env=worker_env(settings), capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    said = cli.stdout.splitlines()
    assert "would ask about 1 clusters of 1 users" in said[0] and len(said) == 2, cli.stdout
    assert said[1].strip().startswith("ivy  2 facts and 0 turns said 3x: ") and "Likes hiking" in said[1], said[1]
    assert not await conn.fetchval("SELECT count(*) FROM reflection_sweeps")  # a dry run records nothing

    done = await sweep_reflect(settings, dsn, at=SOON)
    assert done.asking == 1 and await conn.fetchval("SELECT sum(clusters) FROM reflection_sweeps") == 1
    reflection = await wait_until(lambda: conn.fetchrow(
        "SELECT fact_id, text, derived_from, status FROM memory_facts WHERE category = 'reflection'"),
        what="the reflection recorded")
    sources = {r["value"]: r["fact_id"] for r in await conn.fetch(
        "SELECT value, fact_id FROM memory_facts WHERE user_id = 'ivy' AND category <> 'reflection'")}
    assert set(reflection["derived_from"]) == {sources["hiking"], sources["camping"]}
    assert reflection["status"] == "current" and "hiking" in reflection["text"] and "camping" in reflection["text"]
    # Asked again, the sweep finds the cluster reflected on already.
    assert (await sweep_reflect(settings, dsn, dry_run=True, at=SOON)).asking == 0

    reader = await make_reader(dsn, settings, default_embedder())
    try:
        ctx = await reader.read("ivy", "c1", "what do I keep doing outdoors, hiking and camping?")
        assert any(f.fact_id == reflection["fact_id"] for f in ctx.facts), [f.text for f in ctx.facts]
        found = await reader.search("ivy", "hiking and camping theme", kinds=["facts"], k=5)
        assert any(f.fact_id == reflection["fact_id"] for f in found.facts)
        page = await reader.memories("ivy")
        assert [f.text for f in page.items if f.category == "reflection"] == [reflection["text"]]
        # Forget a source: the reflection built on it is forgotten with it; the other source stays.
        async with TurnLog(settings) as log:
            await control.forget_fact(log, reader, "ivy", sources["camping"], keep_episodes=True)
        assert await wait_until(lambda: conn.fetchval(
            "SELECT end_reason FROM memory_facts WHERE fact_id = $1 AND status = 'forgotten'",
            reflection["fact_id"]), what="the reflection forgotten with its source")
        assert await conn.fetchval("SELECT status FROM memory_facts WHERE fact_id = $1", sources["hiking"]) == "current"
        ctx = await reader.read("ivy", "c1", "what do I keep doing outdoors, hiking and camping?")
        assert not any(f.fact_id == reflection["fact_id"] for f in ctx.facts)
    finally:
        await reader.close()
    await append_and_wait(settings, conn, [turn("ivy", "bye", 9)])
    w.stop()

    forbid_llm_and_embedder()  # a replay applies what was decided: no sweep, model or embedder
    await assert_equal_to_a_replay(settings, conn, dsn, "re", ["episodes", "facts", "graph", "commands"],
                                   [t for tables in TABLES.values() for t in tables])


async def test_a_reflection_drawn_from_a_fact_and_turns_no_fact_was_read_from_is_forgotten_with_one_of_them(
        settings, conn, dsn, workers, forbid_llm_and_embedder):
    w = workers()
    await w.wait_assigned()
    ran = [turn("max", f"I went running by the river {when}.", i)
           for i, when in enumerate(("this morning", "again today", "after work"), start=1)]
    small_talk = [turn("max", f"Thanks, that sounds {word} to me.", 10 + i) for i, word in enumerate(("great", "fine"))]
    # A fact (read from its own turn, which counts through it), the turns of its theme; small
    # talk, alike and long enough but with no fact: not asked about; and turns of too few words.
    await append_and_wait(settings, conn, [turn("max", "I like running by the river.", 0), *ran, *small_talk,
                                           turn("max", "ok thanks", 20), turn("max", "thanks!", 21)])
    done = await sweep_reflect(settings, dsn, at=SOON)
    assert (done.asking, done.facts_read, done.turns_read) == (1, 1, 5)
    reflection = await wait_until(lambda: conn.fetchrow(
        "SELECT fact_id, text, derived_from, derived_from_turns, status FROM memory_facts "
        "WHERE category = 'reflection'"), what="the reflection recorded")
    liked = await conn.fetchval("SELECT fact_id FROM memory_facts WHERE user_id = 'max' AND attribute = 'likes'")
    assert reflection["derived_from"] == [liked] and set(reflection["derived_from_turns"]) == {t.event_id for t in ran}
    assert "i went running by the river" in reflection["text"].lower()
    assert (await sweep_reflect(settings, dsn, dry_run=True, at=SOON)).asking == 0  # reflected on already

    reader = await make_reader(dsn, settings, default_embedder())
    try:
        ctx = await reader.read("max", "c1", "how often do I go running by the river?")
        assert any(f.fact_id == reflection["fact_id"] for f in ctx.facts), [f.text for f in ctx.facts]
        [shown] = [f for f in (await reader.memories("max")).items if f.category == "reflection"]
        assert set(shown.derived_from_turns) == {t.event_id for t in ran}
        async with TurnLog(settings) as log:
            await control.forget_episode(log, reader, "max", episode_id(ran[1].event_id))
        assert await wait_until(lambda: conn.fetchval(
            "SELECT end_reason FROM memory_facts WHERE fact_id = $1 AND status = 'forgotten'",
            reflection["fact_id"]), what="the reflection forgotten with a source turn")
        # The first sweep's requests again, right behind a forget of another of its turns (a
        # sweep planned before the forget, sent after it): formation draws on neither forgotten
        # turn, whether or not the episodes projection has applied the forget yet.
        async with TurnLog(settings) as log:
            await log.append_many([EpisodeForgotten(event_id=new_event_id(), user_id="max", occurred_at=SOON,
                                                    actor="user", reason="", turn_event_id=ran[0].event_id),
                                   *requests(done)])
        again = await wait_until(lambda: conn.fetchrow(
            "SELECT derived_from, derived_from_turns FROM memory_facts WHERE category = 'reflection' "
            "AND status = 'current'"), what="the reflection drawn again")
        assert again["derived_from"] == [liked] and again["derived_from_turns"] == [ran[2].event_id]
    finally:
        await reader.close()
    await append_and_wait(settings, conn, [turn("max", "bye for now then", 30)])
    w.stop()

    forbid_llm_and_embedder()
    await assert_equal_to_a_replay(settings, conn, dsn, "rt", ["episodes", "facts", "graph", "commands"],
                                   [t for tables in TABLES.values() for t in tables])


async def test_turns_alone_with_a_topic_of_the_users_are_reflected_on_and_their_small_talk_is_not(
        settings, conn, dsn, workers):
    # A share the few turns of a test can show: "lake" in 3 of 15 turns, "thanks" in 5.
    settings = settings.model_copy(update={"reflect_topic_share": 0.2})
    w = workers(settings=settings)
    await w.wait_assigned()
    kayak = [turn("kim", text, i) for i, text in enumerate((
        "We tried kayaking on the lake at dawn.", "Kayaking again this weekend, the lake was calm.",
        "Paddled across the lake in the kayak after work."), start=1)]
    chat = [turn("kim", f"Thanks, that sounds {word} to me.", 10 + i)
            for i, word in enumerate(("great", "fine", "lovely", "nice"))]
    other = [turn("kim", text, 20 + i) for i, text in enumerate((
        "The train to Porto was late again, thanks to the strike.", "Quantum computers factor numbers quickly.",
        "The soup needs more salt and some pepper.", "Taxes are due at the end of April.",
        "The printer on the third floor jams every Monday.", "Mozart wrote his first symphony as a child.",
        "Volcanic soil grows excellent grapes.", "The museum opens late on Fridays."))]
    await append_and_wait(settings, conn, [*kayak, *chat, *other])
    done = await sweep_reflect(settings, dsn, at=SOON)
    assert (done.facts_read, done.turns_read) == (0, 15)
    [asked] = done.clusters["kim"]
    assert asked.sources == [] and set(asked.turns) <= {t.event_id for t in kayak} and len(asked.turns) >= 2
    reflection = await wait_until(lambda: conn.fetchrow(
        "SELECT fact_id, text, derived_from, derived_from_turns FROM memory_facts WHERE category = 'reflection' "
        "AND status = 'current'"), what="the reflection recorded")
    assert reflection["derived_from"] == [] and set(reflection["derived_from_turns"]) <= {t.event_id for t in kayak}
    assert "lake" in reflection["text"].lower()


async def test_a_formation_worker_reflects_on_the_users_of_its_partitions_on_its_timer(settings, conn, workers):
    timed = settings.model_copy(update={"reflect_sweep_every_s": 2.0, "reflect_min_observations": 2})
    w = workers(settings=timed)
    await w.wait_assigned()
    # Said now: the worker's sweep runs on its own clock.
    await append_and_wait(timed, conn, [TurnRecorded.new(user_id="kai", conversation_id="c1", user_message=said,
                                                         assistant_message="I see.")
                                        for said in ("I like hiking.", "I like camping.")])
    assert await wait_until(lambda: conn.fetchval(
        "SELECT count(*) FROM memory_facts WHERE user_id = 'kai' AND category = 'reflection' AND status = 'current'"),
        timeout=60, what="the worker's reflection sweep") == 1
    # The sweep records itself once its requests are appended: formation may answer them first.
    assert await wait_until(lambda: conn.fetchval("SELECT sum(clusters) FROM reflection_sweeps"),
                            what="the worker's sweep recorded") >= 1


async def test_a_reform_asks_the_recorded_reflection_requests_again(settings, conn, dsn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("lou", "I like jazz.", 0), turn("lou", "I like blues music.", 1),
                                           turn("lou", "I like jazz.", 2)])
    assert (await sweep_reflect(settings, dsn, at=SOON)).asking == 1
    await wait_until(lambda: conn.fetchval("SELECT count(*) FROM memory_facts WHERE category = 'reflection'"),
                     what="the reflection recorded")
    w.stop()
    await reform(settings, extractor="offline", topic=settings.decisions_topic + ".v2")
    await assert_equal_to_a_replay(settings, conn, dsn, "rf", tables=TABLES["facts"],
                                   topic=settings.decisions_topic + ".v2")
