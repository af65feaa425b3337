"""Which records of the events topic are events memstream may apply.

Per-user order, formation's barrier and read-your-writes all rest on one user's records sharing
one partition: the one Kafka's default partitioner (murmur2 of the key, as in the Java client,
aiokafka and ``TurnLog``) gives the ``user_id``. A record that is undecodable, keyed by anything
but its ``user_id``, or on another partition (a client hashing keys another way: librdkafka's
default is CRC32) is refused with a reason that says how to fix the producer.
"""
from __future__ import annotations

from typing import Sequence

from aiokafka.partitioner import murmur2

from memstream.schemas import Event, InvalidEvent, decode_event
from memstream.streams.log.records import Record


IMPORTED = "memstream.imported"  # header of an event imported with its decisions (memstream.portability)


def imported(r: Record) -> bool:
    """The event came from another deployment's export, its decisions with it: nothing to decide."""
    return any(k == IMPORTED for k, _ in r.headers)


def expected_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` among ``partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def refusal(r: Record, event: Event, partitions: int | None) -> str | None:
    """Why ``event`` (decoded from ``r``) must not be applied, or None."""
    if r.key != event.user_id.encode():
        return "record key does not match user_id: per-user order is not guaranteed"
    if partitions is not None and (want := expected_partition(r.key, partitions)) != r.partition:
        return (f"record is on partition {r.partition}, but Kafka's default "
                f"(murmur2) partitioner puts that key on partition {want} of {partitions}: per-user order is "
                "not guaranteed. Produce with the murmur2 partitioner (kcat / librdkafka: "
                "-X partitioner=murmur2_random) or through TurnLog")
    return None


def screen(records: Sequence[Record], stage: str, partitions: int | None
          ) -> tuple[list[tuple[Record, Event]], list[tuple[Record, str, str]]]:
    """The events to apply, and ``(record, stage, reason)`` for the records to dead-letter.
    ``partitions`` is the events topic's partition count (None: not checked)."""
    events, letters = [], []
    for r in records:
        if r.sealing is not None:  # shredded: skipped; else it does not open
            if not r.shredded:
                letters.append((r, stage, r.sealing))
            continue
        try:
            event = decode_event(r.value or b"")
        except InvalidEvent as exc:
            letters.append((r, stage, f"undecodable event: {exc}"))
            continue
        if reason := refusal(r, event, partitions):
            letters.append((r, stage, reason))
        else:
            events.append((r, event))
    return events, letters
