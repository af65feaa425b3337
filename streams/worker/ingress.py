"""The ingress topic: where hosts in any language put plain JSON turns (kcat works), and the
step that seals them onto the retained events topic.

The ingress topic keeps records only for ``plaintext_retention_s`` (``streams.log.topics``), so a
person's words in plain text age out of Kafka; the events topic, kept forever, holds them
sealed. Each record is checked like any event (an undecodable one, or one keyed by anything but
its ``user_id``, is dead-lettered with the reason), sealed with its user's data key and appended
keyed by the user — so on the partition Kafka's default partitioner gives them, whatever
partitioner the host used. A ``UserForgotten`` is stamped with the key generation it ends. A
record that reached the ingress topic before its user's last forget was stamped (a forget
appended straight to the events topic while the record waited, or a plain letter retried since)
is dropped, not sealed under the key the user got since: forgetting covers what they said
before it, wherever it waited.

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
from memstream.schemas import InvalidEvent, UserForgotten, encode
from memstream.schemas.codec import check_size
from memstream.streams.log.records import Record, next_offsets
from memstream.streams.log.screening import screen
from memstream.streams.log.sealing import RecordSealer

log = logging.getLogger("memstream.ingress")


class IngressSealing:
    name = "sealing"

    def __init__(self, *, producer, settings, sealer: RecordSealer, dead_letters, pool):
        self._producer, self._settings, self._topic, self._sealer = producer, settings, settings.events_topic, sealer
        self._dead, self._pool = dead_letters, pool
        self._fenced = 0.0  # when the events topic was found fenced
        self.dropped = 0  # records said before their user's forget

    async def process(self, records: list[Record]) -> None:
        if self._fenced:
            if time.monotonic() - self._fenced < 10 or await self._moving():
                return  # not applied, position not stored: read again once the worker moved over
            self._fenced = 0.0  # the fence was lifted by hand: go on
        futures, events = [], []
        # Checked as the events topic's records are (the host's partitioner is not: the sealed
        # record goes where its key belongs).
        decoded, letters = screen(records, self.name, None)
        for r, event in decoded:
            try:
                check_size(encode(event))  # sealed, it would pass Kafka's record limit, and stop this step
            except InvalidEvent as exc:
                letters.append((r, self.name, str(exc)))
                continue
            events.append((r, event))
        forgotten = await self._sealer.last_forgets({e.user_id for _, e in events})
        for r, event in events:
            came = _appended_at(r)
            if isinstance(event, UserForgotten):
                # Said when it reached ingress, not when this step (maybe lagging) got to it: what
                # the user says after it is theirs again.
                await self._sealer.stamp(event, came)
                # And so for the rest of this batch (a retried letter in it may be older).
                forgotten[event.user_id] = max(forgotten.get(event.user_id, 0.0), came)
            elif 0 < came < forgotten.get(event.user_id, 0.0):  # 0: no time known
                self.dropped += 1
                log.info("%s reached ingress before its user was forgotten: dropped", r.where)
                continue
            futures.append(await self._producer.send(self._topic, await self._sealer.seal(event), key=r.key))
        try:
            await asyncio.gather(*futures)
        except MessageSizeTooLargeError:
            if not await self._moving():
                raise
            # The events topic is fenced for a move (streams.ops.partition_growth): returning keeps
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
        from memstream.streams.log.log_topics import moves

        return any(m["from_events"] == self._topic and m["state"] != "copying" for m in await moves(self._pool, self._settings))


def _appended_at(r: Record) -> float:
    """When ``r`` first reached the ingress topic (Unix seconds): its log time, or for a letter
    retried, the time it first came, kept on the letter (``memstream.appended-at``, in ms)."""
    first = dict(r.headers).get("memstream.appended-at")
    return min(r.timestamp_ms, int(first)) / 1000 if first and first.isdigit() else r.timestamp_ms / 1000
