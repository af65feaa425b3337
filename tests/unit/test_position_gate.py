"""The position gate keeps each partition contiguous with what the store has applied."""

from memstream.streams.worker import position_gate as gate_mod
from memstream.streams.worker.position_gate import PositionGate, align
from memstream.streams.log.records import Record


def rec(p, o, topic="t"):
    return Record(topic, p, o, b"k", b"v", (), 0)


class Fakes:
    def __init__(self, stored, start=0):
        self.stored, self.seeks, self.start, self.held = stored, [], start, []

    async def load(self, topic):
        return dict(self.stored)

    async def seek(self, topic, partition, offset):
        self.seeks.append((topic, partition, offset))

    async def log_start(self, topic, partition):
        return self.start

    def hold(self, topic, partition, offset):
        self.held.append(offset)


async def test_records_below_the_stored_position_are_redeliveries_and_skipped():
    f = Fakes({0: 5})
    g = PositionGate("x", f.load, f.seek)
    out = await g.filter([rec(0, o) for o in range(3, 8)])
    assert [r.offset for r in out] == [5, 6, 7]
    assert await g.filter([rec(0, 6), rec(0, 7)]) == []


async def test_a_record_past_the_stored_position_seeks_back_instead_of_skipping_data():
    f = Fakes({0: 5})
    g = PositionGate("x", f.load, f.seek)
    assert await g.filter([rec(0, 9), rec(0, 10)]) == []
    assert f.seeks == [("t", 0, 5)]
    out = await g.filter([rec(0, 5), rec(0, 6)])  # the re-read after the seek
    assert [r.offset for r in out] == [5, 6]


async def test_a_partition_never_applied_starts_at_offset_zero():
    f = Fakes({})
    g = PositionGate("x", f.load, f.seek)
    assert [r.offset for r in await g.filter([rec(1, 0), rec(1, 1)])] == [0, 1]
    assert await g.filter([rec(2, 3)]) == [] and f.seeks == [("t", 2, 0)]


async def test_a_gap_the_log_no_longer_holds_is_accepted_after_repeated_seeks(monkeypatch):
    monkeypatch.setattr(gate_mod, "RESEEK_AFTER_S", 0.0)
    f = Fakes({0: 0}, start=4)  # retention deleted offsets 0..3
    g = PositionGate("x", f.load, f.seek, f.log_start, f.hold)
    for _ in range(gate_mod.MAX_SEEKS):
        assert await g.filter([rec(0, 4)]) == []
    assert [r.offset for r in await g.filter([rec(0, 4)])] == [4]
    assert len(f.seeks) == gate_mod.MAX_SEEKS


async def test_a_gap_the_log_still_holds_is_never_accepted_however_often_the_seek_is_lost(monkeypatch):
    # A chaos run: Faust's drain loop handed on records fetched before each seek, which moved its
    # read offset past the re-read ones; after three seeks the gate took the offsets for deleted.
    monkeypatch.setattr(gate_mod, "RESEEK_AFTER_S", 0.0)
    f = Fakes({0: 3620})
    g = PositionGate("x", f.load, f.seek, f.log_start, f.hold)
    for got in range(3641, 3641 + 5 * gate_mod.MAX_SEEKS):
        assert await g.filter([rec(0, got)]) == []
    assert len(f.seeks) == 5 * gate_mod.MAX_SEEKS and {s[2] for s in f.seeks} == {3620}
    assert [r.offset for r in await g.filter([rec(0, 3620), rec(0, 3621)])] == [3620, 3621]


async def test_a_stale_record_after_a_seek_puts_the_read_offset_back():
    f = Fakes({0: 5})
    g = PositionGate("x", f.load, f.seek, f.log_start, f.hold)
    assert await g.filter([rec(0, 9)]) == [] and f.held == [5]  # the seek
    assert await g.filter([rec(0, 10), rec(0, 11)]) == [] and f.held == [5, 5, 5]  # fetched before it


async def test_forgetting_a_partition_reloads_its_position():
    f = Fakes({0: 2})
    g = PositionGate("x", f.load, f.seek)
    await g.filter([rec(0, 2)])
    f.stored = {0: 10}  # another worker moved it
    g.forget([("t", 0)])
    assert [r.offset for r in await g.filter([rec(0, 9), rec(0, 10)])] == [10]
    assert f.seeks == []


async def test_align_seeks_back_only_partitions_the_consumer_would_resume_past_the_store():
    f = Fakes({0: 5, 1: 7})
    g = PositionGate("x", f.load, f.seek)
    await align([g], "t", {0: 9, 1: 7, 2: None}, f.seek)
    assert f.seeks == [("t", 0, 5)]
    assert await g.filter([rec(0, 9)]) == []  # stale record from before the seek: dropped, no re-seek
    assert len(f.seeks) == 1
    assert [r.offset for r in await g.filter([rec(0, 5), rec(1, 7)])] == [5, 7]


async def test_align_leaves_a_partition_already_passing_records_as_it_is():
    # The consumer went ahead before the alignment ran (Faust resumes it first): what was
    # passed may be in flight, not yet stored, and must not be passed again.
    f = Fakes({0: 0, 1: 3})
    g = PositionGate("x", f.load, f.seek)
    assert [r.offset for r in await g.filter([rec(0, o) for o in range(8)])] == list(range(8))
    await align([g], "t", {0: 12, 1: 9}, f.seek)
    assert f.seeks == [("t", 1, 3)]  # only the partition nothing was passed from
    assert [r.offset for r in await g.filter([rec(0, o) for o in range(6, 10)])] == [8, 9]


