"""Backfill: formation re-run with another extractor into a separate decisions version."""
from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import pytest

from memstream.projections.compare import TABLES, diff_counts
from memstream.projections.db import drop_schema
from memstream.schemas import FactReinforced, LogPosition
from memstream.streams.ops.reform import ReformError, reform
from memstream.streams.ops.replay import ReplayError, replay

from .test_delivery import _decided, _put_decisions
from .helpers import schemas_named
from .test_formation import append_and_wait, turn

pytestmark = pytest.mark.asyncio

SCRIPT = [
    ("fay", "Hi, my name is Fay.", "Nice to meet you, Fay!"),
    ("fay", "I live in Lisbon and work as a nurse at Santa Maria.", "Great."),
    ("fay", "What's the weather like?", "Thanks, Mark! It's sunny."),  # inferred name
    ("gus", "I'm allergic to peanuts.", "Noted."),
    ("fay", "I moved to Berlin last month.", "Exciting!"),
    ("gus", "I'm allergic to peanuts.", "Still noted."),
]


async def test_reform_versions_rebuild_to_comparable_projections(settings, conn, dsn, workers):
    w = workers()
    await w.wait_assigned()
    turns = [turn(u, m, i * 60, answer=a) for i, (u, m, a) in enumerate(SCRIPT)]
    await append_and_wait(settings, conn, turns[:4])
    # A decision naming a fact its user does not hold, about a turn of each partition's start:
    # dead-lettered live, and not copied (nor fatal) when a reform copies the decisions before --since.
    await _put_decisions(settings, [FactReinforced(**_decided(settings, 0, "fay", "fact:0") | {
        "source": LogPosition(settings.events_topic, p, 0)}, extractor="test", resolver="test", reason="test",
        confidence=1.0, explicit=True, target=uuid.uuid4()) for p in range(settings.partitions)], key=b"fay")
    since = await conn.fetchval("SELECT max(recorded_at) FROM episodes") + timedelta(milliseconds=1)
    await asyncio.sleep(0.05)  # later log timestamps for the rest
    await append_and_wait(settings, conn, turns[4:])
    w.stop()
    live = settings.postgres_schema
    same, strict, later = (f"{live}_same", f"{live}_strict", f"{live}_since")
    try:
        r1 = await reform(settings, extractor="offline", topic=settings.decisions_topic + ".v2")
        assert (r1.reformed_events, r1.copied_decisions) == (len(SCRIPT), 0)
        await replay(settings, dsn, same, ["episodes", "facts"], topic=settings.decisions_topic + ".v2")
        # Same extractor, same log: the new version rebuilds to exactly the live projection.
        for table in TABLES["facts"] + TABLES["episodes"]:
            assert await diff_counts(conn, live, same, table) == (0, 0), table

        r2 = await reform(settings, extractor="offline-strict", topic=settings.decisions_topic + ".strict")
        await replay(settings, dsn, strict, ["facts"], topic=settings.decisions_topic + ".strict")
        assert r2.extractor == "offline-rules-v1-strict"
        assert await diff_counts(conn, live, strict, "memory_facts") != (0, 0)
        live_current = {r["text"] for r in await conn.fetch(f"SELECT text FROM {live}.memory_facts WHERE status='current'")}
        strict_current = {r["text"] for r in await conn.fetch(f"SELECT text FROM {strict}.memory_facts WHERE status='current'")}
        assert live_current == strict_current  # explicit facts agree ...
        # ... and the assistant's guess the rules infer is refused live (the junk guard), never made by the strict ones
        assert await conn.fetchval(f"SELECT count(*) FROM {strict}.fact_refusals") == 0
        assert await conn.fetchval(f"SELECT count(*) FROM {live}.fact_refusals WHERE refusal = 'assistant_only'") == 1

        # --since: earlier decisions are copied, later events formed again; the result is the same.
        r3 = await reform(settings, extractor="offline", topic=settings.decisions_topic + ".since", since=since)
        assert r3.copied_decisions > 0 and r3.reformed_events == 2 and r3.skipped_decisions >= 1
        await replay(settings, dsn, later, ["episodes", "facts"], topic=settings.decisions_topic + ".since")
        assert await diff_counts(conn, live, later, "memory_facts") == (0, 0)
        with pytest.raises(ReformError, match="already holds"):
            await reform(settings, extractor="offline", topic=settings.decisions_topic + ".v2")
    finally:
        for schema in (same, strict, later):
            await drop_schema(dsn, schema)


