"""Formation's barrier: a user's turn is decided on the projections' rows only once they hold
every decision formation produced for that user on the partition (on a fresh assignment, every
decision already in it). Decisions go to the same partition number as their source event, so a
user's events and decisions share one partition."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import asyncpg

from memstream.schemas.errors import Retryable


class ProjectionLagging(Retryable, TimeoutError):
    """The projections formation reads have not caught up with what it produced (retried)."""


PRUNE_AT = 10_000  # the barrier's users from which it drops those the projections have applied



class ProjectionBarrier:
    """Waits until the projections formation reads (facts, graph) have applied what formation
    produced to a partition."""

    projections = ("facts", "graph")

    def __init__(self, pool: asyncpg.Pool, decisions_topic: str,
                 end_offset: Callable[[int], Awaitable[int]], timeout: float = 30.0):
        self._pool, self._topic, self._end_offset, self._timeout = pool, decisions_topic, end_offset, timeout
        self._whole: set[int] = set()  # waited for as a whole since assigned (the previous owner's decisions too)
        # (partition, user) -> the offset past that user's last decision: a batch waits only for
        # the users in it (others' decisions cannot change what it decides).
        self._by_user: dict[tuple[int, str], int] = {}
        self._prune_at = PRUNE_AT
        self._applied: dict[int, int] = {}  # partition -> the projections' position, as last read
        self._reading: dict[int, asyncio.Future] = {}
        self._ending: dict[int, asyncio.Future] = {}  # partition -> its end offset when assigned

    def produced(self, partition: int, next_offset: int, user_id: str) -> None:
        key = (partition, user_id)
        self._by_user[key] = max(self._by_user.get(key, 0), next_offset)

    async def imported(self, partition: int, user_id: str) -> None:
        """The user's next wait also waits for every decision on the partition now: an import
        appended theirs, which formation did not produce."""
        self.produced(partition, await self._end_offset(partition), user_id)

    def forget(self, partitions) -> None:
        for p in partitions:
            self._whole.discard(p)
            self._applied.pop(p, None)
            self._ending.pop(p, None)
        gone = set(partitions)
        self._by_user = {k: v for k, v in self._by_user.items() if k[0] not in gone}

    def applied_for(self, partition: int, user_id: str) -> bool:
        """Whether the projections have applied every decision produced for ``user_id`` on
        ``partition`` by the last position this barrier read (positions only move forward)."""
        return (partition in self._whole
                and self._applied.get(partition, 0) >= self._by_user.get((partition, user_id), 0))

    async def wait(self, partition: int, users) -> None:
        """Until the projections have applied what formation produced for ``users`` on
        ``partition``; on a fresh assignment, every decision already there."""
        if partition not in self._whole:
            ending = self._ending.get(partition)
            if ending is None or (ending.done() and (ending.cancelled() or ending.exception() is not None)):
                ending = self._ending[partition] = asyncio.ensure_future(self._end_offset(partition))  # one ask for all
                ending.add_done_callback(retrieved)  # by its waiters, unless all were cancelled
            # Until a first wait there is over, formation records on the partition no facts
            # or edges (a turn's chain waits first): the end offset is all there is to wait for.
            needed = await asyncio.shield(ending)
        else:
            needed = max((self._by_user.get((partition, u), 0) for u in users), default=0)
        deadline = asyncio.get_running_loop().time() + self._timeout
        delay = 0.002
        while True:
            applied = await self._read(partition)
            if applied >= needed:
                self._whole.add(partition)
                if len(self._by_user) > self._prune_at:  # users applied need no entry
                    self._by_user = {k: v for k, v in self._by_user.items() if v > self._applied.get(k[0], 0)}
                    self._prune_at = max(PRUNE_AT, 2 * len(self._by_user))  # scanned again once it doubled
                return
            if asyncio.get_running_loop().time() > deadline:
                # The facts projection may be restarting or on another worker.
                raise ProjectionLagging(f"facts/graph projections are at {self._topic}/{partition}@{applied}, formation needs {needed}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _read(self, partition: int) -> int:
        # Users waiting on one partition share one read of its position at a time.
        reading = self._reading.get(partition)
        if reading is None or reading.done():
            reading = self._reading[partition] = asyncio.ensure_future(self._pool.fetchval(
                "SELECT coalesce(min(next_offset), 0) FROM projection_positions WHERE projection = ANY($3::text[]) "
                "AND topic = $1 AND partition = $2 HAVING count(*) = cardinality($3::text[])",
                self._topic, partition, list(self.projections)))
            reading.add_done_callback(retrieved)
        applied = await asyncio.shield(reading) or 0
        self._applied[partition] = max(self._applied.get(partition, 0), applied)
        return applied


def retrieved(future: asyncio.Future) -> None:
    # A shared ask's outcome is its waiters' to see; with none left it must not warn unretrieved.
    future.cancelled() or future.exception()

