"""The facts projection's pure core: versions, supersession, deletion, idempotency."""
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from msgspec.structs import replace

from memstream.projections.facts.core import EndedTarget, MissingTarget, apply, fold, lineages
from memstream.schemas import (FactAdded, FactChangeDeferred, FactDeleted, FactReinforced, FactUpdated, MemoryForgotten,
                               LogPosition)
from memstream.schemas.events import new_event_id

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def common(offset, **kw):
    ev = new_event_id()
    return dict(decision_id=uuid.uuid5(ev, "fact:0"), source_event_id=ev, source=LogPosition("e", 0, offset),
                recorded_at=T0 + timedelta(hours=offset), user_id="u", extractor="x", resolver="r",
                reason="because", confidence=0.9, explicit=True, **kw)


def added(offset, value="Lisbon"):
    c = common(offset)
    return FactAdded(**c, fact_id=c["decision_id"], text=f"Lives in {value}", category="location", attribute="home",
                     value=value, valid_from=c["recorded_at"], embedding=b"\0" * 1536, embedding_model="m")


def updated(offset, old, value="Berlin"):
    c = common(offset)
    return FactUpdated(**c, fact_id=c["decision_id"], supersedes=old, text=f"Lives in {value}", category="location",
                       attribute="home", value=value, valid_from=c["recorded_at"] - timedelta(days=2),
                       embedding=b"\0" * 1536, embedding_model="m")


def test_an_update_ends_the_old_version_and_starts_the_next_in_the_same_lineage():
    a = added(1)
    state = {}
    fold(state, [a])
    u = updated(50, a.fact_id)  # dated two days back: still after the old version began
    fold(state, [u])
    old, new = state["u", a.fact_id], state["u", u.fact_id]
    assert (old.status, new.status) == ("superseded", "current")
    assert (old.version, new.version) == (1, 2) and new.lineage_id == old.lineage_id == a.fact_id
    assert old.superseded_at == u.recorded_at and old.valid_to == u.valid_from and old.superseded_by == u.fact_id


def test_every_decision_is_idempotent():
    a = added(1)
    state = {}
    fold(state, [a])
    r = FactReinforced(**common(2), target=a.fact_id)
    d = FactDeleted(**common(3), target=a.fact_id, valid_to=T0)
    once = dict(fold(dict(state), [r, d]))
    state2 = dict(state)
    fold(state2, [r, r, d, d, a])
    assert state2["u", a.fact_id] == once["u", a.fact_id]
    assert state2["u", a.fact_id].observation_count == 2 and state2["u", a.fact_id].status == "deleted"


def test_deferred_changes_are_counted_per_operation_and_value():
    a = added(1)
    state = {}
    fold(state, [a])
    for i, value in enumerate(["Mark", "mark", "Paul"]):
        fold(state, [FactChangeDeferred(**common(2 + i), target=a.fact_id, operation="UPDATE", value=value, text=value)])
    assert state["u", a.fact_id].deferred == {"UPDATE:mark": 2, "UPDATE:paul": 1}
    assert state["u", a.fact_id].status == "current"


def test_a_decision_about_an_unknown_fact_is_refused():
    with pytest.raises(MissingTarget):
        apply({}, FactDeleted(**common(1), target=uuid.uuid4(), valid_to=T0))


def test_an_update_dated_before_the_old_version_began_ends_the_old_one_at_its_own_start():
    # "I live in Porto", then a minute later "I moved to Lisbon last week".
    a = added(1, "Porto")
    u = updated(2, a.fact_id, "Lisbon")  # valid_from two days before Porto's
    state = {}
    fold(state, [a, u])
    old, new = state["u", a.fact_id], state["u", u.fact_id]
    assert u.valid_from < a.valid_from
    assert old.valid_to == old.valid_from == a.valid_from and new.valid_from == u.valid_from


