"""Cold episodes, the pure parts: what a sweep's requests carry, what the episodes core makes of
its decision, and the records' own rules (each names something)."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import msgspec
import pytest

from memstream.projections.episodes import core as episodes
from memstream.schemas import DecaySwept, EpisodesSwept, InvalidEvent, MemoriesUsed, decode_event, encode, new_event_id
from memstream.streams.worker.sweeping import PER_REQUEST, Plan, moved, requests
from tests.contracts import items

AT = datetime(2027, 1, 1, tzinfo=timezone.utc)


def test_a_use_or_a_sweep_that_names_nothing_is_refused_at_the_edge_and_on_the_wire():
    with pytest.raises(ValueError, match="names no fact and no episode"):
        MemoriesUsed(event_id=new_event_id(), user_id="u", occurred_at=AT)
    with pytest.raises(ValueError, match="names no fact and no episode"):
        DecaySwept(event_id=new_event_id(), user_id="u", occurred_at=AT, actor="operator", sweep_id=uuid.uuid4(),
                   policy="decay-v1")
    used = MemoriesUsed(event_id=new_event_id(), user_id="u", occurred_at=AT, episode_ids=[uuid.uuid4()])
    assert decode_event(encode(used)) == used
    empty = msgspec.json.encode({**msgspec.to_builtins(used), "episode_ids": []})
    with pytest.raises(InvalidEvent):
        decode_event(empty)


def test_a_users_facts_and_episodes_go_in_requests_of_at_most_per_request_each():
    found = Plan(sweep_id=uuid.uuid4(), swept_at=AT, threshold=0.2, cold_after_days=365)
    found.cooled = {"ana": [uuid.uuid4() for _ in range(PER_REQUEST + 1)], "bo": [uuid.uuid4()]}
    found.warmed = {"cy": [uuid.uuid4()]}
    asked = requests(found)
    assert [(r.user_id, len(r.facts), len(r.cooled), len(r.warmed)) for r in asked] == [
        ("ana", 0, PER_REQUEST, 0), ("ana", 0, 1, 0), ("bo", 0, 1, 0), ("cy", 0, 0, 1)]
    assert all(r.occurred_at == AT and r.sweep_id == found.sweep_id for r in asked)
    assert [r["cooling"] for r in found.as_dict()["episodes"]] == [PER_REQUEST + 1, 1, 0]


def test_a_request_becomes_one_decision_and_the_core_keeps_the_first_cooling():
    said = items.episode("ana", "I adopted a greyhound.")
    row = episodes.apply(said)
    request = DecaySwept(event_id=new_event_id(), user_id="ana", occurred_at=AT, actor="operator",
                         sweep_id=uuid.uuid4(), policy="decay-v1", cooled=[row.episode_id])
    common = dict(source_event_id=request.event_id, source=said.source, recorded_at=AT, user_id="ana")
    [d] = moved(request, common)
    assert isinstance(d, EpisodesSwept) and d.swept_at == AT and d.cooled == [row.episode_id]
    assert moved(request, common) == [d]  # derived from the request: the same decision again
    cold = episodes.swept(row, d)
    assert cold.cooled_at == AT
    later = msgspec.structs.replace(d, swept_at=AT + timedelta(days=1))
    assert episodes.swept(cold, later) == cold  # a later sweep naming it again keeps its first time
    back = msgspec.structs.replace(d, cooled=[], warmed=[row.episode_id])
    assert episodes.swept(cold, back).cooled_at is None
    assert episodes.swept(row, back) == row


def test_the_workers_metrics_count_the_episodes_a_sweep_moved_each_way():
    from memstream.streams.worker.metrics import WorkerMetrics

    said = items.episode("ana", "I adopted a greyhound.")
    d = EpisodesSwept(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), source=said.source, recorded_at=AT,
                      user_id="ana", sweep_id=uuid.uuid4(), swept_at=AT, cooled=[uuid.uuid4(), uuid.uuid4()],
                      warmed=[uuid.uuid4()])
    metrics = WorkerMetrics()
    metrics.decided([d])
    value = metrics.registry.get_sample_value
    assert value("memstream_episodes_moved_total", {"to": "cold"}) == 2
    assert value("memstream_episodes_moved_total", {"to": "hot"}) == 1
    assert value("memstream_decisions_total", {"kind": "EpisodesSwept"}) == 1
