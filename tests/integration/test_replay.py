"""A store rebuilt from the log equals the live one, row for row."""
from __future__ import annotations

import pytest

from memstream.projections.compare import diff_counts
from memstream.projections.db import drop_schema
from memstream.streams.producer import TurnLog
from memstream.streams.replay import ReplayError, replay_episodes

from .conftest import wait_until
from .helpers import turns

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
