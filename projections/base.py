"""The projection contract (``ProjectionStore``), followed by every projection's ``store.py``
and checked against each of them by ``tests/contracts/test_projection_stores.py``."""
from __future__ import annotations

from typing import Generic, Protocol, Sequence, TypeVar

import asyncpg

from memstream.projections.positions import Positions

Row = TypeVar("Row", contravariant=True)


class ProjectionStore(Protocol, Generic[Row]):
    """The I/O shell of a projection. Its pure core folds decoded records into rows with no
    clock, randomness or network (ids derive from event ids, system time from the log); the
    store's ``apply_batch(conn, items, positions)`` writes what ``items`` (the core's rows, or
    the decisions or commands it folds) make of the store, and the positions they cover, in
    **one** transaction:

    * a successful return means every row and position of the batch is durable; a raise means
      none of them is (the transaction rolled back, constraints checked at commit included) and
      the caller must retry or stop, never skip. Called inside the caller's transaction, the
      store's is a savepoint: a raise undoes this call only, and a return is durable once the
      caller commits (``streams.worker.projecting`` applies a refused batch item by item that way) —
      and so are the checks of deferred constraints (the graph's entity references and
      single-valued overlaps): a violation then fails the caller's commit, not this call;
    * an item naming a row the store does not hold is refused with a ``Refused`` error
      (e.g. ``MissingTarget``), like the database's refusals, with nothing written;
    * applying a batch twice, or any prefix of it again, leaves the store unchanged (rows are
      keyed by ids derived from their source event; positions only move forward);
    * positions name the *next* offset to apply for each ``(topic, partition)``, and may include
      the source events topic as a watermark for read-your-writes; a position lower than the
      stored one leaves the stored one. An empty batch with positions moves only the positions.

    ``name`` is the projection's name in ``projection_positions``.

    The return value is what the batch derived that the caller may push to a cache after the
    transaction commits (facts: the Tier 1 profiles it rebuilt, by user, for Redis), or
    ``None``. It is never needed for correctness: the rows it came from are committed, and a
    caller that ignores it loses only the cache refresh.
    """

    name: str

    async def apply_batch(self, conn: asyncpg.Connection, items: Sequence[Row], positions: Positions) -> object:
        ...
