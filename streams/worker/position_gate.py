"""The position gate: Postgres positions, not Kafka's group offsets, decide what is applied.

Faust acknowledges a ``take_events`` batch in a ``finally`` block, so a cancelled or crashed
batch can be committed to Kafka without having been applied. The gate keeps each partition
contiguous with what the store says it has applied: a record below the stored position is a
redelivery and is skipped; a record above it means Kafka skipped ahead, so the gate seeks the
consumer back to the stored position and drops records until the missing one arrives. It skips
offsets only when the log no longer holds them (deleted by retention), never because seeks
failed to bring them.
"""
from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable, Iterable

from memstream.streams.log.records import Record

log = logging.getLogger("memstream.streams")

Loader = Callable[[str], Awaitable[dict[int, int]]]  # topic -> {partition: next offset}
Seeker = Callable[[str, int, int], Awaitable[None]]  # (topic, partition, offset)
Start = Callable[[str, int], Awaitable[int]]  # (topic, partition) -> the first offset the log still holds
Holder = Callable[[str, int, int], None]  # (topic, partition, offset): keep the consumer reading from there

RESEEK_AFTER_S = 5.0
STALLED_AFTER_S = 15.0
MAX_SEEKS = 3


async def _from_zero(topic: str, partition: int) -> int:
    return 0


def _nothing(topic: str, partition: int, offset: int) -> None:
    pass


