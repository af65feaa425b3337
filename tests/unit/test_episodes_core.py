import uuid
from datetime import datetime, timezone

import numpy as np

from memstream.projections.episodes import core
from memstream.schemas import EpisodeRecorded, LogPosition
from memstream.schemas.events import new_event_id


def decision(event_id=None, partition=1, offset=7):
    event_id = event_id or new_event_id()
    return EpisodeRecorded(
        decision_id=uuid.uuid5(event_id, "episode"), source_event_id=event_id,
        source=LogPosition("ev", partition, offset), recorded_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
        user_id="u", conversation_id="c", occurred_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
        user_message="hi", assistant_message="hello", embedding=np.ones(384, "<f4").tobytes(),
        embedding_model="m")


def test_apply_is_a_pure_function_of_the_decision():
    d = decision()
    assert core.apply(d) == core.apply(d)
    assert core.apply(d).episode_id == uuid.uuid5(d.source_event_id, "episode")


def test_episodes_and_nothing_decided_mark_how_far_the_events_topic_is_covered_and_other_decisions_do_not():
    from memstream.projections.positions import events_covered
    from memstream.schemas import FactReinforced, NothingDecided

    eid = new_event_id()
    skipped = NothingDecided(decision_id=uuid.uuid5(eid, "nothing-decided"), source_event_id=eid,
                             source=LogPosition("ev", 3, 11), recorded_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
                             user_id="u")
    fact = FactReinforced(decision_id=uuid.uuid4(), source_event_id=eid, source=LogPosition("ev", 1, 50),
                          recorded_at=datetime(2026, 1, 2, tzinfo=timezone.utc), user_id="u", extractor="x",
                          resolver="x", confidence=1.0, explicit=True, reason="r", target=uuid.uuid4())
    decisions = [decision(partition=p, offset=o) for p, o in [(0, 3), (0, 9), (2, 4)]] + [skipped, fact]
    assert events_covered(decisions) == {("ev", 0): 10, ("ev", 2): 5, ("ev", 3): 12}
