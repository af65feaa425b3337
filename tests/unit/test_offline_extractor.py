"""The offline extractor on sentences written apart from its rules (not the demo's script)."""
from datetime import datetime, timezone

import pytest

from memstream.llm.offline import extract_facts, resolve_fact
from memstream.llm.protocols import CandidateFact, ExistingFact, Operation
from memstream.schemas import TurnRecorded

AT = datetime(2026, 3, 15, 10, tzinfo=timezone.utc)


def facts(user, assistant="Okay."):
    turn = TurnRecorded.new(user_id="u", conversation_id="c", user_message=user, assistant_message=assistant, occurred_at=AT)
    return {(c.attribute, c.value, c.negated) for c in extract_facts(turn)}, extract_facts(turn)


@pytest.mark.parametrize("sentence, expected", [
    ("These days I live in Montreal with two roommates.", ("home", "Montreal")),
    ("we finally got the keys, I've just moved to Cape Town!", ("home", "Cape Town")),
    ("I'm based in Austin, Texas for now", ("home", "Austin")),
    ("I work for the city council", ("employer", "city council")),
    ("Last week I joined Mistral AI as an intern.", ("employer", "Mistral AI")),
    ("I work as a pediatric nurse.", ("role", "pediatric nurse")),
    ("My name is Jean-Luc.", ("name", "Jean-Luc")),
    ("Hello! I'm Priya and I need help with a cover letter.", ("name", "Priya")),
    ("I really enjoy board games with friends", ("likes", "board games")),
    ("I can't stand horror movies.", ("dislikes", "horror movies")),
    ("My favourite food is ramen", ("favourite_food", "ramen")),
    ("I'm vegan, just so you know.", ("diet", "vegan")),
    ("My husband Carlos is a chef.", ("partner", "Carlos")),
    ("my cat is called Pixel", ("pet", "Pixel")),
    ("I have a dog named Biscuit.", ("pet", "Biscuit")),
    ("I'm originally from Kenya.", ("origin", "Kenya")),
])
def test_extracts_the_fact_a_person_states(sentence, expected):
    found, _ = facts(sentence)
    assert (*expected, False) in found, found


@pytest.mark.parametrize("sentence, expected, absent", [
    ("Correct. I live in Leeds myself, near the park.", ("home", "Leeds"), ("home", "Leeds myself")),
    ("I'm a nurse at the same hospital, St Mary's.", ("employer", "St Mary's"), ("employer", "same hospital")),
    ("Still there: I work at that place.", None, ("employer", "that place")),
    ("I love my new flat, honestly.", None, ("likes", "new flat")),
])
def test_what_points_back_or_owns_is_not_a_value(sentence, expected, absent):
    found, _ = facts(sentence)
    assert expected is None or (*expected, False) in found, found
    assert (*absent, False) not in found, found


def test_allergies_split_into_one_fact_each():
    found, _ = facts("I am allergic to shellfish and penicillin.")
    assert {("allergy", "shellfish", False), ("allergy", "penicillin", False)} <= found


def test_negations_retract():
    assert ("employer", "Initech", True) in facts("Good news, I quit my job at Initech.")[0]
    assert ("home", "Leeds", True) in facts("I no longer live in Leeds.")[0]


def test_trips_and_birthdays_carry_the_world_time_they_refer_to():
    _, cands = facts("We're visiting Lima in July, can't wait.")
    trip = next(c for c in cands if c.attribute == "trip")
    assert trip.value == "Lima" and trip.valid_at == AT.replace(month=7, day=1, hour=0)
    _, cands = facts("My son Leo turns 4 on May 3rd.")
    bday = next(c for c in cands if c.attribute == "birthday")
    assert bday.valid_at == AT.replace(month=5, day=3, hour=0)


def test_relative_dates_are_relative_to_the_turn():
    _, cands = facts("I moved to Oslo last month.")
    home = next(c for c in cands if c.attribute == "home")
    assert home.valid_at is not None and (AT - home.valid_at).days == 30


