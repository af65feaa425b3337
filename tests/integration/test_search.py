"""``MemoryReader.search``: the ranked memories of the kinds asked, ranked as ``read`` ranks
them, up to k of each, as of a date for the graph."""
from __future__ import annotations

from datetime import timedelta

import pytest

from memstream.embedding import default_embedder
from memstream.projections.db import create_pool
from memstream.read_client import MemoryReader
from memstream.schemas.read_models import AsOf

from .test_formation import BASE, append_and_wait, turn

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


@pytest.fixture
async def reader(dsn, settings, embedder):
    r = MemoryReader(pool=await create_pool(dsn, settings.postgres_schema), redis=None, embedder=embedder,
                     schema=settings.postgres_schema)
    yield r
    await r.close()


async def test_search_ranks_each_kind_asked_as_read_does_up_to_k_and_the_graph_as_of_a_date(
        settings, conn, workers, reader):
    w = workers()
    await w.wait_assigned()
    said = ["I live in Porto.", "I like green tea.", "My sister is called Ana.", "I work at Acme.",
            *(f"Yesterday I walked {n} kilometres by the river." for n in range(2, 30))]
    await append_and_wait(settings, conn, [turn("sam", text, i) for i, text in enumerate(said)])
    await append_and_wait(settings, conn, [turn("sam", "I just joined Globex!", 60 * 24 * 90)])
    await append_and_wait(settings, conn, [turn("tom", "I live in Lisbon.", 0)])

    found = await reader.search("sam", "where do I live?")
    assert found.facts and found.facts[0].attribute == "home" and found.facts[0].value == "Porto"
    assert found.episodes and found.edges and not found.degraded
    ctx = await reader.read("sam", "c1", "where do I live?", k=10, k_facts=10)
    assert [f.fact_id for f in found.facts][:3] == [f.fact_id for f in ctx.facts][:3]  # ranked as read ranks them
    assert [e.episode_id for e in found.episodes][:3] == [e.episode_id for e in sorted(ctx.episodes, key=lambda e: e.rank)][:3]

    only = await reader.search("sam", "walks by the river", kinds=("episodes",), k=25)
    assert not only.facts and not only.edges and len(only.episodes) == 25  # past the 20 ANN candidates a read takes
    assert all("Lisbon" not in e.user_message for e in only.episodes)  # another user's turn
    assert len((await reader.search("sam", "walks by the river", kinds=("episodes",), k=3)).episodes) == 3

    async def works_at(as_of):
        return [e.target for e in (await reader.search("sam", "where do I work?", kinds=("edges",),
                                                       as_of=as_of)).edges if e.relation == "works_at"]

    assert await works_at(None) == ["Globex"]
    assert await works_at(AsOf(valid_time=BASE + timedelta(days=30))) == ["Acme"]
    assert await works_at(AsOf(valid_time=BASE + timedelta(days=120))) == ["Globex"]
    assert await works_at(BASE + timedelta(days=120)) == []  # both axes: nothing was recorded by then
    assert (await reader.search("tom", "where do I live?", kinds=("facts",))).facts[0].value == "Lisbon"
