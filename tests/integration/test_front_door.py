"""``memstream.connect()``, the host's front door, on the real stack: every call a host makes,
from writing a turn to forgetting the user."""
from __future__ import annotations

import pytest

from memstream import connect
from memstream.control import NotFound
from memstream.schemas.errors import InvalidArgument

from .conftest import wait_until

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def embedder():
    from memstream.embedding import default_embedder

    return default_embedder()


async def test_a_host_writes_reads_corrects_forgets_and_exports_through_one_memory(settings, dsn, workers, embedder,
                                                                                  tmp_path):
    w = workers()
    await w.wait_assigned()
    async with connect(settings, dsn=dsn, embedder=embedder) as memory:
        pos = await memory.remember(user_id="door", conversation_id="c1", user_message="I live in Porto.",
                                    assistant_message="Nice!")
        [later] = await memory.remember_many([memory_turn("I like green tea.")])
        ctx = await memory.read("door", "c1", "where do I live?", after=later, wait_timeout=30)
        assert ctx.caught_up and any("Porto" in f.text for f in ctx.facts)
        assert "User: where do I live?" in memory.render_prompt(ctx, "where do I live?")
        assert await memory.caught_up(pos, timeout=30)
        found = await memory.search("door", "tea")
        assert found.facts
        facts = {f.attribute: f for f in (await memory.memories("door")).items}
        home = facts["home"]
        fixed = await memory.correct("door", home.fact_id, "Faro")
        assert await memory.caught_up(fixed, timeout=30)
        assert [v.value for v in await memory.history("door", home.fact_id)][-1] == "Faro"
        with pytest.raises(InvalidArgument):
            await memory.forget("door", fact_id=home.fact_id, edge_id=home.fact_id)
        with pytest.raises(NotFound):
            await memory.forget("someone-else", fact_id=home.fact_id)  # not theirs
        gone = await memory.forget("door", fact_id=facts["likes"].fact_id)
        assert await memory.caught_up(gone, timeout=30)
        assert "likes" not in {f.attribute for f in (await memory.memories("door")).items}
        assert (await memory.graph("door")).user_id == "door"
        assert (await memory.export_user("door", tmp_path / "door.jsonl"))["events"] >= 2
        # A fact longer than a correction may be (a run-on sentence the rules read whole) is
        # forgotten all the same: the forget carries what a fact's value can hold.
        said = await memory.remember(user_id="door", conversation_id="c1", assistant_message="ok",
                                     user_message="I like " + " ".join(f"word{n}" for n in range(120)) + ".")
        assert await memory.caught_up(said, timeout=30)
        [run_on] = [f for f in (await memory.memories("door")).items if f.attribute == "likes"]
        assert len(run_on.value) > 500
        assert await memory.caught_up(await memory.forget("door", fact_id=run_on.fact_id), timeout=30)
        assert "likes" not in {f.attribute for f in (await memory.memories("door")).items}
        forgot = await memory.forget_user("door", reason="user_request")
        assert await memory.caught_up(forgot, timeout=30)
    await wait_until(lambda: _none_left(settings, dsn), what="the user forgotten")
    w.stop()


def memory_turn(text: str):
    from memstream.schemas import TurnRecorded

    return TurnRecorded.new(user_id="door", conversation_id="c1", user_message=text, assistant_message="ok")


async def _none_left(settings, dsn) -> bool:
    import asyncpg

    conn = await asyncpg.connect(dsn, server_settings={"search_path": settings.postgres_schema})
    try:
        return await conn.fetchval("SELECT count(*) = 0 FROM episodes WHERE user_id = 'door'")
    finally:
        await conn.close()
