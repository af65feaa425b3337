"""The projection contract.

A projection is a pure core and an I/O shell. The core folds decoded records into rows with no
clock, randomness or network: ids derive from event ids, system time from the log. The shell's
``apply_batch`` writes those rows and the positions they cover in **one** transaction:

* a successful return means every row and position in the batch is durable; a raise means none
  of them is (the transaction rolled back) and the caller must retry or stop, never skip;
* applying a batch twice, or any prefix of it again, leaves the store unchanged (rows are keyed
  by ids derived from their source event; positions only move forward);
* positions name the *next* offset to apply for each ``(topic, partition)``, and may include the
  source events topic as a watermark for read-your-writes.
"""
from __future__ import annotations

from typing import Generic, Protocol, Sequence, TypeVar

import asyncpg

from memstream.projections.positions import Positions

Row = TypeVar("Row", contravariant=True)


class ProjectionStore(Protocol, Generic[Row]):
    name: str

    async def apply_batch(self, conn: asyncpg.Connection, rows: Sequence[Row], positions: Positions) -> None:
        ...