async def test_a_reform_stopped_partway_is_refused_by_replay_and_named_by_the_next_reform(settings, conn, dsn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn(u, m, i * 60, answer=a) for i, (u, m, a) in enumerate(SCRIPT)])
    w.stop()
    topic, into = settings.decisions_topic + ".crashed", settings.postgres_schema + "_crashed"

    def crash(done, total):  # after the first batch's decisions are on the topic
        raise RuntimeError("the reform's host went away")

    with pytest.raises(RuntimeError):
        await reform(settings, extractor="offline", topic=topic, on_progress=crash)
    with pytest.raises(ReplayError, match="left unfinished"):
        await replay(settings, dsn, into, ["facts"], topic=topic)
    from memstream.streams.ops.rebuild import rebuild_episodes

    with pytest.raises(ReplayError, match="left unfinished"):  # `replay episodes --bulk` too
        await rebuild_episodes(settings, dsn, into, topic=topic)
    assert await schemas_named(dsn, into) == set()  # refused before anything was built
    with pytest.raises(ReformError, match="left unfinished; delete the topic"):
        await reform(settings, extractor="offline", topic=topic)
    whole = await reform(settings, extractor="offline", topic=settings.decisions_topic + ".whole")
    row = await conn.fetchrow("SELECT finished_at, report FROM reforms WHERE topic = $1", whole.topic)
    assert row["finished_at"] is not None and json.loads(row["report"])["reformed_events"] == len(SCRIPT)


async def test_a_reform_keeps_an_imported_users_memory_and_forms_their_later_turns_on_it(settings, conn, dsn, workers,
                                                                                        tmp_path):
    """An imported event is not formed (its decisions came with it): formation forms the user's
    next turn on the imported memory once it is applied, and a reform copies the imported
    decisions in their events' place, so the new version holds it and what the user said after."""
    from datetime import datetime, timezone

    from memstream.portability import export_user, import_user
    from memstream.schemas import UserForgotten
    from memstream.schemas.events import new_event_id
    from memstream.streams.log.producer import TurnLog

    from .conftest import wait_until

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("imp", "I live in Lisbon and work as a nurse at Santa Maria.", 0),
                                           turn("imp", "I like jazz.", 60), turn("loc", "I live in Oslo.", 120)])
    await export_user(settings, "imp", tmp_path / "imp.jsonl")
    async with TurnLog(settings) as log:  # gone here, and brought back from the archive (as if moved in)
        await log.append(UserForgotten(event_id=new_event_id(), user_id="imp", occurred_at=datetime.now(timezone.utc),
                                       actor="user"))
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 0 FROM memory_facts WHERE user_id = 'imp'"),
                     what="imp forgotten")
    await import_user(settings, tmp_path / "imp.jsonl", force=True)
    # At once: formation must wait for the imported decisions to be applied, not form on what it held.
    await append_and_wait(settings, conn, [turn("imp", "I moved to Berlin last month.", 180)])
    assert await conn.fetchval("SELECT count(*) FROM memory_facts WHERE user_id = 'imp' AND value = 'Lisbon' "
                               "AND status = 'superseded'") == 1  # formed on the imported memory
    w.stop()
    side = f"{settings.postgres_schema}_imp"
    try:
        report = await reform(settings, extractor="offline", topic=settings.decisions_topic + ".imp")
        assert report.copied_decisions > 0
        await replay(settings, dsn, side, ["episodes", "facts"], topic=settings.decisions_topic + ".imp")
        for table in TABLES["facts"] + TABLES["episodes"]:
            assert await diff_counts(conn, settings.postgres_schema, side, table) == (0, 0), table
    finally:
        await drop_schema(dsn, side)