def test_an_update_dated_before_older_versions_ended_ends_them_where_it_begins():
    # Porto, then Lisbon from June; then "I have lived in Madrid since March": Porto ends in
    # March and Lisbon never held, so no two versions of the fact hold at one time.
    porto = added(1, "Porto")
    lisbon = replace(updated(2000, porto.fact_id, "Lisbon"), valid_from=T0 + timedelta(days=150))
    madrid = replace(updated(4000, lisbon.fact_id, "Madrid"), valid_from=T0 + timedelta(days=60))
    state = {}
    fold(state, [porto, lisbon])
    assert lineages(state, madrid) == [("u", porto.fact_id)]
    fold(state, [madrid])
    versions = sorted(state.values(), key=lambda r: r.version)
    assert [(r.value, r.valid_from, r.valid_to) for r in versions] == [
        ("Porto", porto.valid_from, madrid.valid_from), ("Lisbon", lisbon.valid_from, lisbon.valid_from),
        ("Madrid", madrid.valid_from, None)]
    assert versions[0].superseded_by == lisbon.fact_id  # what ended it is still what it was
    assert fold(state, [madrid]) == {}  # delivered again: nothing changes


def test_an_update_dated_after_every_version_began_leaves_the_older_ones_as_they_ended():
    porto = added(1, "Porto")
    lisbon = updated(100, porto.fact_id, "Lisbon")
    state = {}
    fold(state, [porto, lisbon])
    madrid = updated(200, lisbon.fact_id, "Madrid")
    assert set(fold(state, [madrid])) == {("u", lisbon.fact_id), ("u", madrid.fact_id)}  # Porto unchanged


def test_a_deletion_dated_before_the_version_began_ends_it_at_its_own_start():
    a = added(5)
    state = {}
    fold(state, [a, FactDeleted(**common(6), target=a.fact_id, valid_to=T0)])  # an old log's bad close
    row = state["u", a.fact_id]
    assert row.status == "deleted" and row.valid_to == row.valid_from == a.valid_from


def test_a_deletion_dated_after_the_version_began_ends_it_then():
    a = added(5)
    state = {}
    fold(state, [a, FactDeleted(**common(6), target=a.fact_id, valid_to=T0 + timedelta(hours=7))])
    assert state["u", a.fact_id].valid_to == T0 + timedelta(hours=7)


@pytest.mark.parametrize("second", [
    lambda old: updated(60, old, "Rome"),
    lambda old: FactDeleted(**common(60), target=old, valid_to=T0 + timedelta(days=3)),
    lambda old: FactReinforced(**common(60), target=old),
    lambda old: FactChangeDeferred(**common(60), target=old, operation="UPDATE", value="Rome", text="Lives in Rome"),
])
def test_a_decision_changing_a_version_that_already_ended_is_refused(second):
    # Two decisions ending one version: applied, the lineage would have two current versions.
    a = added(1)
    state = {}
    fold(state, [a, updated(50, a.fact_id)])
    before = dict(state)
    with pytest.raises(EndedTarget, match="already superseded"):
        apply(state, second(a.fact_id))
    assert state == before


def test_a_forgotten_fact_stays_forgotten_whatever_decision_comes_after():
    a = added(1)
    c = common(2)
    forget = MemoryForgotten(decision_id=c["decision_id"], source_event_id=c["source_event_id"], source=c["source"],
                             recorded_at=c["recorded_at"], user_id="u", kind="fact", target=a.fact_id, actor="user")
    state = {}
    fold(state, [a, forget])
    after = [updated(60, a.fact_id), FactDeleted(**common(61), target=a.fact_id, valid_to=T0 + timedelta(days=3)),
             FactReinforced(**common(62), target=a.fact_id)]
    assert fold(state, after) == {} and state["u", a.fact_id].status == "forgotten"


def test_a_reinforcement_delivered_again_after_its_fact_was_superseded_changes_nothing():
    a = added(1)
    r = FactReinforced(**common(2), target=a.fact_id)
    state = {}
    fold(state, [a, r, updated(50, a.fact_id)])
    assert fold(state, [r]) == {}
