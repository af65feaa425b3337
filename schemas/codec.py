"""Bytes <-> events and decisions, with typed errors that name the field and the reason."""
from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from memstream.schemas.errors import InvalidEvent, UnknownEventType, not_utf8
from memstream.schemas.events import DECISION_TYPES, EVENT_TYPES, MAX_EVENT_BYTES, Decision, Event
from memstream.schemas.upcasting import upcast

T = TypeVar("T", Event, Decision)

_EVENTS = {cls.__struct_config__.tag: cls for cls in EVENT_TYPES}
_DECISIONS = {cls.__struct_config__.tag: cls for cls in DECISION_TYPES}
_encoder = msgspec.json.Encoder()
_PATH = re.compile(r"^(?P<reason>.*?)(?: - at `(?P<field>[^`]+)`)?$", re.S)
_MISSING = re.compile(r"missing required field `(?P<name>[^`]+)`")
# What msgspec raises on bytes that are not the JSON asked for. RecursionError too: it walks nested
# values (even those it skips) within Python's recursion limit, and a record nested deeper (no
# event is) must be refused as any other malformed record is, not stop the step that reads it.
MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


class _Header(msgspec.Struct):
    type: str
    schema_version: int = 1


def encode(record: Event | Decision) -> bytes:
    return _encoder.encode(record)


def _invalid(exc: Exception) -> InvalidEvent:
    m = _PATH.match(str(exc))
    assert m is not None
    field, missing = m["field"], _MISSING.search(m["reason"])
    if missing:
        field = f"{field or '$'}.{missing['name']}"
    return InvalidEvent(m["reason"], field)


def _decode(data: bytes, registry: dict[str, type[T]]) -> T:
    try:
        header = msgspec.json.decode(data, type=_Header)
    except MALFORMED as exc:
        raise _invalid(exc) from exc
    cls = registry.get(header.type)
    if cls is None:
        raise UnknownEventType(f"unknown type {header.type!r}", "$.type")
    current = cls.SCHEMA_VERSION
    if header.schema_version > current:
        raise UnknownEventType(
            f"{header.type} v{header.schema_version} is newer than this build reads (v{current})",
            "$.schema_version",
        )
    try:
        if header.schema_version == current:
            return msgspec.json.decode(data, type=cls)
        raw = upcast(msgspec.json.decode(data), current)
        return msgspec.convert(raw, cls)
    except MALFORMED as exc:
        raise _invalid(exc) from exc
    except LookupError as exc:
        raise UnknownEventType(str(exc), "$.schema_version") from exc


def decode_event(data: bytes) -> Event:
    """Decode (and upcast) one record of the events topic, or raise ``InvalidEvent``."""
    return _decode(data, _EVENTS)


def decode_decision(data: bytes) -> Decision:
    """Decode (and upcast) one record of the decisions topic, or raise ``InvalidEvent``."""
    return _decode(data, _DECISIONS)


def validated(record: T) -> T:
    """Round-trip ``record`` through the wire format so that constraints that msgspec only
    checks on decode (lengths, types) are enforced at the edge, before anything is sent."""
    registry = _EVENTS if isinstance(record, Event) else _DECISIONS
    try:
        data = encode(record)
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 for it, so no JSON
        field = next((f"$.{f.name}" for f in msgspec.structs.fields(record)
                      if isinstance(v := getattr(record, f.name), str) and not_utf8(v)), None)
        raise InvalidEvent(f"not valid Unicode: {exc.reason}", field) from None
    if isinstance(record, Event):
        check_size(data)
    return _decode(data, registry)


def check_size(record_json: bytes, limit: int = MAX_EVENT_BYTES) -> None:
    """``InvalidEvent`` if a record of this JSON would pass Kafka's record limit once sealed
    (``limit``: an event's, or ``MAX_DECISION_BYTES`` for a decision)."""
    if len(record_json) > limit:
        raise InvalidEvent(f"the record is {len(record_json):,} bytes as JSON; at most {limit:,} "
                           "(Kafka's record limit, once sealed)", "$")
