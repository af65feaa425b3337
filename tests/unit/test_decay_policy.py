"""The decay policy and the facts core's archive and restore, pure: which facts fade, how fast,
what holds them up, and that an archive or a restore delivered again changes nothing."""
from __future__ import annotations

import uuid

import pytest

from memstream.projections.facts import core, decay
from memstream.projections.facts.core import EndedTarget
from tests.contracts import items


@pytest.mark.parametrize("category, attribute", [("identity", "name"), ("constraint", "allergy"),
                                                 ("location", "home"), ("work", "employer"), ("preference", "favourite_food")])
def test_who_the_user_is_what_they_must_avoid_and_their_profile_never_fade(category, attribute):
    assert not decay.decays(category, attribute)
    assert decay.strength(category=category, attribute=attribute, confidence=0.5, observations=1, uses=0,
                          idle_days=10_000).strength == 1.0


def test_a_preference_fades_over_years_a_plan_over_months_and_use_and_mentions_hold_them_up():
    def s(category, days, observations=1, uses=0):
        return decay.strength(category=category, attribute="x", confidence=0.9, observations=observations,
                              uses=uses, idle_days=days).strength

    assert s("preference", 365) > 0.4 and s("preference", 3 * 365) < 0.2
    assert s("plan", 60) > 0.4 and s("plan", 365) < 0.05
    assert s("preference", 3 * 365, observations=4) > 0.2 and s("preference", 3 * 365, uses=4) > 0.2
    assert s("preference", -5) == pytest.approx(0.9)  # a clock behind the fact: not stronger than new


def test_archive_and_restore_fold_once_and_an_ended_fact_is_not_archived():
    added = items.added("ana", value="chess")
    state = {}
    core.fold(state, [added])
    archive, restore = items.archived(added), items.restored(added)
    row = core.fold(state, [archive])[("ana", added.fact_id)]
    assert row.status == "archived" and row.valid_to is None and row.superseded_at is None
    assert not core.fold(state, [archive])  # delivered again
    row = core.fold(state, [restore])[("ana", added.fact_id)]
    assert row.status == "current" and row.observation_count == 2
    assert not core.fold(state, [archive, restore])  # both again, after the restore: nothing
    deleted = items.deleted(added)
    core.fold(state, [deleted])
    with pytest.raises(EndedTarget):
        core.fold(state, [items.archived(added, uuid.UUID(int=9))])


def test_an_archived_fact_is_believed_still_so_it_is_corrected_or_retracted_as_a_current_one():
    added, other = items.added("ana", value="chess"), items.added("ana", value="go")
    state = {}
    core.fold(state, [added, other, items.archived(added), items.archived(other)])
    corrected = core.fold(state, [items.updated(added, "checkers")])
    assert {r.value: r.status for r in corrected.values()} == {"chess": "superseded", "checkers": "current"}
    retracted = core.fold(state, [items.deleted(other)])[("ana", other.fact_id)]
    assert retracted.status == "deleted" and retracted.valid_to is not None


def test_a_facts_idle_time_runs_from_when_it_was_said_never_after_it_was_logged():
    import msgspec

    from datetime import timedelta

    said = items.added("ana", value="chess")
    backfilled = msgspec.structs.replace(said, said_at=said.recorded_at - timedelta(days=700))
    row = core.fold({}, [backfilled])[("ana", said.fact_id)]
    assert row.last_said_at == said.recorded_at - timedelta(days=700)  # a backfill ages by its own dates
    ahead = msgspec.structs.replace(said, said_at=said.recorded_at + timedelta(days=700))
    assert core.fold({}, [ahead])[("ana", said.fact_id)].last_said_at == said.recorded_at  # never ahead of the log
    assert core.fold({}, [said])[("ana", said.fact_id)].last_said_at == said.recorded_at  # recorded before said_at
    # Observed again in a turn dated earlier than the last one: the later said time stays.
    state = {}
    core.fold(state, [backfilled])
    again = msgspec.structs.replace(items.reinforced(said), said_at=said.recorded_at - timedelta(days=900))
    assert core.fold(state, [again])[("ana", said.fact_id)].last_said_at == said.recorded_at - timedelta(days=700)


def test_a_sweep_archives_only_a_fact_of_the_kind_it_weighed():
    """A reform's extractor may give a weighed fact's id (its place in its turn) to another
    candidate: a sweep request re-decided then must not archive one that never decays."""
    from datetime import datetime, timezone

    from memstream.schemas import DecaySwept, LogPosition, SweptFact
    from memstream.schemas.events import new_event_id
    from memstream.streams.worker.sweeping import archivals

    jazz, allergy = items.added("ana", "likes", "jazz"), items.added("bo", "allergy", "peanuts", category="constraint")
    state = {}
    core.fold(state, [jazz, allergy])
    at = datetime(2027, 1, 1, tzinfo=timezone.utc)
    weighed = decay.rate("preference", "likes")

    def swept(user, fact_id):
        return DecaySwept(event_id=new_event_id(), user_id=user, occurred_at=at, actor="operator", sweep_id=uuid.uuid4(),
                          policy=decay.POLICY, facts=[SweptFact(fact_id=fact_id, strength=0.1, observations=1, uses=0,
                                                                idle_days=900, rate=weighed)])

    def common(user):
        return dict(source_event_id=uuid.uuid4(), source=LogPosition("e", 0, 1), recorded_at=at, user_id=user)

    assert [a.target for a in archivals(swept("ana", jazz.fact_id), state, common("ana"))] == [jazz.fact_id]
    assert archivals(swept("bo", allergy.fact_id), state, common("bo")) == []  # a constraint: never decays


def test_a_sweep_looks_ahead_only_in_a_dry_run():
    from datetime import datetime, timedelta, timezone

    from memstream.schemas.errors import InvalidArgument
    from memstream.cli.consolidate import sweep_time

    ahead, past = datetime.now(timezone.utc) + timedelta(days=365), datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert sweep_time(ahead, dry_run=True) == ahead and sweep_time(past, dry_run=False) == past
    assert sweep_time(None, dry_run=False) is None and sweep_time(datetime(2026, 1, 1), True) == past  # UTC if no offset
    with pytest.raises(InvalidArgument, match="only a --dry-run may look ahead"):
        sweep_time(ahead, dry_run=False)
