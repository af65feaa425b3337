"""The wire contract: golden fixtures of every shipped version, validation at the edge,
upcasting, and the checked-in JSON Schema."""
import base64
import json
import struct
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from memstream.schemas import (EpisodeRecorded, InvalidEvent, TurnRecorded, UnknownEventType,
                               decode_decision, decode_event, encode, new_event_id)
from memstream.schemas.codec import validated
from memstream.schemas.events import FactCorrected, PersonIdentitySet, ReminderScheduled
from memstream.schemas.jsonschema import SCHEMA_PATH, render
from memstream.schemas.upcasting import upcast, upcaster

FIXTURES = Path(__file__).parent.parent / "fixtures" / "events"
AT = datetime(2026, 3, 1, tzinfo=timezone.utc)


def turn_json(**changes) -> bytes:
    raw = json.loads((FIXTURES / "TurnRecorded.v1.json").read_text())
    raw.update(changes)
    return json.dumps({k: v for k, v in raw.items() if v is not ...}).encode()


def test_golden_turn_recorded_v1_decodes_to_the_same_turn():
    turn = decode_event((FIXTURES / "TurnRecorded.v1.json").read_bytes())
    assert isinstance(turn, TurnRecorded)
    assert turn.event_id == uuid.UUID("0193a5b2-7c4e-7d3a-9f21-3b5e8c1d2a4f")
    assert (turn.user_id, turn.conversation_id) == ("user-42", "conv-7")
    assert turn.occurred_at == datetime(2026, 3, 1, 9, 30, tzinfo=timezone.utc)
    assert turn.user_message.startswith("I live in Lisbon")
    assert turn.metadata == {"channel": "web", "turn": 3}
    assert json.loads(encode(turn)) == json.loads((FIXTURES / "TurnRecorded.v1.json").read_text())


def test_golden_fact_forgotten_v1_keeps_the_turns_it_was_read_from():
    # v1 forgot the fact and left its turns; v2 forgets them too unless keep_episodes. Decided
    # again (a reform), a v1 forget must do what it did.
    from memstream.schemas import FactForgotten

    forget = decode_event((FIXTURES / "FactForgotten.v1.json").read_bytes())
    assert isinstance(forget, FactForgotten) and forget.schema_version == 2 and forget.keep_episodes
    assert (forget.attribute, forget.value, forget.reason) == ("home", "Porto", "private")
    assert not FactForgotten(**{**{f: getattr(forget, f) for f in forget.__struct_fields__},
                                "keep_episodes": False}).keep_episodes


def test_golden_user_forgotten_v1_keeps_no_free_text_and_v2_takes_only_a_kind_of_reason():
    # A user forget is plain on the log forever: from v2 its reason is a kind, never text a
    # tenant wrote; a v1 record's text is not carried on.
    import msgspec

    from memstream.schemas import UserForgotten
    from memstream.schemas.events import ERASURE_REASONS

    forget = decode_event((FIXTURES / "UserForgotten.v1.json").read_bytes())
    assert isinstance(forget, UserForgotten) and forget.schema_version == 2
    assert (forget.reason, forget.generation, forget.actor) == ("other", 2, "host")
    raw = json.loads((FIXTURES / "UserForgotten.v1.json").read_text())
    assert decode_event(json.dumps({**raw, "reason": ""}).encode()).reason == "unspecified"
    assert "user_request" in ERASURE_REASONS
    for reason in ERASURE_REASONS:  # a v2 forget reads back as written
        again = decode_event(encode(UserForgotten(**{**{f: getattr(forget, f) for f in forget.__struct_fields__},
                                                     "schema_version": 2, "reason": reason})))
        assert (again.schema_version, again.reason) == (2, reason)
    assert json.loads(encode(UserForgotten(event_id=forget.event_id, user_id="ana", occurred_at=forget.occurred_at,
                                           actor="user", reason="legal")))["schema_version"] == 2
    with pytest.raises((msgspec.ValidationError, InvalidEvent)):
        decode_event(json.dumps({**raw, "schema_version": 2}).encode())


