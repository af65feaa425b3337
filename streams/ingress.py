"""The ingress topic: where hosts in any language put plain JSON turns (kcat works), and the
step that seals them onto the retained events topic.

The ingress topic keeps records only for ``plaintext_retention_s`` (``streams.topics``), so a
person's words in plain text age out of Kafka; the events topic, kept forever, holds them
sealed. Each record is checked like any event (an undecodable one, or one keyed by anything but
its ``user_id``, is dead-lettered with the reason), sealed with its user's data key and appended
keyed by the user — so on the partition Kafka's default partitioner gives them, whatever
partitioner the host used. A ``UserForgotten`` is stamped with the key generation it ends.

The step's position on the ingress topic is stored once the sealed records are acknowledged:
after a crash between the two a record is sealed again, a second copy with the same
``event_id``, which formation and the projections apply once (as a retried ``TurnLog.append``).
"""
from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.errors import MessageSizeTooLargeError

from memstream.projections import positions as pos
from memstream.schemas import InvalidEvent, decode_event
from memstream.streams.records import Record, next_offsets
from memstream.streams.sealing import RecordSealer

log = logging.getLogger("memstream.ingress")


class IngressSealing:
    name = "sealing"

    def __init__(self, *, producer, settings, sealer: RecordSealer, dead_letters, pool):
        self._producer, self._settings, self._topic, self._sealer = producer, settings, settings.events_topic, sealer
        self._dead, self._pool = dead_letters, pool
        self._fenced = 0.0  # when the events topic was found fenced

    async def process(self, records: list[Record]) -> None:
        if self._fenced:
            if time.monotonic() - self._fenced < 10 or await self._moving():
                return  # not applied, position not stored: read again once the worker moved over
            self._fenced = 0.0  # the fence was lifted by hand: go on
        letters, futures = [], []
        for r in records:
            try:
                event = decode_event(r.value or b"")
            except InvalidEvent as exc:
                letters.append((r, self.name, f"undecodable event: {exc}"))
                continue
            if r.key != event.user_id.encode():
                letters.append((r, self.name, "record key does not match user_id: per-user order is not guaranteed"))
                continue
            futures.append(await self._producer.send(self._topic, await self._sealer.seal(event), key=r.key))
        try:
            await asyncio.gather(*futures)
        except MessageSizeTooLargeError:
            if not await self._moving():
                raise
            # The events topic is fenced for a move (streams.partition_growth): returning keeps
            # this process's consumer going (the projections finish the old topics meanwhile);
            # the worker restarts on the new topics when the move is done and reads these again.
            log.warning("%s is fenced: the log is moving to more partitions; ingress waits for it", self._topic)
            self._fenced = time.monotonic()
            return
        await self._dead.send(letters)
        self._dead.observe(len(records) - len(letters))
        async with self._pool.acquire() as conn, conn.transaction():
            await pos.save(conn, self.name, next_offsets(records))

    async def _moving(self) -> bool:
        from memstream.streams.log_topics import moves

        return any(m["from_events"] == self._topic and m["state"] != "copying" for m in await moves(self._pool, self._settings))
