"""``TurnLog``: how hosts append turns to the per-user events topic."""
from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError

from memstream.config import Settings
from memstream.schemas import Event, LogPosition
from memstream.schemas.codec import validated
from memstream.streams.errors import BrokerUnavailable
from memstream.streams.sealing import RecordSealer

log = logging.getLogger("memstream.streams")


def idempotent_producer(bootstrap: str, **extra) -> AIOKafkaProducer:
    """acks=all + idempotence: an acknowledged record is on every in-sync replica, and a retried
    send cannot duplicate or reorder records within a partition."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
        request_timeout_ms=15000, **extra,
    )


class TurnLog:
    """Appends events to ``memstream.events`` keyed by ``user_id``.

    ``append`` returns once Kafka has acknowledged the record with ``acks=all``: from then on the
    event is durable and will be projected. Invalid events raise ``InvalidEvent`` before anything
    is sent; ``append_many`` validates the whole batch first, so an invalid event sends none of
    it. An unreachable broker raises ``BrokerUnavailable``; a batch interrupted by the broker may
    be partly written — retrying it is safe, since projections key rows by ``event_id``.

    Each event is sealed with its user's data key before it leaves the host (``streams.sealing``;
    a ``UserForgotten`` is stamped with the key generation it ends): the log reaches the key
    store in Postgres (``Settings.dsn()``), or ``sealer`` is given.
    """

    def __init__(self, settings: Settings, sealer: RecordSealer | None = None):
        self._settings, self._sealer = settings, sealer
        self._producer = idempotent_producer(settings.kafka_bootstrap)
        self._pool = None
        self._started = False

    async def start(self) -> None:
        if self._started:
            return
        try:
            await self._producer.start()
        except KafkaConnectionError as exc:
            await self._producer.stop()
            raise BrokerUnavailable(f"cannot reach Kafka at {self._settings.kafka_bootstrap}: {exc}") from exc
        self._started = True
        if self._sealer is None:
            try:
                self._sealer = await self._own_sealer()
            except BaseException:
                await self.stop()
                raise

    async def _own_sealer(self) -> RecordSealer:
        """Sealing with the deployment's data keys, over a small pool of this log's own."""
        from memstream.projections import db
        from memstream.sealing import data_keys

        s = self._settings
        if not s.seal_records:
            return RecordSealer(None)
        self._pool = await db.create_pool(s.dsn(), s.postgres_schema, min_size=0, max_size=2)
        return RecordSealer(await data_keys(s, self._pool))

    async def stop(self) -> None:
        if self._started:
            await self._producer.stop()
            self._started = False
        if self._pool is not None:
            await self._pool.close()
            self._pool, self._sealer = None, None

    async def __aenter__(self) -> TurnLog:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def append(self, event: Event) -> LogPosition:
        return (await self.append_many([event]))[0]

    async def append_many(self, events: Sequence[Event]) -> list[LogPosition]:
        checked = [validated(e) for e in events]  # raises InvalidEvent before any send
        await self.start()
        topic = self._settings.events_topic
        try:
            futures = [
                await self._producer.send(topic, await self._sealer.seal(e), key=e.user_id.encode())
                for e in checked
            ]
            metas = await asyncio.gather(*futures)
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka did not acknowledge the append: {exc}") from exc
        return [LogPosition(topic, m.partition, m.offset) for m in metas]