def test_golden_episode_recorded_v1_decodes_with_its_embedding():
    d = decode_decision((FIXTURES / "EpisodeRecorded.v1.json").read_bytes())
    assert isinstance(d, EpisodeRecorded)
    assert d.decision_id == uuid.uuid5(d.source_event_id, "episode")
    assert (d.source.partition, d.source.offset) == (2, 17)
    assert len(d.embedding) == 384 * 4


@pytest.mark.parametrize("embedding", [b"abc", struct.pack("<f", float("nan")), struct.pack("<2f", 1.0, float("inf")),
                                       b"\0" * 4 * 4097])
def test_a_decision_whose_vector_no_store_can_build_is_refused_on_decode(embedding):
    """A decision from anyone's archive is a stranger's input: a vector of 3 bytes stopped every
    user's projections on the store that built it, where a refused decision is dead-lettered."""
    raw = json.loads((FIXTURES / "EpisodeRecorded.v1.json").read_text())
    raw["embedding"] = base64.b64encode(embedding).decode()
    with pytest.raises(InvalidEvent) as info:
        decode_decision(json.dumps(raw).encode())
    assert "embedding" in str(info.value)


@pytest.mark.parametrize("changes, field", [
    ({"user_id": ""}, "$.user_id"),
    ({"user_id": ...}, "$.user_id"),
    ({"user_id": "x" * 257}, "$.user_id"),
    ({"user_message": 5}, "$.user_message"),
    ({"occurred_at": "2026-03-01T09:30:00"}, None),  # naive: reason names occurred_at
    ({"event_id": str(uuid.uuid4())}, None),  # v4: reason names UUIDv7
    ({"conversation_id": None}, None),
    ({"metadata": {"nested": {"no": 1}}}, "$.metadata"),
])
def test_invalid_turns_name_the_field_and_the_reason(changes, field):
    with pytest.raises(InvalidEvent) as info:
        decode_event(turn_json(**changes))
    if field:
        assert info.value.field is not None and info.value.field.startswith(field)
    else:
        assert any(w in info.value.reason for w in ("occurred_at", "UUIDv7", "conversation_id"))


def test_a_turn_with_a_nul_character_is_refused_at_the_edge():
    with pytest.raises(InvalidEvent, match="NUL"):
        TurnRecorded.new(user_id="u", conversation_id="c", user_message="a\x00b", assistant_message="")


@pytest.mark.parametrize("event, field", [
    (lambda: TurnRecorded.new(user_id="u", conversation_id="c", user_message="hi", assistant_message="",
                              metadata={"k\x00": 1}), "$.metadata['k\\x00']"),
    (lambda: TurnRecorded.new(user_id="u", conversation_id="c", user_message="hi", assistant_message="",
                              metadata={"k": "v\x00"}), "$.metadata['k']"),
    (lambda: ReminderScheduled.new(user_id="u", text="call \x00 mum", due_at=AT), "$.text"),
    (lambda: FactCorrected(event_id=new_event_id(), user_id="u", occurred_at=AT, actor="user", fact_id=uuid.uuid4(),
                           value="Berlin", reason="moved\x00"), "$.reason"),
    (lambda: PersonIdentitySet(event_id=new_event_id(), user_id="u", occurred_at=AT, attributes={"tone": "\x00"}),
     "$.attributes['tone']"),
    # A day from either end of Python's datetimes overflows once shifted to UTC (asyncpg, comparisons).
    (lambda: TurnRecorded.new(user_id="u", conversation_id="c", user_message="hi", assistant_message="",
                              occurred_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))), "$.occurred_at"),
    (lambda: TurnRecorded.new(user_id="u", conversation_id="c", user_message="hi", assistant_message="",
                              occurred_at=datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))),
     "$.occurred_at"),
    (lambda: ReminderScheduled.new(user_id="u", text="call mum", due_at=datetime(9999, 12, 31, tzinfo=timezone.utc)),
     "$.due_at"),
])
def test_a_nul_or_a_time_no_store_can_hold_is_refused_in_any_field(event, field):
    # Postgres text takes no NUL; each would stop every step that stores the record, then again on restart.
    with pytest.raises(InvalidEvent) as info:
        event()
    assert info.value.field == field


