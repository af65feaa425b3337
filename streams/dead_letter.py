"""Dead letters: a record we cannot decode or apply goes to the dead-letter topic with its
original key, value and headers, plus why and where it came from. Never silently dropped."""
from __future__ import annotations

import asyncio
import collections
import logging

from aiokafka import AIOKafkaProducer

from memstream.schemas.errors import MemstreamError
from memstream.streams.records import Record

log = logging.getLogger("memstream.streams")


class TooManyDeadLetters(MemstreamError, RuntimeError):
    """The dead-letter rate passed its limit; the worker stops instead of draining the log."""


class DeadLetters:
    def __init__(self, producer: AIOKafkaProducer, topic: str, max_per_1000: int):
        self._producer, self.topic, self._max = producer, topic, max_per_1000
        self._window: collections.deque[bool] = collections.deque(maxlen=1000)

    def observe(self, n_ok: int) -> None:
        self._window.extend([False] * min(n_ok, 1000))

    async def send(self, letters: list[tuple[Record, str, str]]) -> None:
        """Send ``(record, stage, reason)`` triples; returns once Kafka acknowledged all."""
        if not letters:
            return
        futures = []
        for rec, stage, reason in letters:
            log.error("dead-lettering %s at %s: %s", rec.where, stage, reason)
            headers = list(rec.headers) + [
                ("memstream.reason", reason.encode()[:4096]),
                ("memstream.stage", stage.encode()),
                ("memstream.source", rec.where.encode()),
            ]
            futures.append(await self._producer.send(self.topic, rec.value, key=rec.key, headers=headers))
            self._window.append(True)
        await asyncio.gather(*futures)
        if sum(self._window) > self._max:
            raise TooManyDeadLetters(
                f"{sum(self._window)} dead letters in the last {len(self._window)} records "
                f"(limit {self._max}); stopping so a bad deploy cannot drain the log"
            )
