"""Reflections drawn from the user's own words as well as their facts: a turn no fact was read
from may join a cluster; the reflection names it, is forgotten with it, and formation reads it
from the episodes projection (a turn forgotten since the sweep is not there)."""
import asyncio
import uuid
from datetime import timedelta

import msgspec
import pytest
from msgspec.structs import replace

from memstream.llm.offline_reflection import OfflineReflector
from memstream.projections.facts.core import fold
from memstream.schemas import FactRefused, ReflectionCluster, ReflectionRecorded, ReflectRequested, new_event_id
from memstream.streams.worker.formation.reflections import Turn, ungrounded
from memstream.streams.worker.formation.views import MemoryView
from memstream.streams.worker.reflecting import POLICY
from tests.unit.test_facts_core import T0, common
from tests.unit.test_reflections import _Inventing, _decided, forgot, liked, reflection

RAN = ("Went for a long run by the river this morning. It was cold but lovely, and I want to keep it "
       "going all winter long if my knees let me.")
SORE = "My legs are sore after the long run."


def _turn(hours: int, text: str) -> Turn:
    at = T0 + timedelta(hours=hours)
    return Turn(uuid.uuid4(), text, at, at)


def _request(sources=(), turns=(), policy=POLICY):
    return ReflectRequested(event_id=new_event_id(), user_id="u", occurred_at=T0, actor="operator",
                            sweep_id=uuid.uuid4(), policy=policy,
                            clusters=[ReflectionCluster(sources=list(sources), turns=list(turns), observations=3)])


def _remembering(*turns: Turn):
    held = {t.turn_id: t for t in turns}

    async def remembered(user_id, ids):
        assert user_id == "u"
        return {i: held[i] for i in ids if i in held}
    return remembered


def test_a_cluster_names_two_memories_or_more_all_told_on_the_wire_too():
    one = uuid.uuid4()
    with pytest.raises(ValueError):
        ReflectionCluster(sources=[one], observations=3)
    assert ReflectionCluster(sources=[], turns=[one, uuid.uuid4()], observations=2).turns[0] == one
    wire = msgspec.json.decode(msgspec.json.encode(_request(turns=[one, uuid.uuid4()])))
    wire["clusters"][0]["turns"] = [str(one)]
    with pytest.raises(msgspec.ValidationError, match="fewer than two"):
        msgspec.json.decode(msgspec.json.encode(wire), type=ReflectRequested)


def test_the_offline_summariser_lists_a_long_turn_by_its_first_words_and_stays_grounded_in_it():
    said = ["Wow! " + RAN, SORE]  # "Wow!" says nothing: the next sentence is listed
    out = asyncio.run(OfflineReflector().reflect(said))
    assert out.text == ("Keeps coming back to one theme: went for a long run by the river this morning; "
                        "my legs are sore after the long run.")
    assert out.cited == (0, 1) and ungrounded(out.text, said) is None


def test_a_reflection_drawn_from_a_turn_is_forgotten_with_it_even_when_the_turn_keeps_its_facts():
    a = liked(1, "running")
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    r = reflection(3, [a.fact_id], [t1, t2])
    state = {}
    fold(state, [a, r])
    assert state["u", r.fact_id].derived_from_turns == (t1, t2)
    gone = replace(forgot(4, "episode", t2), keep_derived=True)
    changed = fold(state, [gone])
    assert state["u", r.fact_id].status == "forgotten" and str(t2) in state["u", r.fact_id].end_reason
    assert state["u", a.fact_id].status == "current" and ("u", r.fact_id) in changed
    assert fold(state, [gone]) == {}  # delivered again: nothing more