def test_a_turn_with_a_lone_surrogate_is_refused_naming_the_field():
    # It cannot be written as UTF-8: the encoder raised UnicodeEncodeError instead of InvalidEvent.
    turn = TurnRecorded.new(user_id="u", conversation_id="c", user_message="hi", assistant_message="a\ud800b")
    with pytest.raises(InvalidEvent, match="not valid Unicode") as info:
        validated(turn)
    assert info.value.field == "$.assistant_message"


def test_constraints_msgspec_checks_only_on_decode_are_enforced_by_validated():
    turn = TurnRecorded.new(user_id="u" * 300, conversation_id="c", user_message="hi", assistant_message="")
    with pytest.raises(InvalidEvent) as info:
        validated(turn)
    assert info.value.field == "$.user_id"


def test_a_turn_too_big_for_a_kafka_record_once_sealed_is_refused_at_the_edge():
    # Each message within its length, four bytes a character: 800 kB as JSON, over 1 MiB sealed.
    turn = TurnRecorded.new(user_id="u", conversation_id="c", user_message="😀" * 100_000, assistant_message="😀" * 100_000)
    with pytest.raises(InvalidEvent, match="at most 524,288"):
        validated(turn)
    validated(TurnRecorded.new(user_id="u", conversation_id="c", user_message="a" * 100_000, assistant_message="b" * 100_000))


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_a_number_json_cannot_hold_is_refused_not_stored_as_null(number):
    with pytest.raises(InvalidEvent, match="finite") as info:
        TurnRecorded.new(user_id="u", conversation_id="c", user_message="hi", assistant_message="", metadata={"score": number})
    assert info.value.field == "$.metadata['score']"


def test_undecodable_bytes_raise_invalid_event():
    with pytest.raises(InvalidEvent):
        decode_event(b"{not json")


def test_an_unknown_type_or_a_newer_version_is_refused_not_guessed():
    with pytest.raises(UnknownEventType):
        decode_event(turn_json(type="TurnDeleted"))
    with pytest.raises(UnknownEventType, match="newer"):
        decode_event(turn_json(schema_version=2))


def test_upcasters_chain_from_old_versions_to_the_current_one():
    @upcaster("TestThing", 1)
    def v1_to_v2(raw):
        raw = dict(raw)
        raw["name"] = raw.pop("title")
        return raw

    @upcaster("TestThing", 2)
    def v2_to_v3(raw):
        return {**raw, "tags": []}

    out = upcast({"type": "TestThing", "schema_version": 1, "title": "x"}, 3)
    assert out == {"type": "TestThing", "schema_version": 3, "name": "x", "tags": []}
    with pytest.raises(LookupError):
        upcast({"type": "TestThing", "schema_version": 1, "title": "x"}, 4)


def test_new_event_ids_are_uuid7_and_time_ordered():
    ids = [new_event_id() for _ in range(50)]
    assert all(i.version == 7 for i in ids)
    assert [i.bytes[:6] for i in ids] == sorted(i.bytes[:6] for i in ids)


@settings(max_examples=200, deadline=None)
@given(
    user_id=st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s),
    user_message=st.text(max_size=200).filter(lambda s: "\x00" not in s and s.strip()),
    assistant_message=st.text(max_size=200).filter(lambda s: "\x00" not in s),
    metadata=st.none() | st.dictionaries(st.text(max_size=10).filter(lambda s: "\x00" not in s),
                                         st.integers() | st.text(max_size=10).filter(lambda s: "\x00" not in s)
                                         | st.booleans(), max_size=4),
)
def test_any_valid_turn_round_trips_through_the_wire_format(user_id, user_message, assistant_message, metadata):
    turn = TurnRecorded.new(user_id=user_id, conversation_id="c", user_message=user_message,
                            assistant_message=assistant_message, metadata=metadata)
    assert decode_event(encode(turn)) == turn


