"""The contract every processing step of a worker follows."""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from memstream.streams.log.records import Record


class Step(Protocol):
    """One batch of records in, durable effects out.

    ``process(records)``: records arrive in partition order, already passed by the position
    gate (no record below the step's stored position, none skipped). A successful return means
    every record's effect is durable: decisions or dead letters acknowledged by Kafka, rows and
    the step's positions committed in Postgres. A raise means nothing may be assumed: the caller
    retries the same batch (transient errors) or stops the process (anything else) — it never
    skips. Retrying is safe because every effect is idempotent: decision ids and row ids derive
    from event ids, positions only move forward.
    """

    name: str

    async def process(self, records: list[Record]) -> None: ...


@runtime_checkable
class PipelinedStep(Step, Protocol):
    """A step that takes the next batch before the last is durable (formation, waiting on a model).

    ``start(records, recorded)``: starts the batch and returns once the step has room for
    another; ``recorded()`` is called when every record's effect is durable, as ``process``
    would have left it — batches become durable in the order started, per partition. A
    ``Retryable`` error is retried inside the step; anything else is fatal: the step stops the
    process (or, with nobody to stop it, the next ``start`` or ``drain`` raises it).
    ``drain()``: until everything started is durable or abandoned. ``abandon()``: cancels what
    is not yet being recorded (its partitions revoked); what it gave up is never recorded, so it
    is applied again from the stored positions. ``process`` is ``start`` then ``drain``, and
    raises a ``Retryable`` error if what it started was abandoned.
    """

    async def start(self, records: list[Record], recorded: Callable[[], None] | None = None) -> None: ...

    async def drain(self) -> None: ...

    async def abandon(self) -> None: ...
