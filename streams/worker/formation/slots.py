"""The LLM calls formation has in flight, handed out oldest turn first."""
from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools


class OldestFirst:
    """A semaphore of ``n`` slots whose waiters go in by rank, lowest first, not by arrival.

    Formation ranks a call by its turn's place in the log as started: a partition's decisions
    are recorded in log order, so a later turn's call served first (say, an extraction fetched
    ahead) would only wait for the earlier turn to be decided all the same."""

    def __init__(self, n: int):
        self._free = n
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._arrived = itertools.count()  # breaks ties in arrival order

    @contextlib.asynccontextmanager
    async def slot(self, rank: int):
        if self._free and not self._waiting:
            self._free -= 1
        else:
            granted = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (rank, next(self._arrived), granted))
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release()  # handed a slot just as it was cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():  # a cancelled waiter's future is done
                granted.set_result(None)
                return
        self._free += 1