async def test_a_record_passed_while_the_alignment_reads_the_store_is_not_passed_again():
    f = Fakes({0: 0})
    g = PositionGate("x", f.load, f.seek)
    load = f.load

    async def slow_load(topic):  # the agent passes records while the alignment awaits the store
        g._load = load
        got = await load(topic)
        await g.filter([rec(0, o) for o in range(5)])
        return got

    g._load = slow_load
    await align([g], "t", {0: 12}, f.seek)
    assert f.seeks == []
    assert [r.offset for r in await g.filter([rec(0, o) for o in range(3, 7)])] == [5, 6]


async def test_records_read_across_a_revoke_are_not_passed_and_the_partition_is_forgotten():
    f = Fakes({0: 0})
    g = PositionGate("x", f.load, f.seek)
    load = f.load

    async def revoked_meanwhile(topic):
        g._load = load
        g.forget([("t", 0)])
        return await load(topic)

    g._load = revoked_meanwhile
    assert await g.filter([rec(0, 0), rec(0, 1)]) == []
    assert not g.passing("t", 0)
    assert [r.offset for r in await g.filter([rec(0, 0)])] == [0]  # assigned again: from the store
    g.forget([("t", 0)])
    assert not g.passing("t", 0)


async def test_a_gate_behind_is_sought_back_though_another_sharing_the_consumer_passes():
    ahead, behind = Fakes({0: 0}), Fakes({0: 4})
    a = PositionGate("episodes", ahead.load, ahead.seek)
    b = PositionGate("facts", behind.load, behind.seek)
    await a.filter([rec(0, o) for o in range(3)])
    await align([a, b], "t", {0: 12}, ahead.seek)
    assert ahead.seeks == [("t", 0, 4)]
    assert [r.offset for r in await a.filter([rec(0, o) for o in range(4)])] == [3]  # the rest: redeliveries


async def test_steps_sharing_a_consumer_resume_at_the_least_advanced_one():
    ahead, behind = Fakes({0: 10}), Fakes({0: 4})
    a = PositionGate("episodes", ahead.load, ahead.seek)
    b = PositionGate("facts", behind.load, behind.seek)
    await align([a, b], "t", {0: 12}, ahead.seek)
    assert ahead.seeks == [("t", 0, 4)]
    assert [r.offset for r in await a.filter([rec(0, o) for o in range(4, 12)])] == [10, 11]  # 4..9 are redeliveries
    assert [r.offset for r in await b.filter([rec(0, o) for o in range(4, 7)])] == [4, 5, 6]


async def test_a_partition_silent_after_a_seek_back_is_sought_again(monkeypatch):
    f = Fakes({0: 5})
    g = PositionGate("x", f.load, f.seek)
    assert await g.filter([rec(0, 9)]) == [] and f.seeks == [("t", 0, 5)]
    await g.reseek_silent()
    assert len(f.seeks) == 1  # not yet: the seek may still be under way
    monkeypatch.setattr(gate_mod, "RESEEK_AFTER_S", 0.0)
    await g.reseek_silent()
    assert f.seeks == [("t", 0, 5)] * 2
    assert [r.offset for r in await g.filter([rec(0, 5)])] == [5]
    await g.reseek_silent()
    assert len(f.seeks) == 2  # delivering again: nothing to do


async def test_a_partition_still_delivering_past_the_position_is_left_to_the_gap_logic(monkeypatch):
    f = Fakes({0: 5})
    g = PositionGate("x", f.load, f.seek)
    assert await g.filter([rec(0, 9)]) == []
    monkeypatch.setattr(gate_mod, "RESEEK_AFTER_S", 0.05)
    import asyncio
    await asyncio.sleep(0.06)
    assert await g.filter([rec(0, 10)]) == [] and len(f.seeks) == 2  # _gap's own second attempt
    await g.reseek_silent()
    assert len(f.seeks) == 2  # records are still coming: not silent


async def test_a_partition_with_records_past_its_position_but_none_coming_is_sought_again(monkeypatch):
    f = Fakes({0: 5, 1: 3})
    g = PositionGate("x", f.load, f.seek)
    assert [r.offset for r in await g.filter([rec(0, 5), rec(1, 3)])] == [5, 3]
    ends = {("t", 0): 40, ("t", 1): 4}  # partition 1 is at its end: nothing to wait for

    async def check():
        await g.reseek_stalled(lambda topic, p: ends[(topic, p)])

    await check()
    assert f.seeks == []  # not yet: records may be on their way
    monkeypatch.setattr(gate_mod, "STALLED_AFTER_S", 0.0)
    await check()
    assert f.seeks == [("t", 0, 6)]
    assert [r.offset for r in await g.filter([rec(0, 6)])] == [6]


async def test_an_alignment_that_reads_the_store_across_a_revoke_leaves_the_positions_to_the_next_batch():
    f = Fakes({0: 3})
    g = PositionGate("x", f.load, f.seek)
    load = f.load

    async def revoked_meanwhile(topic):
        got = await load(topic)  # read before the revoke's last batch was recorded
        g._load = load
        g.forget([("t", 0)])
        f.stored[0] = 5
        return got

    g._load = revoked_meanwhile
    await align([g], "t", {0: 9}, f.seek)
    assert f.seeks == []
    assert [r.offset for r in await g.filter([rec(0, o) for o in range(3, 7)])] == [5, 6]  # read afresh


async def test_a_broker_that_cannot_say_where_the_log_begins_leaves_the_gap_sought_not_skipped(monkeypatch):
    monkeypatch.setattr(gate_mod, "RESEEK_AFTER_S", 0.0)
    f = Fakes({0: 0})

    async def failing(topic, partition):
        raise ConnectionError("broker down")

    g = PositionGate("x", f.load, f.seek, failing, f.hold)
    for _ in range(2 * gate_mod.MAX_SEEKS):
        assert await g.filter([rec(0, 4)]) == []
    assert len(f.seeks) == 2 * gate_mod.MAX_SEEKS