def test_a_name_the_assistant_uses_is_inferred_not_explicit():
    _, cands = facts("Can you check my calendar?", assistant="Sure thing, Dana! Here it is.")
    assert [(c.attribute, c.value, c.explicit) for c in cands] == [("name", "Dana", False)]
    assert cands[0].confidence < 0.9


@pytest.mark.parametrize("sentence", [
    "What time is it in Tokyo?", "I think so.", "I like it.", "Thanks, that helps!",
    "Can you summarise this article about people who live in Paris?",
])
def test_questions_and_small_talk_yield_no_facts(sentence):
    assert facts(sentence)[0] == set()


def cand(attribute, value, negated=False):
    return CandidateFact(text=f"{attribute} {value}", category="x", attribute=attribute, value=value,
                         confidence=0.9, explicit=True, negated=negated)


def existing(fid, attribute, value):
    import uuid
    return ExistingFact(uuid.UUID(int=fid), f"{attribute} {value}", "x", attribute, value, 0.8)


def test_resolver_updates_single_valued_attributes_and_adds_multi_valued_ones():
    old = existing(1, "home", "Lisbon")
    assert resolve_fact(cand("home", "Berlin"), [old]).op is Operation.UPDATE
    assert resolve_fact(cand("home", "lisbon"), [old]).op is Operation.NOOP
    assert resolve_fact(cand("likes", "jazz"), [existing(2, "likes", "hiking")]).op is Operation.ADD
    assert resolve_fact(cand("home", "Lisbon", negated=True), [old]).op is Operation.DELETE
    assert resolve_fact(cand("home", "Oslo", negated=True), [old]).op is Operation.NOOP


def test_an_allergy_list_stops_where_the_clause_does():
    found, _ = facts("I'm allergic to cats but I love dogs")
    assert ("allergy", "cats", False) in found and ("allergy", "I love dogs", False) not in found


def test_a_clause_after_an_allergy_is_not_an_allergy():
    found, _ = facts("I'm allergic to peanuts, as you know.")
    assert {f for f in found if f[0] == "allergy"} == {("allergy", "peanuts", False)}


@pytest.mark.parametrize("said, at", [
    ("I moved to Lisbon next year.", datetime(9998, 12, 1, tzinfo=timezone.utc)),
    ("I moved to Lisbon last week.", datetime(2, 1, 2, tzinfo=timezone.utc)),
    ("I moved to Lisbon 999 years ago.", datetime(500, 1, 1, tzinfo=timezone.utc)),  # before year 1
])
def test_a_date_past_the_times_memstream_stores_leaves_the_fact_undated(said, at):
    from memstream.llm.offline_relations import extract_relations

    turn = TurnRecorded.new(user_id="u", conversation_id="c", user_message=said, assistant_message="Ok.", occurred_at=at)
    [fact] = extract_facts(turn)
    [relation] = extract_relations(turn)
    assert (fact.value, fact.valid_at, relation.target, relation.valid_at) == ("Lisbon", None, "Lisbon", None)


def test_a_turn_written_to_backtrack_is_read_in_one_pass():
    # An unbounded lazy group tried from every "I am a" to the end of the turn took 26 s on this one.
    from memstream.llm.offline_relations import extract_relations

    turn = TurnRecorded.new(user_id="u", conversation_id="c", user_message=("I am a " * 20_000)[:100_000],
                            assistant_message=("i work as a x " * 10_000)[:100_000], occurred_at=AT)
    assert extract_facts(turn) == [] and extract_relations(turn) == []


def test_a_page_of_endings_and_dates_is_read_in_one_pass():
    # Each ending looked for a hedge, and each date for its clause, over everything before it:
    # quadratic in a pasted page (BENCHMARKS.md has the figures).
    import concurrent.futures

    from memstream.llm.offline_relations import extract_relations

    for text in ("My dog Rex died and " * 2_500, "I moved to Lisbon last week and " * 1_600):
        turn = TurnRecorded.new(user_id="u", conversation_id="c", user_message=text[:100_000], assistant_message="ok",
                                occurred_at=AT)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a minute is ample on any CPU; quadratic is not
            pool.submit(lambda: (extract_facts(turn), extract_relations(turn))).result(timeout=60)