async def test_formation_draws_a_reflection_from_a_fact_and_turns_it_reads_and_cites_each_by_kind():
    view = MemoryView("m")
    a = liked(1, "running")
    view.apply(a)
    ran, sore = _turn(2, RAN), _turn(3, SORE)
    request = _request([a.fact_id], [ran.turn_id, sore.turn_id])
    [made] = await _decided(request, view, OfflineReflector(), _remembering(ran, sore))
    assert isinstance(made, ReflectionRecorded)
    assert (made.sources, made.turns) == ([a.fact_id], [ran.turn_id, sore.turn_id])
    assert "likes running" in made.text and "my legs are sore" in made.text and made.confidence == 0.9
    assert made.valid_from == sore.occurred_at and "1 facts and 2 turns said 3 times" in made.reason
    # Asked again before a memory joined: nothing more; a turn forgotten since leaves one: nothing.
    assert await _decided(request, view, OfflineReflector(), _remembering(ran, sore)) == []
    assert await _decided(_request([a.fact_id], [ran.turn_id, sore.turn_id]), view, OfflineReflector(),
                          _remembering()) == []
    # Drawn again with a turn more, the new one replaces the first.
    later = _turn(24 * 10, "Another run today, ten laps of the park.")
    [again] = await _decided(_request([a.fact_id], [ran.turn_id, sore.turn_id, later.turn_id]), view,
                             OfflineReflector(), _remembering(ran, sore, later))
    assert again.replaces == [made.fact_id] and view.rows["u", made.fact_id].status == "superseded"


async def test_turns_alone_the_sweep_found_a_topic_in_are_reflected_on_and_a_cluster_whose_fact_ended_is_not():
    ran, sore = _turn(2, RAN), _turn(3, SORE)
    [made] = await _decided(_request([], [ran.turn_id, sore.turn_id]), MemoryView("m"), OfflineReflector(),
                            _remembering(ran, sore))
    assert isinstance(made, ReflectionRecorded) and (made.sources, made.turns) == ([], [ran.turn_id, sore.turn_id])
    assert "my legs are sore" in made.text and "0 facts and 2 turns said 2 times" in made.reason
    # Turns alone of an earlier sweep, which did not ask them for a topic (a reform forming it again): none.
    assert await _decided(_request([], [ran.turn_id, sore.turn_id], policy="reflect-v2"), MemoryView("m"),
                          OfflineReflector(), _remembering(ran, sore)) == []
    view = MemoryView("m")
    a = liked(1, "running")
    view.apply(a)
    view.apply(forgot(4, "fact", a.fact_id))  # the sweep saw a fact in the cluster: without it, not asked
    assert await _decided(_request([a.fact_id], [ran.turn_id, sore.turn_id]), view, OfflineReflector(),
                          _remembering(ran, sore)) == []


def test_a_reflection_made_from_turns_only_is_a_fact_row_naming_them():
    c = common(5)
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    r = ReflectionRecorded(**c, fact_id=c["decision_id"], text="Runs by the river.", category="reflection",
                           attribute="reflection", value="Runs by the river.", valid_from=T0,
                           embedding=b"\0" * 1536, embedding_model="m", sources=[], turns=[t1, t2],
                           sweep_id=uuid.uuid4(), prompt_version="p")
    state = {}
    fold(state, [r])
    row = state["u", r.fact_id]
    assert (row.derived_from, row.derived_from_turns, row.status) == ((), (t1, t2), "current")


class _TurnsOnly:
    """A model that cites the cluster's turns and not its fact."""

    model_id, prompt_version = "turns-only", "p"

    async def reflect(self, memories):
        from memstream.llm.protocols import Reflection
        return Reflection("Went for a long run by the river.", (1, 2))


@pytest.mark.parametrize("model, why", [(_Inventing(), "names someone"), (_TurnsOnly(), "none of its facts")])
async def test_a_sentence_beyond_what_it_cites_or_citing_none_of_its_facts_is_refused(model, why):
    view = MemoryView("m")
    a = liked(1, "running")
    view.apply(a)
    ran, sore = _turn(2, RAN), _turn(3, SORE)
    [refused] = await _decided(_request([a.fact_id], [ran.turn_id, sore.turn_id]), view, model,
                               _remembering(ran, sore))
    assert isinstance(refused, FactRefused) and refused.refusal == "ungrounded" and refused.text == ""
    assert why in refused.reason
