"""Reflections (Tier 3), the pure parts: a reflection ends with its sources (facts core), the
grounding of a model's sentence, the offline summariser, and the sweep's clustering."""
import asyncio
import uuid
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest

from memstream.llm.offline_reflection import OfflineReflector
from memstream.llm.structured import ReflectionAnswer, reflection_of
from memstream.llm.protocols import MalformedOutput
from memstream.projections.facts.core import fold
from memstream.schemas import FactDeleted, MemoryForgotten, ReflectionRecorded
from memstream.streams.worker.formation.reflections import ungrounded
from memstream.streams.worker.reflecting import cluster, topical, words
from tests.unit.test_facts_core import T0, added, common, updated


def liked(offset, value):
    a = added(offset, value)
    from msgspec.structs import replace
    return replace(a, attribute="likes", category="preference", text=f"Likes {value}")


def forgot(offset, kind, target=None):
    c = {k: v for k, v in common(offset).items() if k not in ("extractor", "resolver", "reason", "confidence", "explicit")}
    return MemoryForgotten(**c, kind=kind, target=target, actor="user")


def reflection(offset, sources, turns=()):
    c = common(offset)
    return ReflectionRecorded(**c, fact_id=c["decision_id"], text="Keeps coming back to one theme: hiking; camping.",
                              category="reflection", attribute="reflection", value="hiking; camping",
                              valid_from=c["recorded_at"], embedding=b"\0" * 1536, embedding_model="m",
                              sources=list(sources), turns=list(turns), sweep_id=uuid.uuid4(), prompt_version="p")


def test_a_reflection_is_a_fact_row_naming_its_sources_and_ends_when_one_is_superseded():
    a, b = liked(1, "hiking"), liked(2, "camping")
    r = reflection(3, [a.fact_id, b.fact_id])
    state = {}
    fold(state, [a, b, r])
    row = state["u", r.fact_id]
    assert (row.status, row.category, row.derived_from) == ("current", "reflection", (a.fact_id, b.fact_id))
    u = updated(4, a.fact_id, "Berlin")
    changed = fold(state, [u])
    assert state["u", r.fact_id].status == "superseded" and ("u", r.fact_id) in changed
    assert str(a.fact_id) in state["u", r.fact_id].end_reason
    assert fold(state, [u]) == {}  # delivered again: nothing more ends


def test_a_reflection_is_forgotten_with_a_forgotten_source_and_a_deletion_supersedes_it():
    a, b, c = liked(1, "hiking"), liked(2, "camping"), liked(3, "kayaking")
    r1, r2 = reflection(4, [a.fact_id, b.fact_id]), reflection(5, [b.fact_id, c.fact_id])
    state = {}
    fold(state, [a, b, c, r1, r2])
    fold(state, [forgot(6, "fact", a.fact_id)])
    assert state["u", r1.fact_id].status == "forgotten" and state["u", r2.fact_id].status == "current"
    fold(state, [FactDeleted(**common(7), target=c.fact_id, valid_to=T0)])
    assert state["u", r2.fact_id].status == "superseded"


def test_a_user_forget_forgets_their_reflections_once_with_the_user():
    a, b = liked(1, "hiking"), liked(2, "camping")
    r = reflection(3, [a.fact_id, b.fact_id])
    state = {}
    fold(state, [a, b, r])
    fold(state, [forgot(4, "user")])
    assert state["u", r.fact_id].status == "forgotten"
    assert state["u", r.fact_id].end_reason.startswith("forgotten with the user")


@pytest.mark.parametrize("text, why", [
    ("Likes hiking and camping outdoors.", None),
    ("Keeps coming back to one theme: likes hiking; likes camping.", None),
    ("Likes hiking with Maria.", "names someone"),
    ("The user likes hiking in the outdoors.", None),
    ("Enjoys hiking and camping outdoors.", None),
    ("Hikes 20 km every weekend.", "number"),
    ("Worries about taxes, deadlines and mortgage payments.", "words are in none"),
])
def test_a_sentence_is_grounded_only_in_what_its_sources_say(text, why):
    said = ungrounded(text, ["Likes hiking", "Likes camping in the outdoors"])
    assert (said is None) if why is None else (why in said)


