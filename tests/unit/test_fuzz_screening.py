"""The events' decoders and the screening of records, fuzzed: any bytes, and valid records mutated
byte by byte or field by field, are decoded or refused with ``InvalidEvent`` (nothing else
escapes, so a step never stops on a record), and ``screen`` accounts for every record — applied,
or dead-lettered with a reason. A screen that swallows a decode error fails the same property."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memstream.schemas import InvalidEvent, TurnRecorded, decode_event, encode
from memstream.schemas.codec import decode_decision
from memstream.schemas.events import DECISION_TYPES, EVENT_TYPES
from memstream.streams.log import screening
from memstream.streams.log.records import Record

VALID = encode(TurnRecorded.new(user_id="u", conversation_id="c", user_message="I live in Porto.",
                                assistant_message="ok"))
TYPES = [c.__struct_config__.tag for c in (*EVENT_TYPES, *DECISION_TYPES)] + ["Nope"]
JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=12), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


@st.composite
def fuzzed(draw) -> bytes:
    """Random bytes, or a valid turn with bytes flipped, cut short, fields replaced or dropped, its
    type and version changed, or a value nested past any parser's depth."""
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.binary(max_size=300))
    if kind == 1:
        data = bytearray(VALID)
        for at, byte in draw(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=5)):
            data[at] = byte
        return bytes(data[:draw(st.integers(0, len(VALID)))])
    raw = json.loads(VALID)
    if kind == 2:
        for field, value in draw(st.lists(st.tuples(st.sampled_from([*raw, "extra"]), JUNK), min_size=1, max_size=3)):
            raw[field] = value
        for field in draw(st.lists(st.sampled_from(list(raw)), max_size=2)):
            raw.pop(field, None)
    elif kind == 3:
        raw["type"], raw["schema_version"] = draw(st.sampled_from(TYPES)), draw(st.integers(-2, 5))
    else:
        depth = draw(st.sampled_from([10, 5_000, 50_000]))
        field = draw(st.sampled_from(["user_message", "metadata", "unknown"]))
        return json.dumps(raw)[:-1].encode() + f', "{field}": '.encode() + b"[" * depth + b"]" * depth + b"}"
    return json.dumps(raw).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzzed())
def test_the_decoders_refuse_anything_that_is_not_a_record_with_invalid_event_only(data):
    for decode in (decode_event, decode_decision):
        try:
            decode(data)
        except InvalidEvent as exc:
            assert exc.reason


def test_a_value_nested_past_the_recursion_limit_is_refused_not_raised():
    # It once escaped the decoder as RecursionError and stopped the worker at that record, every restart.
    deep = VALID[:-1] + b', "user_message": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(InvalidEvent, match="recursion"):
        decode_event(deep)


def accounted(screen) -> None:
    """The property, for any ``screen``: every record is applied or dead-lettered with a reason, once."""
    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(st.lists(st.one_of(fuzzed(), st.just(VALID)), max_size=8))
    def every_record(values):
        records = [Record("ev", 0, n, b"u", v, (), 1_764_000_000_000) for n, v in enumerate(values)]
        events, letters = screen(records, "formation", None)
        assert sorted([r.offset for r, _ in events] + [r.offset for r, _, _ in letters]) == list(range(len(records)))
        assert all(reason for _, _, reason in letters)
        for r, event in events:
            assert event == decode_event(r.value)

    every_record()


def test_screening_applies_or_dead_letters_every_record():
    accounted(screening.screen)


def test_a_screen_that_swallows_a_decode_error_fails_the_property():
    def swallowing(records, stage, partitions):  # the planted bug
        events = []
        for r in records:
            try:
                events.append((r, decode_event(r.value)))
            except InvalidEvent:
                continue
        return events, []

    with pytest.raises(AssertionError):
        accounted(swallowing)
