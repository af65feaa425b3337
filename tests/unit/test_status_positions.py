"""``memstream status`` lists every step on every partition, stored position or not: a step
that never ran is what a health check most needs to see."""
import asyncio
from types import SimpleNamespace

from memstream.streams.ops import status


class _Consumer:
    def __init__(self, ends: dict[tuple[str, int], int]):
        self.ends = ends
        parts: dict[str, set[int]] = {}
        for t, p in ends:
            parts.setdefault(t, set()).add(p)
        self._client = SimpleNamespace(fetch_all_metadata=self._metadata)
        self._parts = parts

    async def _metadata(self):
        return SimpleNamespace(partitions_for_topic=lambda t: self._parts.get(t))

    async def end_offsets(self, tps):
        return {tp: self.ends[(tp.topic, tp.partition)] for tp in tps}


def test_a_step_or_partition_without_a_stored_position_is_listed_at_0_with_its_whole_lag(monkeypatch):
    async def age(consumer, tp, offset):
        return 1.0

    monkeypatch.setattr(status, "_age", age)
    consumer = _Consumer({("ev", 0): 50, ("ev", 1): 0, ("dec", 0): 7, ("dec", 1): 3})
    rows = [{"projection": "formation", "topic": "ev", "partition": 0, "next_offset": 50}]
    routes = {"formation": {"ev": ("formation",)}, "projections": {"dec": ("facts",), "ev": ("commands",)}}
    got = asyncio.run(status._positions(consumer, rows, routes))
    table = {(p.projection, p.topic, p.partition): (p.applied, p.lag, p.lag_s) for p in got}
    assert table == {("commands", "ev", 0): (0, 50, 1.0), ("commands", "ev", 1): (0, 0, None),
                     ("facts", "dec", 0): (0, 7, 1.0), ("facts", "dec", 1): (0, 3, 1.0),
                     ("formation", "ev", 0): (50, 0, None), ("formation", "ev", 1): (0, 0, None)}
    assert status.Status(got, 0, None).max_lag == 50


def test_the_dead_letter_count_is_what_the_topic_holds_not_its_high_water_marks():
    class Letters(_Consumer):
        async def beginning_offsets(self, tps):
            return {tp: 57 for tp in tps}

    consumer = Letters({("dl", 0): 57})
    assert asyncio.run(status._dead_letters(consumer, "dl")) == (0, None)
