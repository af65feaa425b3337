"""``TurnLog``: how hosts append turns to the per-user events topic."""
from __future__ import annotations

import asyncio
import logging
from typing import Sequence

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, MessageSizeTooLargeError

from memstream.config import Settings
from memstream.schemas import Event, LogPosition
from memstream.schemas.codec import validated
from memstream.streams.log.errors import BrokerUnavailable, KeyStoreUnavailable, Transient, as_retryable
from memstream.streams.log.sealing import RecordSealer

log = logging.getLogger("memstream.streams")

MOVE_WAIT_S = 120.0  # how long an append waits for a move of the log (streams.ops.partition_growth) to finish


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
    it. An unreachable broker raises ``BrokerUnavailable``, an unreachable key store (the events
    are sealed before they are sent) ``KeyStoreUnavailable``: both ``Retryable``. A batch
    interrupted by the broker may be partly written — retrying it is safe, since projections key
    rows by ids derived from ``event_id``.

    Each event is sealed with its user's data key before it leaves the host (``streams.log.sealing``;
    a ``UserForgotten`` is stamped with the key generation it ends): the log reaches the key
    store in Postgres (``Settings.dsn()``), or ``sealer`` is given.

    The log's topics are the ones it lives in now (``streams.log.log_topics``): while it moves to
    more partitions the old topic refuses writes, and an append waits (up to ``MOVE_WAIT_S``)
    until the move is done, then goes to the new topic, after everything appended before it.
    """

    def __init__(self, settings: Settings, sealer: RecordSealer | None = None):
        self._settings, self._sealer, self._given_sealer = settings, sealer, sealer
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
        try:
            if self._sealer is None:
                self._sealer = await self._own_sealer()
            try:
                await self._follow_moves()
            except (LookupError, OSError, asyncpg.PostgresError) as exc:
                if self._given_sealer is None and self._settings.seal_records:
                    raise  # the key store answered a moment ago: this is not a missing database
                # Sealing without the key store (a given sealer): a move is found when its fence refuses a record.
                log.warning("cannot look up where the log lives (%s); appending to %s", exc, self._settings.events_topic)
        except BaseException:
            await self.stop()
            raise

    async def _own_sealer(self) -> RecordSealer:
        """Sealing with the deployment's data keys, over a small pool of this log's own."""
        from memstream.keys import data_keys

        s = self._settings
        if not s.seal_records:
            return RecordSealer(None)
        return RecordSealer(await data_keys(s, await self._db()))

    async def _db(self):
        from memstream.projections import db

        if self._pool is None:
            s = self._settings
            self._pool = await db.create_pool(s.dsn(), s.postgres_schema, min_size=0, max_size=2)
        return self._pool

    @property
    def events_topic(self) -> str:
        """The topic appends go to now (the positions they return name it)."""
        return self._settings.events_topic

    async def _follow_moves(self) -> bool:
        """Point at the topics the log lives in now; whether they changed."""
        from memstream.streams.log.log_topics import live_log

        now = await live_log(self._settings, await self._db())
        moved = now.events_topic != self._settings.events_topic
        if moved:
            log.info("the log moved: appending to %s", now.events_topic)
            self._settings = now
        return moved

    async def _after_move(self, topic: str) -> bool:
        """After a refused append: wait for the log's move out of ``topic``, if one is under way."""
        from memstream.streams.log.log_topics import move_from

        move = await move_from(self._settings, await self._db())
        if move is None or move["state"] == "copying":
            return False  # not fenced by a move: the record is really too large
        deadline = asyncio.get_running_loop().time() + MOVE_WAIT_S
        while not await self._follow_moves():
            if asyncio.get_running_loop().time() > deadline:
                raise BrokerUnavailable(f"the log is moving out of {topic} (memstream partitions grow) and has not "
                                        f"finished within {MOVE_WAIT_S:.0f} s; retry the append")
            await asyncio.sleep(0.25)
        return True

    async def reachable(self, timeout_s: float = 2.0) -> bool:
        """Whether a broker answers a metadata request now (a readiness check)."""
        try:
            return bool(await asyncio.wait_for(self._producer.client.force_metadata_update(), timeout_s))
        except Exception:  # noqa: BLE001 - any failure is "not now"; the reason is logged
            log.warning("the log is unreachable", exc_info=True)
            return False

    async def stop(self) -> None:
        if self._started:
            await self._producer.stop()
            self._started = False
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        self._sealer = self._given_sealer

    async def __aenter__(self) -> TurnLog:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def append(self, event: Event) -> LogPosition:
        return (await self.append_many([event]))[0]

    async def _sealed(self, event: Event) -> bytes:
        try:
            return await self._sealer.seal(event)
        except Exception as exc:
            if isinstance(as_retryable(exc), Transient):  # Postgres restarting, a socket gone: not a bug
                raise KeyStoreUnavailable(f"the key store did not answer: {type(exc).__name__}") from exc
            raise

    async def append_many(self, events: Sequence[Event]) -> list[LogPosition]:
        checked = [validated(e) for e in events]  # raises InvalidEvent before any send
        await self.start()
        done: list[LogPosition | None] = [None] * len(checked)
        while True:
            topic = self._settings.events_topic
            todo = [i for i, p in enumerate(done) if p is None]
            sealed = [await self._sealed(checked[i]) for i in todo]
            try:
                futures = [await self._producer.send(topic, value, key=checked[i].user_id.encode())
                           for i, value in zip(todo, sealed)]
                results = await asyncio.gather(*futures, return_exceptions=True)
            except KafkaError as exc:
                raise BrokerUnavailable(f"Kafka did not acknowledge the append: {exc}") from exc
            for i, r in zip(todo, results):
                if not isinstance(r, BaseException):
                    done[i] = LogPosition(topic, r.partition, r.offset)
            failed = [r for r in results if isinstance(r, BaseException)]
            if not failed:
                return done  # type: ignore[return-value]
            # A record refused for its size by a topic that was fenced for a move: once the move
            # is done, the rest go to the new topic (after what the old one took: per user, a prefix).
            if not (all(isinstance(r, MessageSizeTooLargeError) for r in failed) and await self._after_move(topic)):
                exc = failed[0]
                if isinstance(exc, KafkaError):
                    raise BrokerUnavailable(f"Kafka did not acknowledge the append: {exc}") from exc
                raise exc

