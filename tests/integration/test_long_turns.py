"""Long turns on the real stack: found by a passage past the embedder's window, returned as an
excerpt when they do not fit a read's budget, and rebuilt by a replay with their passages."""
from __future__ import annotations

import pytest

from memstream.embedding import default_embedder
from memstream.projections.episodes import query as episodes_q
from memstream.read_client import Budgets
from memstream.read_client.budget import TokenCounter
from memstream.read_client.render import episode_line

from .helpers import assert_equal_to_a_rebuild, assert_equal_to_a_replay
from .test_formation import append_and_wait, turn
from .test_read_path import make_reader

pytestmark = pytest.mark.asyncio

# Some 400 tokens of a recipe: nothing about boats, harbours or colours.
FILLER = " ".join(
    f"Step {i}: stir the flour, butter and sugar in a warm bowl for {i + 2} minutes, then fold in the eggs "
    f"and let the dough rest while the oven heats." for i in range(14))
PHRASE = ("The violet submarine is moored at Quayside Nine behind the lighthouse. The submarine's crew moor it "
          "there every winter, because the harbour's deep berth keeps the submarine safe from storms, and the "
          "harbour master checks the mooring lines of the violet submarine each morning.")


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


async def test_a_long_turn_is_found_by_a_phrase_past_the_256th_token(settings, conn, dsn, workers, embedder):
    counter = TokenCounter()
    long_text = f"{FILLER} {PHRASE} {FILLER}"
    assert counter.count(FILLER) > 300  # the phrase is past the first window
    w = workers()
    await w.wait_assigned()
    chat = [turn("lyra", f"My neighbour {x}.", i) for i, x in enumerate(
        ["plays the cello at night", "grows tomatoes on the balcony", "collects old stamps", "runs every morning",
         "paints watercolours of mountains", "reads detective novels"])]
    await append_and_wait(settings, conn, [*chat, turn("lyra", long_text, 10, answer="Noted.")])
    passages = await conn.fetch("SELECT passage, start_char, end_char FROM episode_passages WHERE user_id = 'lyra' "
                                "ORDER BY passage")
    assert len(passages) >= 2 and passages[0]["start_char"] > 0  # the first window is the episode's own
    assert any(p["start_char"] <= long_text.index(PHRASE) < p["end_char"] for p in passages)

    query = embedder.embed(["Where is the violet submarine moored?"])[0]
    rows = await episodes_q.nearest(conn, "lyra", query, 3, embedder.model_id)
    assert rows[0]["user_message"] == long_text
    assert rows[0]["start_char"] > 0  # matched by a later passage, not the first window
    own = await conn.fetchval("SELECT embedding <=> $2 FROM episodes WHERE user_id = $1 AND user_message = $3",
                              "lyra", query, long_text)
    assert rows[0]["distance"] < own  # its passage, discounted, is still nearer than its opening


async def test_k_long_episodes_fit_the_default_budget_as_excerpts_with_their_ids(settings, conn, dsn, workers,
                                                                                  embedder):
    w = workers()
    await w.wait_assigned()
    topics = ["violet submarine", "amber zeppelin", "crimson canoe", "golden gondola", "silver schooner",
              "jade junk"]
    chat = [turn("mira", f"{FILLER} The {t} sails from Quayside {i} at dawn. {FILLER}", i, answer="Good to know.")
            for i, t in enumerate(topics)]
    await append_and_wait(settings, conn, chat)
    reader = await make_reader(dsn, settings, embedder)
    counter = TokenCounter()
    try:
        ctx = await reader.read("mira", "c9", "Where does the violet submarine sail from?", k=5)
        whole = await reader.search("mira", "Where does the violet submarine sail from?", kinds=["episodes"], k=5)
    finally:
        await reader.close()
    assert counter.count(episode_line(chat[0])) > Budgets().episodes  # one alone would fill the budget
    assert len(ctx.episodes) == 5 and ctx.tokens["episodes"] <= Budgets().episodes
    assert sum(counter.count(episode_line(e)) for e in ctx.episodes) == ctx.tokens["episodes"]
    assert all(e.excerpt is not None for e in ctx.episodes)
    by_id = {e.episode_id: e for e in whole.episodes}
    for e in ctx.episodes:  # an excerpt is the full episode's own text, under its id
        a, b = e.excerpt
        full = by_id[e.episode_id]
        assert f"{full.user_message}\n{full.assistant_message}"[a:b].startswith(e.user_message)
    best = min(ctx.episodes, key=lambda e: e.rank)
    assert "violet submarine sails from Quayside 0" in best.user_message
    # The section reads in time order; search never cuts.
    assert [e.occurred_at for e in ctx.episodes] == sorted(e.occurred_at for e in ctx.episodes)
    assert all(e.excerpt is None for e in whole.episodes)


async def test_a_replay_and_a_rebuild_land_on_the_same_passages(settings, conn, dsn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("nox", f"{FILLER} {PHRASE} {FILLER}", 0),
                                           turn("nox", "Short and sweet.", 1)])
    assert await conn.fetchval("SELECT count(*) FROM episode_passages WHERE user_id = 'nox'") >= 2
    await assert_equal_to_a_replay(settings, conn, dsn, "long")
    await assert_equal_to_a_rebuild(settings, conn, dsn, "longrb")