def test_the_offline_summariser_cites_every_fact_and_is_grounded_in_them():
    facts = [liked(1, "hiking"), liked(2, "camping"), liked(3, "kayaking")]
    out = asyncio.run(OfflineReflector().reflect([f.text for f in facts]))
    assert out.cited == (0, 1, 2) and ungrounded(out.text, [f.text for f in facts]) is None
    assert out == asyncio.run(OfflineReflector().reflect([f.text for f in facts]))


def test_the_offline_summariser_sums_up_a_long_cluster_without_a_count_no_source_states():
    said = [f"Likes {v}" for v in ("hiking", "camping", "kayaking", "climbing", "sailing", "rowing", "skiing")]
    out = asyncio.run(OfflineReflector().reflect(said))
    assert out.text.endswith("likes rowing; and more.") and out.cited == tuple(range(7))
    assert ungrounded(out.text, said) is None


def test_a_model_citing_a_fact_it_was_not_shown_is_malformed():
    with pytest.raises(MalformedOutput):
        reflection_of(ReflectionAnswer(text="Likes both", cited=[0, 5]), 2)
    assert reflection_of(ReflectionAnswer(text=" Likes both ", cited=[1, 0, 1]), 2).cited == (1, 0)


def test_clustering_is_a_function_of_the_vectors_in_their_order():
    rng = np.random.default_rng(7)
    centres = [v / np.linalg.norm(v) for v in rng.normal(size=(3, 384))]
    vectors = []
    for i in range(12):
        v = centres[i % 3] + 0.03 * rng.normal(size=384)  # about 0.6 off the centre
        vectors.append(v / np.linalg.norm(v))
    groups = cluster(vectors, 0.5)
    assert sorted(sorted(g) for g in groups) == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    assert cluster(vectors, 0.5) == groups


def test_turns_alone_have_a_topic_when_a_word_runs_through_them_that_few_of_the_users_turns_hold():
    kayak = ["We tried kayaking on the lake at dawn!", "Kayaking again this weekend, the lake was calm.",
             "Thanks, that sounds great to me."]
    thanks = ["Thanks, that sounds great!", "Thanks so much, that is kind.", "Cool, thanks for that."]
    # As in anyone's turns, the words small talk shares are the commonest.
    others = [f"Thanks, that day I went to place number {n} and it was great for you." for n in range(40)] + [
        "I walked the dog in the rain, so cool."] * 20
    said = [words(t) for t in [*kayak, *thanks, *others]]
    held = Counter(w for t in said for w in t)
    assert words("Kayaking 2 km, on a Lake!") == {"kayaking", "lake"}  # folded; digits and short words out
    assert topical([words(t) for t in kayak], held, len(said), 0.05)  # "kayaking", "lake": 2 of 66 turns
    assert not topical([words(t) for t in thanks], held, len(said), 0.05)  # "thanks", "that": in most turns
    assert not topical([words(t) for t in kayak], held, len(said), 0.0)  # 0: turns alone never
    assert not topical([words(kayak[0]), *(words(t) for t in thanks)], held, len(said), 0.05)  # in 1 of 4 only
    few = [words(t) for t in kayak]  # a user of three turns: every shared word is a third of what they said
    assert not topical(few[:2], Counter(w for t in few for w in t), 3, 0.05)


class _Inventing:
    """A model that writes what its facts do not say."""

    model_id, prompt_version = "inventing", "p"

    async def reflect(self, facts):
        from memstream.llm.protocols import Reflection
        return Reflection("Is planning a trip to Patagonia with Maria.", (0, 1))


def _request(sources):
    from memstream.schemas import ReflectionCluster, ReflectRequested
    from memstream.schemas import new_event_id
    return ReflectRequested(event_id=new_event_id(), user_id="u", occurred_at=T0, actor="operator",
                            sweep_id=uuid.uuid4(), policy="reflect-v1",
                            clusters=[ReflectionCluster(sources=list(sources), observations=3)])


