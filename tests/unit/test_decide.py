"""Formation's pure decision step: near-duplicate merge and the safety gate."""
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np

from memstream.llm.protocols import CandidateFact, ExistingFact, Operation, Resolution
from memstream.projections.facts.core import fold
from memstream.schemas import (FactAdded, FactChangeDeferred, FactDeleted, FactReinforced, FactUpdated, LogPosition,
                               TurnRecorded)
from memstream.streams.worker.formation.decide import Context, decide

AT = datetime(2026, 2, 1, tzinfo=timezone.utc)
TURN = TurnRecorded.new(user_id="u", conversation_id="c", user_message="x", assistant_message="y", occurred_at=AT)
CTX = Context(turn=TURN, source=LogPosition("e", 0, 3), recorded_at=AT, extractor="x", resolver="r",
              embedding_model="m", gate_observations=3)
VEC = np.ones(384, dtype=np.float32) / np.sqrt(384)


def cand(text, category, attribute, value, explicit=True):
    return CandidateFact(text=text, category=category, attribute=attribute, value=value, confidence=0.9, explicit=explicit)


def near(fid, text, category, attribute, value, sim):
    return ExistingFact(uuid.UUID(int=fid), text, category, attribute, value, sim)


def test_an_add_that_nearly_duplicates_a_fact_of_the_same_kind_reinforces_it():
    d = decide(CTX, 0, cand("Loves jazz", "preference", "likes", "jazz"), VEC, Resolution(Operation.ADD),
               [near(1, "Likes jazz", "preference", "likes", "jazz music", 0.9)], {})
    assert isinstance(d, FactReinforced) and d.target == uuid.UUID(int=1) and "near-duplicate" in d.reason


def test_a_similar_fact_of_another_kind_is_added_not_merged():
    d = decide(CTX, 0, cand("Plans to move to Berlin", "plan", "move", "Berlin"), VEC, Resolution(Operation.ADD),
               [near(1, "Plans a trip to Berlin", "location", "trip", "Berlin", 0.9)], {})
    assert isinstance(d, FactAdded)


def _state_with_name(value="Maria"):
    state = {}
    seed = decide(CTX, 0, cand(f"Name is {value}", "identity", "name", value), VEC, Resolution(Operation.ADD), [], {})
    fold(state, [seed])
    return state, seed.fact_id


def _inferred_renames(state, fid, turns) -> list[type]:
    """Each of ``turns`` (the n-th numbered n) infers the user is called Mark: decided and folded."""
    neighbours = [ExistingFact(fid, "Name is Maria", "identity", "name", "Maria", 0.7)]
    decisions = []
    for n, turn in turns:
        ctx = Context(turn=turn, source=LogPosition("e", 0, 3 + n), recorded_at=AT, extractor="x", resolver="r",
                      embedding_model="m", gate_observations=3)
        d = decide(ctx, n, cand("Name is Mark", "identity", "name", "Mark", explicit=False), VEC,
                   Resolution(Operation.UPDATE, fid, "renamed"), neighbours, state)
        fold(state, [d])
        decisions.append(type(d))
    return decisions


def _turn() -> TurnRecorded:
    return TurnRecorded.new(user_id="u", conversation_id="c", user_message="x", assistant_message="y", occurred_at=AT)


def test_an_inferred_identity_change_is_deferred_until_observed_enough_times():
    state, fid = _state_with_name()
    decisions = _inferred_renames(state, fid, [(n, _turn()) for n in range(1, 4)])
    assert decisions == [FactChangeDeferred, FactChangeDeferred, FactUpdated]


def test_a_turn_formed_again_counts_once_at_the_safety_gate():
    state, fid = _state_with_name()
    first, second = _turn(), _turn()
    # The second turn delivered again (a crash before its position was saved).
    decisions = _inferred_renames(state, fid, [(1, first), (2, second), (2, second), (2, second)])
    assert decisions == [FactChangeDeferred] * 4 and state["u", fid].deferred == {"UPDATE:mark": 2}


