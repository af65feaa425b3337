"""The ``FactView`` contract (``streams/worker/formation/views.py``) against both views: what formation
is shown of current facts must not depend on whether they live in Postgres (live formation) or in
memory (``memstream reform``). "stored" decisions are an earlier batch's, in the view's store
(Postgres through the real facts store); "applied" ones this batch's, given to ``apply``."""
from __future__ import annotations

import uuid
from typing import Sequence

import pytest

from memstream.projections.facts.core import MissingTarget, fold, targets
from memstream.projections.facts.store import FactStore
from memstream.schemas import Decision
from memstream.streams.worker.formation.views import NEIGHBOURS, FactView, MemoryView, PostgresView
from tests.contracts import items
from tests.contracts.items import MODEL, QUERY, added, deferred, deleted, reflected, reinforced, updated

SPLITS = ["stored", "applied", "stored then applied"]


def ids(facts) -> list[uuid.UUID]:
    return [f.fact_id for f in facts]


class FactViewContract:
    """The behaviour, once; a subclass makes a view whose store already holds some decisions."""

    async def view(self, stored: Sequence[Decision] = ()) -> FactView:
        raise NotImplementedError

    async def holding(self, stored: Sequence[Decision] = (), applied: Sequence[Decision] = ()) -> FactView:
        view = await self.view(stored)
        for d in applied:
            await view.ensure(d.user_id, targets(d))  # formation ensures the neighbours a decision may target
            view.apply(d)
        return view

    async def after(self, where: str, first: Sequence[Decision], then: Sequence[Decision]) -> FactView:
        if where == "stored":
            return await self.holding(stored=[*first, *then])
        if where == "applied":
            return await self.holding(applied=[*first, *then])
        return await self.holding(stored=first, applied=then)

    @pytest.mark.parametrize("where", ["stored", "applied"])
    async def test_an_added_fact_is_a_neighbour_of_its_user_as_it_was_decided(self, where):
        a = added(similarity=0.8)
        view = await self.holding(**{where: [a]})
        (n,) = await view.neighbours("ana", "likes", QUERY)
        assert (n.fact_id, n.text, n.category, n.attribute, n.value) == (a.fact_id, a.text, a.category, a.attribute,
                                                                           a.value)
        assert n.similarity == pytest.approx(0.8, abs=1e-5)

    @pytest.mark.parametrize("where", SPLITS)
    async def test_an_update_replaces_the_version_it_supersedes(self, where):
        old = added(attribute="home", value="Porto", category="location", similarity=0.9)
        new = updated(old, "Lisbon", similarity=0.7)  # less similar: the old one would come first
        view = await self.after(where, [old], [new])
        assert ids(await view.neighbours("ana", "home", QUERY)) == [new.fact_id]
        await view.ensure("ana", [old.fact_id, new.fact_id])
        assert (view.rows["ana", old.fact_id].status, view.rows["ana", new.fact_id].status) == ("superseded", "current")

    @pytest.mark.parametrize("where", SPLITS)
    async def test_a_deleted_fact_is_no_neighbour(self, where):
        kept, gone = added(value="tea", similarity=0.5), added(value="jazz", similarity=0.9)
        view = await self.after(where, [kept, gone], [deleted(gone)])
        assert ids(await view.neighbours("ana", "likes", QUERY)) == [kept.fact_id]

    @pytest.mark.parametrize("where", ["stored", "applied"])
    async def test_another_users_facts_are_never_neighbours(self, where):
        mine = added("ana", similarity=0.5)
        theirs = added("bo", similarity=0.99)  # nearer, same attribute
        view = await self.holding(**{where: [mine, theirs, updated(theirs, "swing", similarity=0.98)]})
        assert ids(await view.neighbours("ana", "likes", QUERY)) == [mine.fact_id]
        assert await view.neighbours("cy", "likes", QUERY) == []

    @pytest.mark.parametrize("attribute", ["same attribute", "other attribute"])
    @pytest.mark.parametrize("where", ["stored", "applied"])
    async def test_facts_of_another_embedding_model_are_never_neighbours(self, where, attribute):
        mine = added(attribute="likes", similarity=0.5)
        other = added(attribute="likes" if attribute == "same attribute" else "dislikes", similarity=0.99,
                      model="older-model")
        view = await self.holding(**{where: [mine, other]})
        assert ids(await view.neighbours("ana", "likes", QUERY)) == [mine.fact_id]

    @pytest.mark.parametrize("where", SPLITS)
    async def test_neighbours_come_most_similar_first_with_their_cosine(self, where):
        sims = [0.3, 0.9, 0.6, 0.1, 0.75]
        facts = [added(attribute=f"topic{i}", value=str(i), similarity=s) for i, s in enumerate(sims)]
        view = await self.after(where, facts[:2], facts[2:])  # split: the order interleaves store and batch
        got = await view.neighbours("ana", "topic0", QUERY)
        assert ids(got) == ids(sorted(facts, key=lambda f: -sims[facts.index(f)]))
        assert [n.similarity for n in got] == pytest.approx(sorted(sims, reverse=True), abs=1e-5)

    @pytest.mark.parametrize("where", SPLITS)
    async def test_the_nearest_facts_and_every_fact_of_the_attribute_are_neighbours(self, where):
        near = [added(value=f"band {i}", similarity=0.9 - 0.02 * i) for i in range(NEIGHBOURS + 3)]
        slot = [added(attribute="pet", value=name, similarity=0.1 + 0.01 * i) for i, name in enumerate(["cat", "dog"])]
        view = await self.after(where, near[::2] + slot[:1], near[1::2] + slot[1:])
        got = ids(await view.neighbours("ana", "pet", QUERY))
        assert set(ids(near[:NEIGHBOURS] + slot)) <= set(got)
        assert len(got) == len(set(got))

    async def test_a_nearest_fact_ended_in_this_batch_makes_room_for_the_next_nearest(self):
        near = [added(value=f"band {i}", similarity=0.9 - 0.02 * i) for i in range(NEIGHBOURS + 1)]
        view = await self.holding(stored=near, applied=[updated(near[0], "band 0, live", similarity=0.05)])
        assert set(ids(near[1:])) <= set(ids(await view.neighbours("ana", "pet", QUERY)))

    @pytest.mark.parametrize("where", SPLITS)
    async def test_ensured_rows_are_the_facts_as_the_projection_folds_them(self, where):
        likes, home, pet = added(), added(attribute="home", value="Porto"), added(attribute="pet", value="cat")
        later = [reinforced(likes), deferred(likes, "blues"), updated(home, "Lisbon"), deleted(pet)]
        view = await self.after(where, [likes, home, pet], later)
        expected: dict = {}
        fold(expected, [likes, home, pet, *later])
        await view.ensure("ana", [*(f for _, f in expected), uuid.uuid4()])  # an id nobody holds is no error
        assert {f: view.rows[f] for f in expected} == expected

    @pytest.mark.parametrize("where", ["stored", "applied"])
    async def test_ensuring_a_turn_holds_the_reflections_drawn_from_it_and_only_those(self, where):
        likes, turn, other = added(), uuid.uuid4(), uuid.uuid4()
        drawn, elsewhere = reflected([likes], [turn]), reflected([], [other, uuid.uuid4()])
        view = await self.holding(**{where: [likes, drawn, elsewhere]})
        await view.ensure("ana", [], [turn])
        assert view.rows["ana", drawn.fact_id].derived_from_turns == (turn,)
        if where == "stored" and isinstance(view, PostgresView):  # MemoryView holds every fact anyway
            assert ("ana", elsewhere.fact_id) not in view.rows

    async def test_a_decision_naming_an_unknown_fact_is_refused(self):
        view = await self.view([added()])
        ghost = updated(added(), "swing")  # supersedes a fact never decided
        await view.ensure("ana", targets(ghost))
        with pytest.raises(MissingTarget):
            view.apply(ghost)

    @pytest.mark.parametrize("where", ["stored", "applied"])
    async def test_a_decision_applied_again_changes_nothing(self, where):
        likes, home = added(), added(attribute="home", value="Porto")
        decisions = [likes, reinforced(likes), home, updated(home, "Lisbon")]
        view = await self.holding(**{where: decisions})
        await view.ensure("ana", [f for d in decisions for f in targets(d)])
        before = dict(view.rows)
        for d in [*decisions, items.entity("ana", "Acme")]:  # and a decision about no fact at all
            view.apply(d)
        assert {f: view.rows[f] for f in before} == before and view.rows["ana", likes.fact_id].observation_count == 2
        assert sorted(ids(await view.neighbours("ana", "home", QUERY))) == sorted([likes.fact_id, decisions[3].fact_id])


    @pytest.mark.parametrize("where", SPLITS)
    async def test_archived_facts_of_a_slot_are_listed_and_a_restored_one_no_more(self, where):
        chess, go = added(value="chess"), added(value="go")
        home = added(attribute="home", value="Porto", category="location")
        view = await self.after(where, [chess, go, home, items.archived(chess), items.archived(home)],
                                [items.archived(go), items.restored(chess)])
        assert ids(await view.archived("ana", "likes")) == [go.fact_id]
        assert ids(await view.archived("ana", "home")) == [home.fact_id]
        assert await view.archived("bo", "likes") == []
        assert go.fact_id not in ids(await view.neighbours("ana", "likes", QUERY))

    @pytest.mark.parametrize("where", SPLITS)
    async def test_a_fork_answers_as_its_view_and_keeps_what_it_is_given_to_itself(self, where):
        old = added(attribute="home", value="Porto", category="location", similarity=0.9)
        view = await self.after(where, [old], [added(value="tea", similarity=0.4)])
        before = ids(await view.neighbours("ana", "home", QUERY))
        fork = view.fork()
        assert ids(await fork.neighbours("ana", "home", QUERY)) == before
        new = updated(old, "Lisbon", similarity=0.7)
        await fork.ensure("ana", targets(new))
        fork.apply(new)
        assert new.fact_id in ids(await fork.neighbours("ana", "home", QUERY))
        assert ids(await view.neighbours("ana", "home", QUERY)) == before
        await view.ensure("ana", [old.fact_id])
        assert view.rows["ana", old.fact_id].current and ("ana", new.fact_id) not in view.rows
        later = added(value="jazz", similarity=0.5)
        view.apply(later)  # and what the view is given after the fork stays the view's
        assert ("ana", later.fact_id) in view.rows and ("ana", later.fact_id) not in fork.rows

    async def test_the_store_catching_up_with_applied_decisions_changes_nothing(self):
        # Formation carries a user's view across batches while the projection applies what it
        # decided: the view must answer the same before and after the store has it.
        home, likes = added(attribute="home", value="Porto", similarity=0.9), added(similarity=0.6)
        applied = [updated(home, "Lisbon", similarity=0.7), reinforced(likes), added(value="jazz", similarity=0.5)]
        view = await self.holding(stored=[home, likes], applied=applied)
        before = await view.neighbours("ana", "home", QUERY)
        await self.store(view, applied)
        assert await view.neighbours("ana", "home", QUERY) == before
        await view.ensure("ana", [home.fact_id, likes.fact_id])
        assert view.rows["ana", likes.fact_id].observation_count == 2 and not view.rows["ana", home.fact_id].current

    async def store(self, view: FactView, decisions: Sequence[Decision]) -> None:
        """``decisions`` into the view's store (as the projection applies them)."""
        raise NotImplementedError


class TestMemoryView(FactViewContract):
    async def view(self, stored=()):
        view = MemoryView(MODEL)
        for d in stored:
            view.apply(d)
        return view

    async def store(self, view, decisions):
        for d in decisions:  # the view is its own store
            view.apply(d)


class TestPostgresView(FactViewContract):
    @pytest.fixture(autouse=True)
    def _pool(self, pool):
        self._pool = pool

    async def view(self, stored=()):
        async with self._pool.acquire() as conn:
            await FactStore().apply_batch(conn, list(stored), {})
        return PostgresView(self._pool, MODEL)

    async def store(self, view, decisions):
        async with self._pool.acquire() as conn:
            await FactStore().apply_batch(conn, list(decisions), {})
