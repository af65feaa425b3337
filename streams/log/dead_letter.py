"""Dead letters: a record we cannot decode or apply goes to the dead-letter topic with its
original key, value and headers, plus why and where it came from. Never silently dropped."""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Protocol, Sequence

from aiokafka import AIOKafkaProducer

from memstream.schemas.errors import MemstreamError
from memstream.streams.log.records import Record

log = logging.getLogger("memstream.streams")


class TooManyDeadLetters(MemstreamError, RuntimeError):
    """The dead-letter rate passed its limit; the worker stops instead of draining the log."""


Letter = tuple[Record, str, str]  # (record, stage that refused it, reason)


class InputRefused(str):
    """A letter's reason that is its record's own input refused by our rules (a ``Refused`` whose
    ``users_input`` is set: a request naming what the user does not have). Sent and counted like
    any letter, but never toward the rate that stops the worker: one user's input must not stop
    it for everyone."""


class DeadLetterSink(Protocol):
    """Where a step puts the records it cannot apply, as ``(record, stage, reason)`` letters.

    ``send(letters)`` accounts for every letter of the call exactly once before it returns:
    durably (``DeadLetters``: the dead-letter topic acknowledged it) or, where the letters were
    already sent once (``SkippedLetters``, replay), counted and logged. A letter is never dropped
    silently; a call never accounts again for the letters of an earlier one, and the same record
    sent in two calls is two letters. A step moves its positions past a record only after
    ``send`` returned for its letter (``projecting._one_by_one`` sends inside the transaction
    that moves them), so a return is the promise the record is not lost. An empty list is a
    no-op: nothing sent, nothing counted.

    A sink with a rate limit raises ``TooManyDeadLetters`` from ``send`` once the letters in
    its window of recent records (``InputRefused`` ones aside, and each record key's counted a
    tenth of the limit at most) pass the limit — after the call's letters are accounted for —
    and the worker stops rather than drain the log into the dead-letter topic. Any other error
    propagates, its batch unacknowledged (a broker out of reach: the step retries the batch), so
    a letter may be accounted for more than once across retries — at least once, never zero.

    ``observe(n_ok)``: ``n_ok`` records went through without a letter. A rate-limited sink
    counts them in its window (the rate is letters per record seen); nothing is sent or
    counted as a letter.
    """

    async def send(self, letters: Sequence[Letter]) -> None:
        ...

    def observe(self, n_ok: int) -> None:
        ...


class DeadLetters(DeadLetterSink):
    def __init__(self, producer: AIOKafkaProducer, topic: str, max_per_1000: int, counted=None):
        self._producer, self.topic, self._max = producer, topic, max_per_1000
        self._counted = counted or (lambda stage: None)  # told the stage of each letter sent
        # Per record seen: the key of a letter that counts toward the limit, else None.
        self._window: collections.deque[bytes | None] = collections.deque(maxlen=1000)
        # One key's letters count this often at most: a bad deploy refuses many users' records,
        # one user's input refused is that user's (else a stranger could stop the worker).
        self._per_key = max(1, max_per_1000 // 10)

    def observe(self, n_ok: int) -> None:
        self._window.extend([None] * min(n_ok, 1000))

    def _counting(self) -> int:
        return sum(min(n, self._per_key) for n in collections.Counter(k for k in self._window if k is not None).values())

    async def send(self, letters: Sequence[Letter]) -> None:
        """Sends each letter to ``topic``; returns once Kafka acknowledged all."""
        if not letters:
            return
        futures = []
        for rec, stage, reason in letters:
            # Why, at DEBUG only: a reason may quote what the record holds (it stays in the letter's
            # header, for `memstream dead-letters show`).
            log.error("dead-lettering %s at %s", rec.where, stage)
            log.debug("why dead-lettering %s at %s: %s", rec.where, stage, reason)
            headers = list(rec.headers) + [
                ("memstream.reason", reason.encode()[:4096]),
                ("memstream.stage", stage.encode()),
                ("memstream.source", rec.where.encode()),
            ]
            if "memstream.appended-at" not in dict(rec.headers):  # when it first came (``streams.worker.ingress``)
                headers.append(("memstream.appended-at", str(rec.timestamp_ms).encode()))
            futures.append(await self._producer.send(self.topic, rec.wire_value, key=rec.key, headers=headers))
            # A record without a key is nobody's in particular: counted on its own.
            self._window.append(None if isinstance(reason, InputRefused) else rec.key or rec.where.encode())
        await asyncio.gather(*futures)
        for _, stage, _ in letters:
            self._counted(stage)
        if (counting := self._counting()) > self._max:
            raise TooManyDeadLetters(
                f"{counting} dead letters in the last {len(self._window)} records, at most {self._per_key} "
                f"of a key counted (limit {self._max}); stopping so a bad deploy cannot drain the log"
            )
