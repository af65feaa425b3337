"""Our own view of a consumed Kafka record, independent of Faust's event objects."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Sequence


SHREDDED = "shredded"


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int  # the broker/producer timestamp: system time on the log
    # None: ``value`` is the record's plain JSON (opened, or never sealed). SHREDDED: sealed with
    # a destroyed key, ``value`` None: skipped by every step. Else why it could not be opened.
    sealing: str | None = None
    sealed_value: bytes | None = None  # the value as sealed on the log, for an opened record
    generation: int | None = None  # the user's key generation it was sealed under, for an opened record

    @property
    def wire_value(self) -> bytes | None:
        """The value as it is on the log: what a dead letter keeps."""
        return self.sealed_value if self.sealed_value is not None else self.value

    @property
    def shredded(self) -> bool:
        return self.sealing == SHREDDED

    @property
    def timestamp(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=timezone.utc)

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


def from_faust(event) -> Record:
    m = event.message
    headers = m.headers or ()
    if isinstance(headers, dict):
        headers = tuple(headers.items())
    return Record(m.topic, m.partition, m.offset, m.key, m.value, tuple(headers),
                  int(round((m.timestamp or 0) * 1000)))


def first_offsets(records: Sequence[Record]) -> dict[tuple[str, int], int]:
    """The offset of the first of ``records`` per ``(topic, partition)``."""
    out: dict[tuple[str, int], int] = {}
    for r in records:
        out[(r.topic, r.partition)] = min(out.get((r.topic, r.partition), r.offset), r.offset)
    return out


def next_offsets(records: Sequence[Record]) -> dict[tuple[str, int], int]:
    """The position after ``records``: the next offset to apply per ``(topic, partition)``."""
    out: dict[tuple[str, int], int] = {}
    for r in records:
        out[(r.topic, r.partition)] = max(out.get((r.topic, r.partition), 0), r.offset + 1)
    return out