def test_the_checked_in_json_schema_is_current():
    assert SCHEMA_PATH.read_text() == render(), "run `memstream jsonschema`"


def test_every_type_writes_the_version_it_is():
    # A record written as v1 of a v2 type would be upcast on reading, changing what it says.
    from memstream.schemas.events import DECISION_TYPES, EVENT_TYPES

    for cls in (*EVENT_TYPES, *DECISION_TYPES):
        default = dict(zip(cls.__struct_fields__[-len(cls.__struct_defaults__):], cls.__struct_defaults__))
        assert default["schema_version"] == cls.SCHEMA_VERSION, cls.__name__


_ID = str(uuid.uuid4())
# Each event type's own fields, the least that is valid: every type the log takes is here.
BODIES = {
    "TurnRecorded": {"conversation_id": "c", "user_message": "hi", "assistant_message": ""},
    "ReminderScheduled": {"reminder_id": _ID, "text": "call mum", "due_at": "2026-03-02T09:00:00Z"},
    "ReminderResolved": {"reminder_id": _ID, "status": "done"},
    "PersonIdentitySet": {"attributes": {"tone": "warm"}},
    "ExpertIdentityUpserted": {"identity_id": "coach", "name": "Coach", "instructions": "Be brief."},
    "ExpertIdentityDeleted": {"identity_id": "coach"},
    "FactCorrected": {"actor": "user", "fact_id": _ID, "value": "Berlin"},
    "FactForgotten": {"actor": "user", "fact_id": _ID},
    "EpisodeForgotten": {"actor": "user", "turn_event_id": _ID},
    "EdgeForgotten": {"actor": "user", "edge_id": _ID},
    "UserForgotten": {"actor": "user"},
    "MemoriesUsed": {"fact_ids": [_ID]},
    "DecaySwept": {"actor": "operator", "sweep_id": _ID, "policy": "p", "cooled": [_ID]},
    "ReflectRequested": {"actor": "operator", "sweep_id": _ID, "policy": "p",
                         "clusters": [{"sources": [_ID, str(uuid.uuid4())], "observations": 2}]},
}


def test_the_envelope_bodies_cover_every_event_type():
    from memstream.schemas.events import EVENT_TYPES

    assert set(BODIES) == {cls.__name__ for cls in EVENT_TYPES}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_every_event_type_refuses_a_time_no_store_holds_a_nul_and_the_wrong_key(name):
    """Its own checks (a type that has some) must not replace the envelope's: a MemoriesUsed dated
    9999-12-31T23:00-05:00 reached the log and stopped its partition's commands projection."""
    from memstream.schemas.events import HOST_WIDE_TYPES, SYSTEM_USER

    host_wide = name in {cls.__name__ for cls in HOST_WIDE_TYPES}

    def record(**changes) -> bytes:
        envelope = {"type": name, "event_id": str(new_event_id()), "user_id": SYSTEM_USER if host_wide else "u",
                    "occurred_at": "2026-03-01T09:30:00Z", "schema_version": 1}
        return json.dumps({**envelope, **BODIES[name], **changes}).encode()

    assert type(decode_event(record())).__name__ == name
    for changes, field in (({"occurred_at": "2026-03-01T09:30:00"}, "$.occurred_at"),
                           ({"occurred_at": "9999-12-31T23:00:00-05:00"}, "$.occurred_at"),
                           ({"conversation_id": "c\x00"}, "$.conversation_id"),
                           ({"user_id": "u" if host_wide else SYSTEM_USER}, "$.user_id")):
        with pytest.raises(InvalidEvent) as info:
            decode_event(record(**changes))
        assert str(info.value).startswith(field), (changes, info.value)