async def _decided(request, view, reflector, remembered=None):
    from memstream.streams.worker.formation.reflections import reflections

    async def ask(call, *args):
        return await call(*args)

    async def embed(texts):
        return [np.full(384, 1 / np.sqrt(384), dtype=np.float32) for _ in texts]

    from memstream.schemas import LogPosition
    common = dict(source_event_id=request.event_id, source=LogPosition("e", 0, 9), recorded_at=T0 + timedelta(days=9),
                  user_id="u")
    if remembered is None:
        return await reflections(request, view, reflector, ask, embed, "m", common)
    return await reflections(request, view, reflector, ask, embed, "m", common, remembered)


async def test_formation_records_a_grounded_reflection_once_and_refuses_an_invented_one():
    from memstream.schemas import FactRefused
    from memstream.streams.worker.formation.views import MemoryView

    view = MemoryView("m")
    a, b = liked(1, "hiking"), liked(2, "camping")
    for d in (a, b):
        view.apply(d)
    [made] = await _decided(_request([a.fact_id, b.fact_id]), view, OfflineReflector())
    assert isinstance(made, ReflectionRecorded) and made.sources == [a.fact_id, b.fact_id]
    assert made.extractor == "offline-reflect-v1" and view.rows["u", made.fact_id].current
    # Asked again about the same facts (a second sweep before the first was read): nothing more.
    assert await _decided(_request([a.fact_id, b.fact_id]), view, OfflineReflector()) == []
    c = liked(3, "kayaking")
    view.apply(c)
    [refused] = await _decided(_request([b.fact_id, c.fact_id]), view, _Inventing())
    assert isinstance(refused, FactRefused) and refused.refusal == "ungrounded" and "names" in refused.reason
    assert refused.text == ""  # a refusal keeps no sentence: nothing would forget it with a source
    # A fact joined the cluster since: drawn again, the new one replaces the first.
    d = liked(24 * 10, "climbing")  # ten days on, after the first reflection
    view.apply(d)
    [again] = await _decided(_request([a.fact_id, b.fact_id, d.fact_id]), view, OfflineReflector())
    assert again.replaces == [made.fact_id] and view.rows["u", made.fact_id].superseded_by == again.fact_id
    # A source ended since the sweep: too few left to reflect on.
    view.apply(FactDeleted(**common(4), target=c.fact_id, valid_to=T0))
    assert await _decided(_request([a.fact_id, c.fact_id]), view, OfflineReflector()) == []


def test_forgetting_a_source_that_ended_before_forgets_the_reflection_it_had_ended():
    a, b = liked(1, "hiking"), liked(2, "camping")
    r = reflection(3, [a.fact_id, b.fact_id])
    state = {}
    fold(state, [a, b, r, updated(4, a.fact_id, "Berlin")])
    assert state["u", r.fact_id].status == "superseded"
    fold(state, [forgot(5, "fact", a.fact_id)])
    assert state["u", r.fact_id].status == "forgotten" and "forgotten" in state["u", r.fact_id].end_reason


def test_a_reflection_drawn_again_from_more_facts_replaces_the_one_before():
    from msgspec.structs import replace
    a, b, c = liked(1, "hiking"), liked(2, "camping"), liked(3, "kayaking")
    r1 = reflection(4, [a.fact_id, b.fact_id])
    r2 = replace(reflection(5, [a.fact_id, b.fact_id, c.fact_id]), replaces=[r1.fact_id])
    state = {}
    fold(state, [a, b, c, r1, r2])
    old, new = state["u", r1.fact_id], state["u", r2.fact_id]
    assert (old.status, old.superseded_by, new.status) == ("superseded", r2.fact_id, "current")
    assert fold(state, [r2]) == {}


def test_a_corrected_reflection_still_ends_with_its_sources():
    from memstream.schemas import FactUpdated
    a, b = liked(1, "hiking"), liked(2, "camping")
    r = reflection(3, [a.fact_id, b.fact_id])
    c = common(4)
    fixed = FactUpdated(**c, fact_id=c["decision_id"], supersedes=r.fact_id, text="Loves the outdoors",
                        category="reflection", attribute="reflection", value="outdoors", valid_from=T0,
                        embedding=b"\0" * 1536, embedding_model="m")
    state = {}
    fold(state, [a, b, r, fixed])
    assert state["u", fixed.fact_id].derived_from == (a.fact_id, b.fact_id)
    fold(state, [forgot(5, "fact", b.fact_id)])
    assert state["u", fixed.fact_id].status == "forgotten"
