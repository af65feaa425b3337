"""``ProjectionBarrier`` without Postgres: what it waits for per user, and that a long-running
worker's bookkeeping of users the projections have applied is dropped."""
from memstream.streams.worker.formation.barrier import PRUNE_AT, ProjectionBarrier


class Positions:
    """The projections' position on every partition (a pool's ``fetchval``)."""

    def __init__(self):
        self.applied = 0

    async def fetchval(self, *args):
        return self.applied


async def nothing_there(partition: int) -> int:
    return 0


async def test_users_the_projections_applied_are_forgotten_and_the_answers_stay_the_same():
    positions = Positions()
    barrier = ProjectionBarrier(positions, "decisions", nothing_there)
    await barrier.wait(0, {"u0"})
    await barrier.wait(1, {"u0"})
    for i in range(PRUNE_AT):
        barrier.produced(i % 2, 10 + i % 3, f"u{i}")
    barrier.produced(1, 50, "busy")
    assert not barrier.applied_for(0, "u0")
    positions.applied = 12
    await barrier.wait(0, {"u0"})  # partition 0's applied users dropped (partition 1 was last read at 0)
    assert len(barrier._by_user) == PRUNE_AT // 2 + 1
    await barrier.wait(1, {"u1"})  # scanned again only once the entries have doubled
    assert barrier.applied_for(0, "u0") and barrier.applied_for(1, "u1")
    assert not barrier.applied_for(1, "busy")
    for i in range(PRUNE_AT):
        barrier.produced(0, 12, f"v{i}")
    await barrier.wait(0, {"v0"})
    assert list(barrier._by_user) == [(1, "busy")]  # everyone applied dropped, on every partition read
    positions.applied = 50
    await barrier.wait(1, {"busy"})
    assert barrier.applied_for(1, "busy")