def test_an_explicit_identity_change_passes_the_gate_at_once():
    state, fid = _state_with_name()
    d = decide(CTX, 1, cand("Name is Marta", "identity", "name", "Marta"), VEC, Resolution(Operation.UPDATE, fid, "x"),
               [ExistingFact(fid, "Name is Maria", "identity", "name", "Maria", 0.7)], state)
    assert isinstance(d, FactUpdated) and d.supersedes == fid


def test_a_target_the_resolver_was_not_shown_is_not_acted_on():
    state, fid = _state_with_name()
    d = decide(CTX, 1, cand("Name is Marta", "identity", "name", "Marta"), VEC,
               Resolution(Operation.DELETE, uuid.uuid4(), "guess"), [], state)
    assert isinstance(d, FactAdded) and "unknown target" in d.reason


def _state_with(text, category, attribute, value, valid_at=None):
    state = {}
    c = CandidateFact(text=text, category=category, attribute=attribute, value=value, confidence=0.9,
                      explicit=True, valid_at=valid_at)
    seed = decide(CTX, 0, c, VEC, Resolution(Operation.ADD), [], {})
    fold(state, [seed])
    return state, ExistingFact(seed.fact_id, text, category, attribute, value, 0.95)


def negated(text, category, attribute, value):
    return CandidateFact(text=text, category=category, attribute=attribute, value=value, confidence=0.9,
                         explicit=True, negated=True)


def test_a_retraction_the_resolver_calls_already_known_deletes_the_fact_instead_of_reinforcing_it():
    state, near_fact = _state_with("Lives in Lisbon", "location", "home", "Lisbon")
    for op in (Operation.NOOP, Operation.UPDATE):
        d = decide(CTX, 1, negated("Lives in Lisbon", "location", "home", "Lisbon"), VEC,
                   Resolution(op, near_fact.fact_id, "already known"), [near_fact], state)
        assert isinstance(d, FactDeleted) and d.target == near_fact.fact_id and "retracts" in d.reason


def test_a_retraction_names_its_fact_in_other_words_of_the_same_slot():
    state, near_fact = _state_with("Lives in Lisbon", "location", "home", "Lisbon, Portugal")
    d = decide(CTX, 1, negated("Lives in Lisbon", "location", "current_city", "Lisbon"), VEC,
               Resolution(Operation.DELETE, near_fact.fact_id, "forget"), [near_fact], state)
    assert isinstance(d, FactDeleted) and d.target == near_fact.fact_id


def test_a_retraction_the_resolver_pins_on_another_fact_changes_nothing():
    state, near_fact = _state_with("Lives in Lisbon", "location", "home", "Lisbon")
    for op in (Operation.NOOP, Operation.DELETE):  # not even a delete the resolver asks for
        d = decide(CTX, 1, negated("Lives in Oslo", "location", "home", "Oslo"), VEC,
                   Resolution(op, near_fact.fact_id, "similar"), [near_fact], state)
        assert d is None, op
        d = decide(CTX, 1, negated("Works at Lisbon Labs", "work", "employer", "Lisbon Labs"), VEC,
                   Resolution(op, near_fact.fact_id, "similar"), [near_fact], state)
        assert d is None, op


def test_an_explicit_retraction_of_a_constraint_passes_the_gate():
    state, near_fact = _state_with("Allergic to peanuts", "constraint", "allergy", "peanuts")
    d = decide(CTX, 1, negated("Allergic to peanuts", "constraint", "allergy", "peanuts"), VEC,
               Resolution(Operation.DELETE, near_fact.fact_id, "forget"), [near_fact], state)
    assert isinstance(d, FactDeleted)


def test_forgetting_a_trip_planned_for_next_month_ends_it_at_its_own_start_not_before():
    trip_day = AT + timedelta(days=30)
    state, near_fact = _state_with("Plans a trip to Rome", "plan", "trip", "Rome", valid_at=trip_day)
    d = decide(CTX, 1, negated("Plans a trip to Rome", "plan", "trip", "Rome"), VEC,
               Resolution(Operation.DELETE, near_fact.fact_id, "forget"), [near_fact], state)
    assert isinstance(d, FactDeleted) and d.valid_to == trip_day
