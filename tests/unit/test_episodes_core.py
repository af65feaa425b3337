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


def test_source_watermarks_are_the_next_offset_per_events_partition():
    rows = [core.apply(decision(partition=p, offset=o)) for p, o in [(0, 3), (0, 9), (2, 4)]]
    assert core.source_watermarks(rows, "ev") == {("ev", 0): 10, ("ev", 2): 5}
