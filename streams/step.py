"""The contract every processing step of a worker follows."""
from __future__ import annotations

from typing import Protocol

from memstream.streams.records import Record


class Step(Protocol):
    """One batch of records in, durable effects out.

    ``process(records)``: records arrive in partition order, already admitted by the position
    gate (no record below the step's stored position, none skipped). A successful return means
    every record's effect is durable: decisions or dead letters acknowledged by Kafka, rows and
    the step's positions committed in Postgres. A raise means nothing may be assumed: the caller
    retries the same batch (transient errors) or stops the process (anything else) — it never
    skips. Retrying is safe because every effect is idempotent: decision ids and row ids derive
    from event ids, positions only move forward.
    """

    name: str

    async def process(self, records: list[Record]) -> None: ...
