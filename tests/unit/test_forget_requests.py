"""An explicit request to forget a memory deletes the fact it names: never a reinforcement, never
an addition, and through the safety gate for identity and constraint facts too."""
from datetime import datetime, timedelta, timezone

import pytest

from memstream.llm.offline import extract_facts, resolve_fact
from memstream.llm.offline_relations import extract_relations
from memstream.llm.protocols import GATED_CATEGORIES, ExistingFact, Operation
from memstream.schemas import FactDeleted, FactReinforced
from tests.unit.pipeline import Memory, turn

AT = datetime(2026, 12, 1, 7, 47, tzinfo=timezone.utc)

REQUESTS = [
    ("Please forget that I live in Lisbon, delete that memory.", "I live in Lisbon.", "home", "Lisbon"),
    ("Please delete the memory that I like jazz.", "I like jazz.", "likes", "jazz"),
    ("Don't remember that I work at Initech.", "I work at Initech.", "employer", "Initech"),
    ("Forget that I'm allergic to peanuts.", "I'm allergic to peanuts.", "allergy", "peanuts"),
    ("Can you forget that my name is Maria?", "My name is Maria.", "name", "Maria"),
    ("Delete the fact that I'm vegetarian.", "I'm vegetarian.", "diet", "vegetarian"),
    ("Could you erase the memory that I have a dog named Rex?", "I have a dog named Rex.", "pet", "Rex"),
    ("I'd like you to stop remembering that I live in Lisbon.", "I live in Lisbon.", "home", "Lisbon"),
    ("Forget I said I live in Lisbon.", "I live in Lisbon.", "home", "Lisbon"),
    ("Please forget where I live.", "I live in Lisbon.", "home", ""),
    ("Forget my name, please.", "My name is Maria.", "name", ""),
]


@pytest.mark.parametrize("request_, _stated, attribute, value", REQUESTS)
def test_a_forget_request_is_a_negated_explicit_candidate_and_nothing_to_learn(request_, _stated, attribute, value):
    cands = extract_facts(turn(request_, AT))
    assert [(c.attribute, c.value, c.negated, c.explicit) for c in cands] == [(attribute, value, True, True)]
    assert cands[0].valid_at is None  # forgotten as of the request
    assert not [r for r in extract_relations(turn(request_, AT)) if not r.negated]


@pytest.mark.parametrize("request_, stated, attribute, value", REQUESTS)
def test_a_forget_request_deletes_the_matching_fact_even_in_a_gated_category(request_, stated, attribute, value):
    memory = Memory()
    memory.say(stated, AT - timedelta(days=3))
    (fact,) = memory.versions(attribute)
    cand = extract_facts(turn(request_, AT))[0]
    near = [ExistingFact(fact.fact_id, fact.text, fact.category, fact.attribute, fact.value, 0.9)]
    resolution = resolve_fact(cand, near)
    assert (resolution.op, resolution.target) == (Operation.DELETE, fact.fact_id)

    out = memory.say(request_, AT)
    facts = [d for d in out if not type(d).__name__.startswith(("Entity", "Edge", "Alias"))]
    assert [type(d) for d in facts] == [FactDeleted] and facts[0].explicit
    (fact,) = memory.versions(attribute)
    assert fact.status == "deleted" and fact.observation_count == 1 and fact.valid_to == AT
    assert not any(isinstance(d, FactReinforced) for d in memory.decisions)


def test_gated_categories_are_among_those_forgotten_at_once():
    memory = Memory()
    for request_, stated, _, _ in REQUESTS:
        memory.say(stated, AT - timedelta(days=3))
        memory.say(request_, AT)
    deleted = {r.category for r in memory.facts.values() if r.status == "deleted"}
    assert GATED_CATEGORIES <= deleted
    assert not [r for r in memory.facts.values() if r.current]


def test_forgetting_where_i_live_closes_the_home_edge_and_opens_none():
    memory = Memory()
    memory.say("I live in Lisbon.", AT - timedelta(days=3))
    memory.say("Please forget that I live in Lisbon, delete that memory.", AT)
    (edge,) = memory.edges("lives_in")
    assert edge.valid_to == AT


def test_the_rest_of_a_sentence_with_a_forget_request_is_still_learned():
    cands = extract_facts(turn("I moved to Porto, so forget that I live in Lisbon.", AT))
    assert {(c.value, c.negated) for c in cands} == {("Porto", False), ("Lisbon", True)}


@pytest.mark.parametrize("sentence", [
    "Don't forget that I'm allergic to peanuts.", "Please never forget that I'm allergic to peanuts.",
    "Sometimes I forget that I live in Lisbon.",
])
def test_a_reminder_not_to_forget_is_learned_not_retracted(sentence):
    assert all(not c.negated for c in extract_facts(turn(sentence, AT)))
    assert extract_facts(turn(sentence, AT))


def test_a_request_to_delete_something_else_retracts_nothing():
    cands = extract_facts(turn("Delete that file, I live in Lisbon now.", AT))
    assert [(c.attribute, c.value, c.negated) for c in cands] == [("home", "Lisbon", False)]


def test_forgetting_a_fact_not_held_changes_nothing():
    memory = Memory()
    memory.say("I live in Lisbon.", AT - timedelta(days=3))
    assert memory.say("Forget that I'm allergic to peanuts.", AT) == []
    assert [r.status for r in memory.facts.values()] == ["current"]
