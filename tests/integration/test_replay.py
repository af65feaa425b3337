"""A store rebuilt from the log equals the live one, row for row."""
from __future__ import annotations

import pytest

from memstream.projections.compare import diff_counts
from memstream.projections.db import drop_schema
from memstream.schemas import EpisodeRecorded
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.replay import ReplayError, replay_episodes

from .conftest import wait_until
from .helpers import BASE, turns

pytestmark = pytest.mark.asyncio


async def test_replay_into_a_fresh_schema_equals_the_live_projection_and_never_embeds(settings, dsn, conn, workers, forbid_llm_and_embedder):
    w = workers()
    await w.wait_assigned()
    async with TurnLog(settings) as log:
        await log.append_many(turns(120, users=6, prefix="r"))
    await wait_until(lambda: _count(conn, 120), what="120 episodes")
    w.stop()  # a quiet live store to compare against

    forbid_llm_and_embedder()
    target = settings.postgres_schema + "_rebuilt"
    try:
        report = await replay_episodes(settings, dsn, target)
        assert (report.rows, report.skipped) == ({"episodes": 120}, 0)
        assert report.records >= 120 and report.records_per_s > 0
        assert await diff_counts(conn, settings.postgres_schema, target, "episodes") == (0, 0)
        live = await conn.fetch("SELECT * FROM projection_positions WHERE projection='episodes' ORDER BY 2, 3")
        rebuilt = await conn.fetch(f"SELECT * FROM {target}.projection_positions WHERE projection='episodes' ORDER BY 2, 3")
        assert [tuple(r) for r in live] == [tuple(r) for r in rebuilt]
        with pytest.raises(ReplayError, match="already holds"):
            await replay_episodes(settings, dsn, target)
    finally:
        await drop_schema(dsn, target)


async def test_replay_refuses_to_write_into_the_live_schema(settings, dsn):
    with pytest.raises(ReplayError, match="live schema"):
        await replay_episodes(settings, dsn, settings.postgres_schema)


async def _count(conn, n):
    return await conn.fetchval("SELECT count(*) FROM episodes") == n


async def test_the_bulk_rebuild_of_episodes_writes_what_a_replay_writes_forgets_included(settings, dsn, conn, workers):
    """Load first, index after (streams.ops.rebuild): the same episodes, keyword postings and
    positions as the live projection, with an episode and a whole user forgotten on the way, and
    its indexes back as the migrations define them."""
    from memstream import control
    from memstream.streams.ops.rebuild import rebuild_episodes

    w = workers()
    await w.wait_assigned()
    sent = turns(60, users=4, prefix="b")
    async with TurnLog(settings) as log:
        await log.append_many(sent)
        await wait_until(lambda: _count(conn, 60), what="60 episodes")
        gone = await conn.fetchval("SELECT episode_id FROM episodes WHERE user_id = 'b-user-1' LIMIT 1")
        await log.append(control_forget_episode(sent, gone))
        await control.forget_user(log, "b-user-2")
        await log.append_many(turns(4, users=4, prefix="b2"))
    # Two episodes Postgres refuses (a NUL, a vector of another size): dead-lettered live, and
    # left out of the COPY, where one would fail the whole rebuild.
    from .test_delivery import UNIT, _decided, _put_decisions, _read_all

    refused = [EpisodeRecorded(**_decided(settings, 0, "b-user-3", "episode"), conversation_id="c",
                               occurred_at=BASE, user_message=said, assistant_message="ok", embedding=vector,
                               embedding_model="test")
               for said, vector in (("a \x00 here", UNIT), ("three floats", UNIT[:12]))]
    await _put_decisions(settings, refused, key=b"b-user-3")
    await _read_all(settings, settings.dead_letter_topic, 2)
    await wait_until(lambda: _count(conn, 60 - 1 - 15 + 4), what="the forgets applied and the last turns")
    w.stop()

    target = settings.postgres_schema + "_bulk"
    try:
        report = await rebuild_episodes(settings, dsn, target)
        assert report.episodes == 48 and report.skipped == 2 and report.shredded > 0  # b-user-2, forgotten
        assert {"read", "copy", "postings", "index episodes_embedding_hnsw"} <= set(report.seconds)
        for table in ("episodes", "episodes_terms"):
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0), table
        live = await conn.fetch("SELECT * FROM projection_positions WHERE projection='episodes' ORDER BY 2, 3")
        rebuilt = await conn.fetch(f"SELECT * FROM {target}.projection_positions WHERE projection='episodes' ORDER BY 2, 3")
        assert [tuple(r) for r in live] == [tuple(r) for r in rebuilt]
        indexes = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'episodes' ORDER BY 1"
        assert [(r[0], r[1].replace(target, "S")) for r in await conn.fetch(indexes, target)] == \
               [(r[0], r[1].replace(settings.postgres_schema, "S")) for r in await conn.fetch(indexes, settings.postgres_schema)]
        with pytest.raises(ReplayError, match="already holds"):
            await rebuild_episodes(settings, dsn, target)
    finally:
        await drop_schema(dsn, target)


def control_forget_episode(sent, episode_id):
    """The ``EpisodeForgotten`` for the turn whose episode is ``episode_id``."""
    from memstream.projections.episodes.core import episode_id as id_of
    from memstream.schemas import EpisodeForgotten
    from memstream.schemas.events import new_event_id
    from datetime import datetime, timezone

    turn = next(t for t in sent if id_of(t.event_id) == episode_id)
    return EpisodeForgotten(event_id=new_event_id(), user_id=turn.user_id, occurred_at=datetime.now(timezone.utc),
                            actor="user", turn_event_id=turn.event_id)