class PositionGate:
    """``start``: where the log of a partition begins now (records before it were deleted by
    retention); the gate skips only offsets the log no longer holds. ``hold``: put the consumer's
    read offset back at a sought position (see ``_gap``)."""

    def __init__(self, name: str, load: Loader, seek: Seeker, start: Start = _from_zero, hold: Holder = _nothing):
        self.name = name
        self._load, self._seek, self._start, self._hold = load, seek, start, hold
        self._next: dict[tuple[str, int], int] = {}
        self._seeking: dict[tuple[str, int], tuple[int, float]] = {}  # tp -> (seeks, since)
        self._heard: dict[tuple[str, int], float] = {}  # tp being sought -> when a record last came
        self._moved: dict[tuple[str, int], float] = {}  # tp -> when a record was last passed
        self._passing: set[tuple[str, int]] = set()  # tps a record was passed from since assigned
        self._forgets = 0  # so far: a pass that read the store across one passes nothing

    def forget(self, tps: Iterable[tuple[str, int]]) -> None:
        """Drop cached positions (on rebalance: another worker may have moved them)."""
        self._forgets += 1
        for tp in tps:
            self._next.pop(tp, None)
            self._seeking.pop(tp, None)
            self._heard.pop(tp, None)
            self._moved.pop(tp, None)
            self._passing.discard(tp)

    def expecting(self, topic: str, partition: int) -> int | None:
        """The next offset this gate passes of the partition, if it knows it."""
        return self._next.get((topic, partition))

    def passing(self, topic: str, partition: int) -> bool:
        """Whether a record of the partition was passed since it was assigned (so its position
        here is where the store's was, plus what was passed since)."""
        return (topic, partition) in self._passing

    async def expect(self, topic: str, partitions) -> dict[int, int]:
        """Reload the stored positions of ``partitions`` (after an assignment), but for those a
        record was passed from since (also while the store was read): which are left out.
        Nothing is reloaded (``{}``) if a revoke came while the store was read."""
        forgets = self._forgets
        stored = await self._load(topic)
        if forgets != self._forgets:
            return {}  # revoked meanwhile: the store may have moved on since it was read (a batch recorded)
        fresh = [p for p in partitions if not self.passing(topic, p)]
        for p in fresh:
            self._next[(topic, p)] = stored.get(p, 0)
            self._seeking.pop((topic, p), None)
            self._heard.pop((topic, p), None)
            self._moved[(topic, p)] = time.monotonic()
        return {p: self._next[(topic, p)] for p in fresh}

    def seek_started(self, topic: str, partition: int) -> None:
        self._seeking[(topic, partition)] = (1, time.monotonic())

    async def reseek_stalled(self, highwater: Callable[[str, int], int | None]) -> None:
        """Seek again where records are in the log past the position (``highwater``) but none
        was passed for ``STALLED_AFTER_S``: Faust drops records below its own read offset, and
        a seek that raced its drain loop (which sets that offset after each record it hands on)
        leaves the re-read records dropped — seen once after a restart under load, the ingress
        stuck 43 records short with nothing more arriving to show the gap."""
        now = time.monotonic()
        for tp, expected in list(self._next.items()):
            end = highwater(*tp)
            if (end is not None and end > expected and tp not in self._seeking
                    and now - self._moved.setdefault(tp, now) >= STALLED_AFTER_S):
                log.warning("%s: %s/%s has records up to %s but none past %s came for %.0f s; seeking again",
                            self.name, tp[0], tp[1], end, expected, now - self._moved[tp])
                self._moved[tp] = now
                await self._seek(tp[0], tp[1], expected)

    async def reseek_silent(self) -> None:
        """Seek again where a seek-back delivered nothing at all for ``RESEEK_AFTER_S`` (called on
        a timer). The records are in the log — something past them arrived — so silence means the
        seek was lost (seen once in CI: a partition silent for 60 s after a seek during a join).
        A partition still delivering records past the position is ``_gap``'s to handle."""
        now = time.monotonic()
        for tp, (seeks, since) in list(self._seeking.items()):
            if now - max(since, self._heard.get(tp, 0.0)) >= RESEEK_AFTER_S and tp in self._next:
                log.warning("%s: nothing from %s/%s for %.0f s after seeking back to %s; seeking again",
                            self.name, tp[0], tp[1], now - since, self._next[tp])
                self._seeking[tp] = (seeks, now)  # not a new attempt at a gap: the gap was never seen again
                await self._seek(tp[0], tp[1], self._next[tp])

    async def filter(self, records: list[Record]) -> list[Record]:
        forgets = self._forgets
        for topic in {r.topic for r in records if (r.topic, r.partition) not in self._next}:
            stored = await self._load(topic)
            if forgets != self._forgets:
                return []  # partitions revoked meanwhile: these records are from before
            for r in records:
                if r.topic == topic:
                    self._next.setdefault((topic, r.partition), stored.get(r.partition, 0))
        passed: list[Record] = []
        for r in records:
            tp = (r.topic, r.partition)
            if tp in self._seeking:
                self._heard[tp] = time.monotonic()
            expected = self._next[tp]
            if r.offset < expected:
                continue  # already applied: a redelivery
            if r.offset > expected and not await self._gap(tp, expected, r.offset):
                continue
            self._seeking.pop(tp, None)
            self._heard.pop(tp, None)
            self._next[tp] = r.offset + 1
            self._moved[tp] = time.monotonic()
            self._passing.add(tp)
            passed.append(r)
        return passed

    async def _gap(self, tp: tuple[str, int], expected: int, got: int) -> bool:
        """Handle a record past the stored position; True means accept the gap."""
        seeks, since = self._seeking.get(tp, (0, 0.0))
        if seeks and time.monotonic() - since < RESEEK_AFTER_S:
            # A stale record, fetched before the seek: Faust moved its read offset to it as it
            # handed it on, and would drop the re-read records below it. Put it back each time.
            self._hold(tp[0], tp[1], expected)
            return False
        if seeks >= MAX_SEEKS:
            try:
                first = await self._start(*tp)
            except Exception:  # noqa: BLE001 - the broker did not say: taken as still held, sought again
                log.warning("%s: where %s/%s begins could not be read", self.name, tp[0], tp[1], exc_info=True)
                first = expected
            if first > expected:  # deleted by retention: continue where the log begins
                log.error("%s: %s/%s offsets %s..%s are not in the log any more; continuing at %s",
                          self.name, tp[0], tp[1], expected, first - 1, first)
                self._next[tp] = expected = first
                if got == first:
                    return True
                seeks = 0
            else:
                # Still in the log: never skipped, however often the seek was lost. A stalled
                # partition is seen (lag, these warnings) and tried again; skipped records are not.
                log.warning("%s: %s/%s offsets %s..%s are in the log but %d seeks did not bring them; seeking again",
                            self.name, tp[0], tp[1], expected, got - 1, seeks)
                seeks = 0
        log.warning("%s: %s/%s got offset %s but applied only up to %s; seeking back",
                    self.name, tp[0], tp[1], got, expected)
        self._seeking[tp] = (seeks + 1, time.monotonic())
        await self._seek(tp[0], tp[1], expected)
        self._hold(tp[0], tp[1], expected)
        return False


async def align(gates: list[PositionGate], topic: str, consumer_positions: dict[int, int | None], seek: Seeker) -> None:
    """After an assignment: where the consumer would resume past what the least advanced of
    ``gates`` (the steps sharing this consumer) has applied, seek back to that position. Where
    it would resume before it, the gates skip what is applied: seeking there too raced
    aiokafka's fetcher (a KeyError in ``fetched_records`` that crashed the worker, seen when
    every partition was sought at once after a restart). A partition a gate already passed
    records of is left as it is: the first of them was checked against the store, and what was
    passed since may still be in flight (a pipelined step records it later), so reloading the
    stored position would pass it twice."""
    target: dict[int, int] = {}
    for gate in gates:
        for p, expected in (await gate.expect(topic, list(consumer_positions))).items():
            target[p] = min(target.get(p, expected), expected)
    for p, at in consumer_positions.items():
        if p not in target:  # every gate passing it already
            continue
        if at is not None and at > target[p]:
            log.warning("%s/%s would resume at %s but %s applied only up to %s; seeking back",
                        topic, p, at, "/".join(g.name for g in gates), target[p])
            for gate in gates:
                gate.seek_started(topic, p)
            await seek(topic, p, target[p])
