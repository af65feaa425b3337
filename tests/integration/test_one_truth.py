"""One truth across every section, on the real stack (issue 41): a read ``as_of`` a moment is that
moment in every section; a fact and the edge stating the same slot never disagree, whatever the
control plane does to either; forgetting a fact forgets the turns it was read from; the user's
name follows them into the graph; the offline rules read names in any script and the common
ways a relation ends."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from memstream import control
from memstream.embedding import default_embedder
from memstream.schemas.read_models import AsOf
from memstream.streams.log.producer import TurnLog

from .helpers import BASE
from .test_formation import append_and_wait, turn
from .test_read_path import make_reader

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


def _facts(ctx, attribute):
    return sorted(f.value for f in ctx.facts if f.attribute == attribute)


def _edges(ctx, relation):
    return sorted(e.target for e in ctx.edges if e.relation == relation)


async def _moment() -> datetime:
    """A recorded time strictly between what was appended before and what is appended after."""
    await asyncio.sleep(0.05)
    at = datetime.now(timezone.utc)
    await asyncio.sleep(0.05)
    return at


async def test_as_of_is_one_moment_for_every_section_and_a_correction_reaches_the_graph(
        settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("ada", "My name is Ada. I live in Porto.", 0),
                                           turn("ada", "I work at Acme.", 1),
                                           turn("ada", "I am allergic to peanuts.", 2),
                                           turn("ada", "I like jazz.", 3),
                                           turn("ada", "My dog Rex is sick.", 4)])
    before_correction = await _moment()
    reader = await make_reader(dsn, settings, embedder)
    try:
        facts = {f.attribute: f for f in (await reader.memories("ada", "facts")).items}
        async with TurnLog(settings) as log:
            pos = await control.correct_fact(log, reader, "ada", facts["home"].fact_id, "Braga", reason="I misspoke")
        now = await reader.read("ada", "c1", "where do I live?", after=pos, wait_timeout=30)
        assert now.caught_up
        # The correction reaches the graph: the facts and the relationships say one city.
        assert _facts(now, "home") == ["Braga"] and _edges(now, "lives_in") == ["Braga"]
        assert now.profile["home"] == "Braga"

        # As of before the correction was recorded: the old value, in every section.
        then = await reader.read("ada", "c1", "where do I live?", as_of=AsOf(recorded_time=before_correction))
        assert _facts(then, "home") == ["Porto"] and _edges(then, "lives_in") == ["Porto"]
        assert then.profile["home"] == "Porto"
        assert then.recent_turns == [] and "recent_turns" in then.left_out
        found = await reader.search("ada", "where do I live?", as_of=AsOf(recorded_time=before_correction))
        assert [f.value for f in found.facts if f.attribute == "home"] == ["Porto"]

        # As of a date before the user existed: nothing, in any section.
        for as_of in (BASE - timedelta(days=30), AsOf(valid_time=BASE - timedelta(days=30))):
            empty = await reader.read("ada", "c1", "where do I live and work?", as_of=as_of)
            assert (empty.facts, empty.episodes, empty.edges, empty.profile, empty.recent_turns) == ([], [], [], {}, [])
            assert not (await reader.search("ada", "where do I live and work?", as_of=as_of)).episodes
        # As of the world time of the first turn only (recorded now): what had happened by then.
        first = await reader.read("ada", "c1", "where do I live and work?",
                                  as_of=AsOf(valid_time=BASE + timedelta(seconds=30)))
        assert {e.user_message for e in first.episodes} == {"My name is Ada. I live in Porto."}
        assert _facts(first, "employer") == [] and _facts(first, "home") == ["Braga"]
    finally:
        await reader.close()
        w.stop()


async def test_forgetting_a_fact_reaches_the_graph_and_the_turns_it_came_from(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("bo", "I live in Porto.", 0), turn("bo", "I work at Initech.", 1),
                                           turn("bo", "I am allergic to shellfish.", 2),
                                           turn("bo", "I like hiking.", 3), turn("bo", "I like hiking a lot.", 4)])
    reader = await make_reader(dsn, settings, embedder)
    try:
        facts = {f.attribute: f for f in (await reader.memories("bo", "facts")).items}
        before_forget = await _moment()
        async with TurnLog(settings) as log:
            # Which turns will go, said before they go.
            going = await control.episodes_of_fact(reader, "bo", facts["allergy"].fact_id)
            assert [e.user_message for e in going] == ["I am allergic to shellfish."]
            await control.forget_fact(log, reader, "bo", facts["employer"].fact_id, reason="private")
            pos = await control.forget_fact(log, reader, "bo", facts["allergy"].fact_id)
            # Kept on request: the turns of a forgotten fact stay when the caller says so.
            pos = await control.forget_fact(log, reader, "bo", facts["likes"].fact_id, keep_episodes=True)
        ctx = await reader.read("bo", "c1", "where do I work? am I allergic to anything? what do I like?",
                                after=pos, wait_timeout=30)
        assert ctx.caught_up
        # The employer is gone from the facts and from the graph, now and as of before the forget.
        assert _facts(ctx, "employer") == [] and _edges(ctx, "works_at") == []
        then = await reader.read("bo", "c1", "where do I work?", as_of=AsOf(recorded_time=before_forget))
        assert _facts(then, "employer") == [] and _edges(then, "works_at") == []
        assert not any("Initech" in e.fact_sentence for e in (await reader.memories("bo", "edges", include_history=True)).items)
        # The forgotten facts' own words are gone with them, in every section and every page.
        said = [e.user_message for e in (await reader.memories("bo", "episodes", limit=500)).items]
        assert not any("shellfish" in s or "Initech" in s for s in said)
        assert not any("shellfish" in e.user_message or "Initech" in e.user_message
                       for e in ctx.episodes + ctx.recent_turns)
        assert sum("hiking" in s for s in said) == 2  # kept on request
        assert "I live in Porto." in said
    finally:
        await reader.close()
        w.stop()


async def test_the_users_name_follows_them_into_the_graph(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("bea", "My name is Beatriz.", 0), turn("bea", "I live in Porto.", 1),
                                           turn("bea", "I work at Acme.", 2)])
    await append_and_wait(settings, conn, [turn("bea", "My name is Bia now, please.", 3),
                                           turn("bea", "I moved to Lisbon.", 4)])
    reader = await make_reader(dsn, settings, embedder)
    try:
        edges = (await reader.memories("bea", "edges", include_history=True)).items
        assert edges and not any("Beatriz" in e.fact_sentence for e in edges)
        assert (await reader.overview("bea")).profile["name"] == "Bia"
        for name in ("Beatriz", "Bia"):  # either name reaches the same person
            found = await reader.search("bea", f"Where does {name} live?", kinds=["edges"])
            assert "Lisbon" in [e.target for e in found.edges]
            # The user is "the user" in the graph, whatever their name: no sentence keeps an old one.
            assert {e.source for e in found.edges if e.relation == "lives_in"} == {"the user"}
    finally:
        await reader.close()
        w.stop()


async def test_the_offline_rules_read_the_worlds_names_and_the_ends_of_relations(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("zoe", "My name is Zoë. I live in Zürich.", 0),
                                           turn("zoe", "My dog Rex and my cat Luna are great.", 1),
                                           turn("zoe", "My friend Søren is visiting.", 2),
                                           turn("zoe", "My friend Łukasz is too.", 3)])
    await append_and_wait(settings, conn, [turn("zoe", "My dog Rex died last week.", 4),
                                           turn("zoe", "Søren and I are no longer friends.", 5)])
    reader = await make_reader(dsn, settings, embedder)
    try:
        facts = {(f.attribute, f.value) for f in (await reader.memories("zoe", "facts")).items}
        assert {("name", "Zoë"), ("home", "Zürich"), ("pet", "Luna"), ("friend", "Łukasz")} <= facts
        assert not {("pet", "Rex"), ("friend", "Søren")} & facts
        edges = {(e.relation, e.target) for e in (await reader.memories("zoe", "edges")).items}
        assert {("lives_in", "Zürich"), ("has_pet", "Luna"), ("friend_of", "Łukasz")} <= edges
        assert not {("has_pet", "Rex"), ("friend_of", "Søren")} & edges
    finally:
        await reader.close()
        w.stop()


async def test_facts_and_edges_agree_at_every_time_on_the_real_stack(settings, conn, dsn, workers, embedder):
    """The property of tests/unit/test_one_truth.py, through Kafka, formation and Postgres: random
    turns, corrections and forgets of one user each, then the user's rows checked at every time."""
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings

    from memstream.projections.agreement import disagreements
    from memstream.projections.facts.core import COLUMNS
    from memstream.projections.facts.store import from_record
    from memstream.projections.graph.store import load_user
    from memstream.streams.worker.formation.graph import user_entity_id
    from tests.unit.test_one_truth import NAMES, PLACES, SAID, STEP, EMPLOYERS
    from hypothesis import strategies as st

    w = workers()
    await w.wait_assigned()
    loop = asyncio.get_running_loop()
    reader = await make_reader(dsn, settings, embedder)
    users = iter(range(10_000))

    async def example(steps) -> list[str]:
        user = f"prop-{next(users)}"
        async with TurnLog(settings) as log:
            for i, (kind, a, b) in enumerate(steps):
                facts = [f for f in (await reader.memories(user, "facts", limit=500)).items]
                edges = [e for e in (await reader.memories(user, "edges", limit=500)).items]
                if kind == "turn":
                    text = SAID[a].format(p=PLACES[b], e=EMPLOYERS[b % len(EMPLOYERS)], n=NAMES[b])
                    await append_and_wait(settings, conn, [turn(user, text, i)])
                    continue
                if kind == "correct" and facts:
                    pos = await control.correct_fact(log, reader, user, facts[a % len(facts)].fact_id, (PLACES + NAMES)[b])
                elif kind == "forget_fact" and facts:
                    pos = await control.forget_fact(log, reader, user, facts[a % len(facts)].fact_id, keep_episodes=b)
                elif kind == "forget_edge" and edges:
                    pos = await control.forget_edge(log, reader, user, edges[a % len(edges)].edge_id)
                elif kind == "forget_turn" and (turns := (await reader.memories(user, "episodes", limit=500)).items):
                    pos = await control.forget_episode(log, reader, user, turns[a % len(turns)].episode_id)
                else:
                    continue
                assert await reader.caught_up(pos, timeout=30)
        facts = [from_record(r) for r in await conn.fetch(
            f"SELECT {', '.join(COLUMNS)} FROM memory_facts WHERE user_id = $1", user)]
        return disagreements(user, facts, await load_user(conn, user), user_entity_id(user))

    @hsettings(max_examples=15, deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))
    @given(st.lists(STEP, min_size=3, max_size=8))
    def agree(steps):
        assert asyncio.run_coroutine_threadsafe(example(steps), loop).result(timeout=300) == []

    try:
        await asyncio.to_thread(agree)
    finally:
        await reader.close()
        w.stop()
