"""Event and decision types, as msgspec Structs in tagged unions.

Every record on a memstream topic is a flat JSON object: the envelope fields below plus the
fields of its type. ``type`` is a stable literal (never a module path) and ``schema_version``
says which shape of that type the record has; older shapes are upcast on read
(see ``upcasting``). Events are what hosts say happened (``memstream.events``); decisions are
what formation decided about them (``memstream.decisions``), including anything that was not
deterministic to compute, such as an embedding.
"""
from __future__ import annotations

import math
import os
import time
import uuid
from datetime import datetime
from typing import Annotated, ClassVar, Literal, get_args

import msgspec

from memstream.schemas.errors import InvalidEvent

MAX_ID_CHARS = 256
MAX_MESSAGE_CHARS = 100_000
# One event as JSON, at most: sealed (base64, a third more) it stays under Kafka's default 1 MiB
# record limit. Two messages of MAX_MESSAGE_CHARS four-byte characters would not.
MAX_EVENT_BYTES = 512 * 1024
# A long turn is embedded in windows, each within the embedder's; the first MAX_PASSAGES of
# them carry a vector (the rest of the text is still found by its words): the first is the
# episode's own, the others its passages.
MAX_PASSAGES = 32
PASSAGE_BYTES = 2200  # a passage's vector of 384 dimensions as base64 JSON, with its span
# At most its turn's text, a vector and its passages' vectors; sealed, a third more, it still
# fits Kafka's default 1 MiB record limit.
MAX_DECISION_BYTES = MAX_EVENT_BYTES + 64 * 1024 + MAX_PASSAGES * PASSAGE_BYTES


def passages_within(dim: int) -> int:
    """How many of a turn's windows carry a vector of ``dim`` dimensions: ``MAX_PASSAGES`` at
    384 (MiniLM), fewer for a larger vector, so its passages take no more of a decision's bytes."""
    vector = lambda d: d * 4 * 4 // 3  # noqa: E731  (float32s as base64)
    per = PASSAGE_BYTES - vector(384) + vector(dim)
    return max(1, min(MAX_PASSAGES, MAX_PASSAGES * PASSAGE_BYTES // per))

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
Message = Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE_CHARS)]
MetadataValue = str | int | float | bool | None


def new_event_id() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits; sorts by creation time."""
    ms = time.time_ns() // 1_000_000
    raw = bytearray(ms.to_bytes(6, "big") + os.urandom(10))
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    return uuid.UUID(bytes=bytes(raw))


class LogPosition(msgspec.Struct, frozen=True):
    """Where a record sits in the log. Returned by appends; accepted by reads (``after=``)."""

    topic: str
    partition: int
    offset: int


SYSTEM_USER = "__memstream__"  # the log key of host-wide commands (expert identities), and only theirs

# Python's datetimes end at years 1 and 9999: a time within a day of either end overflows once
# shifted to UTC (asyncpg, every comparison across offsets) and would stop every step storing it.
EARLIEST, LATEST = datetime(2, 1, 1), datetime(9998, 12, 31)
STORABLE_TIMES = f"between {EARLIEST.isoformat()[:10]} and {LATEST.isoformat()[:10]}"


def in_range(when: datetime) -> bool:
    """Whether ``when`` is a time memstream can store and compare: with an offset, between
    ``EARLIEST`` and ``LATEST`` (as the clock on the wall said it)."""
    return when.tzinfo is not None and EARLIEST <= when.replace(tzinfo=None) <= LATEST


def _check_values(value, path: str) -> None:
    # Postgres text takes no NUL, and no time past ``in_range``: a record with one would stop
    # every step that stores it, whichever of its fields holds it.
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidEvent(f"{path[2:]} must not contain NUL characters", path)
    elif isinstance(value, float):
        if not math.isfinite(value):  # JSON has no NaN or infinity: it would be stored as null
            raise InvalidEvent(f"{path[2:]} must be a finite number", path)
    elif isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidEvent(f"{path[2:]} must carry a timezone offset", path)
        if not in_range(value):
            raise InvalidEvent(f"{path[2:]} must fall {STORABLE_TIMES}", path)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_values(k, f"{path}[{k!r}]")
            _check_values(v, f"{path}[{k!r}]")


def _check_envelope(ev: Event) -> None:
    for name in ev.__struct_fields__:
        _check_values(getattr(ev, name), f"$.{name}")
    if ev.event_id.version != 7:
        raise InvalidEvent("event_id must be a UUIDv7", "$.event_id")
    # Host-wide records only under the host-wide key, and nothing of a user's under it: its
    # records share one partition, so their order (and a replay) is defined, and no user id
    # can reach what every user's read receives.
    if (ev.user_id == SYSTEM_USER) != isinstance(ev, HOST_WIDE_TYPES):
        raise InvalidEvent(f"{type(ev).__name__} is host-wide: user_id must be {SYSTEM_USER!r}"
                           if isinstance(ev, HOST_WIDE_TYPES) else
                           f"{SYSTEM_USER!r} is the host-wide key, not a user id", "$.user_id")


class Event(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Envelope of every event on the per-user events topic."""

    SCHEMA_VERSION: ClassVar[int] = 1

    event_id: uuid.UUID
    user_id: Id
    occurred_at: datetime
    schema_version: int = 1
    conversation_id: Id | None = None

    def __post_init__(self) -> None:
        _check_envelope(self)


class TurnRecorded(Event, tag="TurnRecorded", kw_only=True, frozen=True):
    """A completed conversation turn: what the user said and what the assistant answered."""

    SCHEMA_VERSION: ClassVar[int] = 1

    user_message: Message
    assistant_message: Message
    metadata: dict[str, MetadataValue] | None = None

    def __post_init__(self) -> None:
        _check_envelope(self)
        if self.conversation_id is None:
            raise InvalidEvent("conversation_id is required for a turn", "$.conversation_id")
        if not (self.user_message.strip() or self.assistant_message.strip()):
            raise InvalidEvent("a turn needs a user or an assistant message", "$.user_message")

    @classmethod
    def new(
        cls,
        *,
        user_id: str,
        conversation_id: str,
        user_message: str,
        assistant_message: str,
        occurred_at: datetime | None = None,
        metadata: dict[str, MetadataValue] | None = None,
    ) -> TurnRecorded:
        """Build a turn with a fresh UUIDv7; ``occurred_at`` defaults to now (UTC)."""
        from datetime import timezone

        return cls(
            event_id=new_event_id(),
            user_id=user_id,
            conversation_id=conversation_id,
            occurred_at=occurred_at or datetime.now(timezone.utc),
            user_message=user_message,
            assistant_message=assistant_message,
            metadata=metadata,
        )


ReminderStatus = Literal["done", "dismissed"]


class ReminderScheduled(Event, tag="ReminderScheduled", kw_only=True, frozen=True):
    """Prospective memory: remind the user of ``text`` from ``due_at`` on, until resolved."""

    SCHEMA_VERSION: ClassVar[int] = 1

    reminder_id: uuid.UUID
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
    due_at: datetime

    @classmethod
    def new(cls, *, user_id: str, text: str, due_at: datetime, conversation_id: str | None = None,
            occurred_at: datetime | None = None) -> ReminderScheduled:
        from datetime import timezone

        event_id = new_event_id()
        return cls(event_id=event_id, user_id=user_id, conversation_id=conversation_id,
                   occurred_at=occurred_at or datetime.now(timezone.utc),
                   reminder_id=uuid.uuid5(event_id, "reminder"), text=text, due_at=due_at)


class ReminderResolved(Event, tag="ReminderResolved", kw_only=True, frozen=True):
    """The reminder was done or dismissed: it stops being returned."""

    SCHEMA_VERSION: ClassVar[int] = 1

    reminder_id: uuid.UUID
    status: ReminderStatus


IdentityAttributes = dict[str, MetadataValue]


class PersonIdentitySet(Event, tag="PersonIdentitySet", kw_only=True, frozen=True):
    """The host's durable record of who the user is (display name, tone, language...); replaces
    the previous one. Not derived from conversation: the host writes it on purpose."""

    SCHEMA_VERSION: ClassVar[int] = 1

    attributes: IdentityAttributes


class ExpertIdentityUpserted(Event, tag="ExpertIdentityUpserted", kw_only=True, frozen=True):
    """A host-authored persona, selected explicitly per read (``identity_id``). Only under
    ``user_id = SYSTEM_USER`` (refused otherwise, at the producer and in the projection): expert
    identities are host-wide, not a user's memory."""

    SCHEMA_VERSION: ClassVar[int] = 1

    identity_id: Id
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    instructions: Annotated[str, msgspec.Meta(max_length=20_000)]
    attributes: IdentityAttributes | None = None


class ExpertIdentityDeleted(Event, tag="ExpertIdentityDeleted", kw_only=True, frozen=True):
    SCHEMA_VERSION: ClassVar[int] = 1

    identity_id: Id


Actor = Literal["user", "host", "operator"]
ACTORS: tuple[str, ...] = get_args(Actor)
Reason = Annotated[str, msgspec.Meta(max_length=1000)]


class _Control(Event, kw_only=True, frozen=True):
    """What the person remembered (``actor="user"``), the host on their behalf, or an operator
    asked of their memory, and why; recorded with the changes it causes, so history says who."""

    actor: Actor
    reason: Reason = ""


class FactCorrected(_Control, tag="FactCorrected", kw_only=True, frozen=True):
    """``fact_id`` is wrong: its lineage gets a new version saying ``text`` (default: the old
    text with the new value in place of the old) with ``value``. Explicit: it passes the safety
    gate."""

    SCHEMA_VERSION: ClassVar[int] = 1

    fact_id: uuid.UUID
    value: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)] | None = None


class FactForgotten(_Control, tag="FactForgotten", kw_only=True, frozen=True):
    """Forget ``fact_id``: it ends (status ``forgotten``) and no replay or reform learns it again
    from the turns it came from; a later statement may learn it anew. ``attribute`` and ``value``
    (filled by ``memstream.control``) find it again when a reform with another extractor gave
    it another id. The edges stating the same relationship are forgotten with it, and so are the
    turns it was read from (their episodes), unless ``keep_episodes``. v2 added
    ``keep_episodes``; a v1 forget kept the turns, and keeps them when decided again (upcast)."""

    SCHEMA_VERSION: ClassVar[int] = 2

    schema_version: int = 2
    fact_id: uuid.UUID
    attribute: Annotated[str, msgspec.Meta(max_length=100)] | None = None
    # As long as a fact's value can be (it is read from a message): a forget copies it.
    value: Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE_CHARS)] | None = None
    keep_episodes: bool = False


class EpisodeForgotten(_Control, tag="EpisodeForgotten", kw_only=True, frozen=True):
    """Forget the turn appended as event ``turn_event_id``: its episode leaves episodes, Tier 0
    and the keyword postings; facts and edges whose only evidence it is are forgotten with it,
    others keep a note that one of their sources is gone."""

    SCHEMA_VERSION: ClassVar[int] = 1

    turn_event_id: uuid.UUID


class EdgeForgotten(_Control, tag="EdgeForgotten", kw_only=True, frozen=True):
    """Forget relationship ``edge_id``: it ends, and the graph no longer shows it, now or as of
    any date. ``relation``, ``source`` and ``target`` (the names of its ends, or the target's
    value; filled by ``memstream.control``) find it again when a reform with another extractor
    gave it another id."""

    SCHEMA_VERSION: ClassVar[int] = 1

    edge_id: uuid.UUID
    relation: Annotated[str, msgspec.Meta(max_length=100)] | None = None
    source: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    target: Annotated[str, msgspec.Meta(max_length=500)] | None = None


class MemoriesUsed(Event, tag="MemoriesUsed", kw_only=True, frozen=True):
    """The host used these of the user's facts and episodes (ids as ``read`` returned them) in an
    answer: recall feedback, counted by the commands projection, that a decay sweep weighs (a fact
    in use is not archived, an episode in use stays in the hot index or comes back to it). Sent by
    the host, never by the read path inline. Names at least one memory."""

    SCHEMA_VERSION: ClassVar[int] = 1

    fact_ids: Annotated[list[uuid.UUID], msgspec.Meta(max_length=100)] = []
    episode_ids: Annotated[list[uuid.UUID], msgspec.Meta(max_length=100)] = []

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.fact_ids and not self.episode_ids:
            raise ValueError("MemoriesUsed names no fact and no episode")


class SweptFact(msgspec.Struct, kw_only=True, frozen=True):
    """One fact a decay sweep found weak, with what it weighed: its strength at the sweep's time
    and the inputs it was computed from."""

    fact_id: uuid.UUID
    strength: Annotated[float, msgspec.Meta(ge=0, le=1)]
    observations: Annotated[int, msgspec.Meta(ge=0)]
    uses: Annotated[int, msgspec.Meta(ge=0)]
    idle_days: Annotated[float, msgspec.Meta(ge=0)]
    rate: Annotated[float, msgspec.Meta(ge=0)]


class DecaySwept(_Control, tag="DecaySwept", kw_only=True, frozen=True):
    """A decay sweep (``sweep_id``, under ``policy``) found these of the user's facts weak as of
    ``occurred_at`` (the sweep's own clock, recorded here so no replay reads one). Formation
    archives each that is still the current version the sweep weighed and was not observed
    again since (``FactArchived``); the others it leaves. The episodes it names go to the cold
    vector index or come back from it (``EpisodesSwept``)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    sweep_id: uuid.UUID
    policy: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    facts: Annotated[list[SweptFact], msgspec.Meta(max_length=1000)] = []
    # Episodes (by episode id) to move out of the hot vector index (old, never used since) and
    # back into it (used since they left): ``EpisodesSwept``.
    cooled: Annotated[list[uuid.UUID], msgspec.Meta(max_length=1000)] = []
    warmed: Annotated[list[uuid.UUID], msgspec.Meta(max_length=1000)] = []

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.facts or self.cooled or self.warmed):
            raise ValueError("DecaySwept names no fact and no episode")


class ReflectionCluster(msgspec.Struct, kw_only=True, frozen=True):
    """Memories of one user a reflection sweep found close in meaning — facts (``sources``, by
    id) and turns no fact was read from (``turns``, by event id: the user's own words) — at
    least two all told, and how often the user said them (``observations``: a fact's
    observations, one per turn)."""

    sources: Annotated[list[uuid.UUID], msgspec.Meta(max_length=32)]
    observations: Annotated[int, msgspec.Meta(ge=0)]
    turns: Annotated[list[uuid.UUID], msgspec.Meta(max_length=32)] = []

    def __post_init__(self) -> None:
        _two_sources(self)


def _two_sources(s) -> None:
    if len(s.sources) + len(s.turns) < 2:
        raise ValueError(f"{type(s).__name__} names fewer than two facts and turns")


class ReflectRequested(_Control, tag="ReflectRequested", kw_only=True, frozen=True):
    """A reflection sweep (``sweep_id``, under ``policy``) found these clusters among the user's
    facts and turns as of ``occurred_at``. Formation, in the request's place among the user's
    turns, asks the reflection model for one sentence per cluster whose facts are still current
    and whose turns are still remembered, and records
    what it answered (``ReflectionRecorded``) or why it was not kept (``FactRefused``)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    sweep_id: uuid.UUID
    policy: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    clusters: Annotated[list[ReflectionCluster], msgspec.Meta(min_length=1, max_length=100)]


# Why a whole user was forgotten. A user forget stays plain on the log forever (it is read after
# the key is gone), so it carries one of these, never text a host or tenant wrote.
ErasureReason = Literal["unspecified", "user_request", "account_closed", "retention", "legal", "other"]
ERASURE_REASONS: tuple[str, ...] = get_args(ErasureReason)


class UserForgotten(_Control, tag="UserForgotten", kw_only=True, frozen=True):
    """Forget the user: every row and cache key of theirs is deleted, by every projection, and
    their data key ``generation`` is destroyed (filled when the record is sealed onto the log;
    0: they had none). Kept plain on the log, so it is read after the key is gone: its
    ``reason`` is an ``ErasureReason`` (v1 took free text: upcast to "other")."""

    SCHEMA_VERSION: ClassVar[int] = 2

    schema_version: int = 2
    reason: ErasureReason = "unspecified"
    generation: Annotated[int, msgspec.Meta(ge=0)] | None = None


MAX_DIMENSIONS = 4096


def _check_embedding(d: Decision) -> None:
    """A vector every store can build from ``d.embedding``: whole little-endian float32s, at most
    ``MAX_DIMENSIONS``, all finite (a decision a stranger's archive carries is checked as much as
    formation's own: one that no store can build would stop every user's projections)."""
    _check_vector(d.embedding, "$.embedding")


def _check_vector(vector: bytes, where: str) -> None:
    if len(vector) % 4 or len(vector) > 4 * MAX_DIMENSIONS:
        raise InvalidEvent(f"embedding must be whole float32s, at most {MAX_DIMENSIONS}: "
                           f"not {len(vector)} bytes", where)
    import numpy as np  # here: a host importing the schemas need not load numpy

    if not np.isfinite(np.frombuffer(vector, "<f4")).all():
        raise InvalidEvent("embedding holds NaN or infinity", where)


def ends_user(record: Event | Decision) -> bool:
    """Whether ``record`` forgets its whole user: the request, or what formation made of it."""
    return isinstance(record, UserForgotten) or (isinstance(record, MemoryForgotten) and record.kind == "user")


class Decision(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Envelope of every record on the decisions topic.

    ``decision_id`` derives from the source event (uuid5), so a decision produced twice for the
    same event is the same decision. ``source`` is the event's log position and
    ``recorded_at`` the source record's log timestamp: system time, identical on replay.
    """

    SCHEMA_VERSION: ClassVar[int] = 1

    decision_id: uuid.UUID
    source_event_id: uuid.UUID
    source: LogPosition
    recorded_at: datetime
    user_id: Id
    schema_version: int = 1


class Passage(msgspec.Struct, kw_only=True, frozen=True):
    """One window of a long episode's text (``user_message + "\n" + assistant_message``, as
    embedded): characters ``start`` to ``end`` and their vector, of the episode's model."""

    start: Annotated[int, msgspec.Meta(ge=0)]
    end: Annotated[int, msgspec.Meta(ge=0)]
    embedding: bytes


class EpisodeRecorded(Decision, tag="EpisodeRecorded", kw_only=True, frozen=True):
    """A turn became an episode, with the embedding formation computed for it.

    ``embedding`` is the vector of the text's first window. A text longer than the embedder's
    window also has ``passages``: its later windows in order, each with its characters and
    vector, so the episode is found by its best-matching passage and a read can return that
    passage alone. Empty for a turn that fits one window (and in every record written before
    passages existed: those episodes are matched by their first window, as they were)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    conversation_id: Id
    occurred_at: datetime
    user_message: Message
    assistant_message: Message
    metadata: dict[str, MetadataValue] | None = None
    embedding: bytes  # little-endian float32, base64 in JSON
    embedding_model: str
    passages: Annotated[list[Passage], msgspec.Meta(max_length=MAX_PASSAGES - 1)] = []

    def __post_init__(self) -> None:
        _check_embedding(self)
        size = len(self.user_message) + 1 + len(self.assistant_message)
        for i, p in enumerate(self.passages):
            if not p.start < p.end <= size or len(p.embedding) != len(self.embedding):
                raise InvalidEvent(f"passage {i} must be a non-empty span of the text with a vector like "
                                   f"the episode's", f"$.passages[{i}]")
            _check_vector(p.embedding, f"$.passages[{i}].embedding")


class FactDecision(Decision, kw_only=True, frozen=True):
    """Common fields of fact decisions: who decided (extractor and resolver model ids), why, and
    how sure. ``explicit`` is True when the user stated the fact rather than implied it."""

    extractor: str
    resolver: str
    reason: str
    confidence: float
    explicit: bool
    # When the user said what an observation rests on (the turn's own time; a correction's): a
    # fact's idle time for decay runs from it, or from ``recorded_at`` if that is earlier (a
    # turn dated ahead keeps nothing fresh) or this is absent (decisions recorded before it).
    said_at: datetime | None = None


class _FactBody(FactDecision, kw_only=True, frozen=True):
    """A decision that writes a fact version."""

    fact_id: uuid.UUID  # uuid5(source_event_id, "fact:<n>")
    text: str
    category: str
    attribute: str
    value: str
    valid_from: datetime  # world time the fact became true (stated, or the turn's occurred_at)
    embedding: bytes
    embedding_model: str

    def __post_init__(self) -> None:
        _check_embedding(self)


class FactAdded(_FactBody, tag="FactAdded", kw_only=True, frozen=True):
    """A new fact is believed."""

    SCHEMA_VERSION: ClassVar[int] = 1


class FactUpdated(_FactBody, tag="FactUpdated", kw_only=True, frozen=True):
    """``supersedes`` stops being believed and the new version ``fact_id`` replaces it."""

    SCHEMA_VERSION: ClassVar[int] = 1

    supersedes: uuid.UUID


class FactDeleted(FactDecision, tag="FactDeleted", kw_only=True, frozen=True):
    """``target`` stops being believed (the user retracted it or said it ended)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    target: uuid.UUID
    valid_to: datetime


class FactReinforced(FactDecision, tag="FactReinforced", kw_only=True, frozen=True):
    """The NOOP that counts: ``target`` was observed again (a repeat or a near-duplicate)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    target: uuid.UUID


class FactChangeDeferred(FactDecision, tag="FactChangeDeferred", kw_only=True, frozen=True):
    """The safety gate refused to let an inferred candidate change a gated fact (identity,
    constraint). Recorded so that repeated observations of the same value are counted from the
    log, deterministically, until they reach the gate's threshold."""

    SCHEMA_VERSION: ClassVar[int] = 1

    target: uuid.UUID
    operation: str  # the refused operation: UPDATE or DELETE
    value: str
    text: str


REFUSAL_KINDS = ("ungrounded", "assistant_only", "question", "request", "hypothetical", "joke", "other_person",
                 "quoted", "prompt", "echo")


class FactRefused(FactDecision, tag="FactRefused", kw_only=True, frozen=True):
    """The junk guard refused a candidate fact: the turn does not ground it as something the user
    said of themselves (``refusal``, one of ``REFUSAL_KINDS``; ``reason`` says why). Recorded so
    that what was not kept, and why, is part of the user's history; nothing is believed."""

    SCHEMA_VERSION: ClassVar[int] = 1

    text: str
    category: str
    attribute: str
    value: str
    refusal: str
    evidence: str | None = None  # the words of the turn the extractor said it rests on

    def __post_init__(self) -> None:
        if self.refusal not in REFUSAL_KINDS:
            raise InvalidEvent(f"refusal must be one of {REFUSAL_KINDS}", "$.refusal")


class FactArchived(FactDecision, tag="FactArchived", kw_only=True, frozen=True):
    """A decay sweep archived ``target``: still believed, but weak (old, not said again, not
    used), so it leaves the hot index and the read path until the user mentions it again
    (``FactRestored``) or a caller asks for archived memories."""

    SCHEMA_VERSION: ClassVar[int] = 1

    target: uuid.UUID
    sweep_id: uuid.UUID
    strength: float


class FactRestored(FactDecision, tag="FactRestored", kw_only=True, frozen=True):
    """The user said an archived fact (``target``) again: it is current again, observed once more."""

    SCHEMA_VERSION: ClassVar[int] = 1

    target: uuid.UUID


class EpisodesSwept(Decision, tag="EpisodesSwept", kw_only=True, frozen=True):
    """A decay sweep (``sweep_id``, as of ``swept_at``) moved the user's episodes ``cooled`` (old,
    not used since) out of the hot vector index into the cold one, which a read searches only when
    the hot one comes back short, and ``warmed`` (used since they cooled) back. Episodes are never
    archived: they stay whole, in history, in keyword search and in every listing."""

    SCHEMA_VERSION: ClassVar[int] = 1

    sweep_id: uuid.UUID
    swept_at: datetime
    cooled: Annotated[list[uuid.UUID], msgspec.Meta(max_length=1000)] = []
    warmed: Annotated[list[uuid.UUID], msgspec.Meta(max_length=1000)] = []


class ReflectionRecorded(_FactBody, tag="ReflectionRecorded", kw_only=True, frozen=True):
    """A reflection (Tier 3): one sentence a model drew from several of the user's memories —
    facts (``sources``) and turns (``turns``), two or more all told — believed while they are: it
    ends when a source fact does (superseded, or forgotten with it) and is forgotten with a
    source turn. Category and attribute are ``reflection``; ``extractor`` names the model,
    ``prompt_version`` the prompt, ``sweep_id`` the sweep that asked."""

    SCHEMA_VERSION: ClassVar[int] = 1

    sources: Annotated[list[uuid.UUID], msgspec.Meta(max_length=32)]
    sweep_id: uuid.UUID
    prompt_version: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    # Reflections still believed drawn from some of the same memories, before more joined them:
    # they end with this one (superseded by it).
    replaces: Annotated[list[uuid.UUID], msgspec.Meta(max_length=32)] = []
    # The user's turns (event ids) it was drawn from besides its facts: forgotten with any of them.
    turns: Annotated[list[uuid.UUID], msgspec.Meta(max_length=32)] = []

    def __post_init__(self) -> None:
        super().__post_init__()
        _two_sources(self)


class GraphDecision(Decision, kw_only=True, frozen=True):
    """Common fields of graph decisions: which extractor decided, and why."""

    extractor: str
    reason: str


class EntityCreated(GraphDecision, tag="EntityCreated", kw_only=True, frozen=True):
    """A new entity in the user's graph. The user themself is one entity (``is_user``)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    entity_id: uuid.UUID
    name: str
    is_user: bool = False


class AliasAdded(GraphDecision, tag="AliasAdded", kw_only=True, frozen=True):
    """Another name the entity goes by (matched case-insensitively, like its name)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    entity_id: uuid.UUID
    alias: str


class EdgeOpened(GraphDecision, tag="EdgeOpened", kw_only=True, frozen=True):
    """A relationship became true at ``valid_from`` (world time); believed from ``recorded_at``.

    ``relation`` is canonical (see the relation vocabulary). The target is an entity or, for
    literal values, ``target_value``. ``fact_sentence`` is the deterministic sentence embedded
    for retrieval ("Maria works at Acme Corp")."""

    SCHEMA_VERSION: ClassVar[int] = 1

    edge_id: uuid.UUID
    source_entity_id: uuid.UUID
    relation: str
    target_entity_id: uuid.UUID | None = None
    target_value: str | None = None
    multi_valued: bool
    valid_from: datetime
    fact_sentence: str
    confidence: float
    explicit: bool
    embedding: bytes
    embedding_model: str

    def __post_init__(self) -> None:
        _check_embedding(self)


class EdgeClosed(GraphDecision, tag="EdgeClosed", kw_only=True, frozen=True):
    """``edge_id`` stopped being true at ``valid_to`` (world time); recorded at ``recorded_at``.
    Contradictions never delete: they close the old edge and open a new one."""

    SCHEMA_VERSION: ClassVar[int] = 1

    edge_id: uuid.UUID
    valid_to: datetime


class MemoryForgotten(Decision, tag="MemoryForgotten", kw_only=True, frozen=True):
    """What formation made of a forget request (``FactForgotten``, ``EpisodeForgotten``,
    ``EdgeForgotten``, ``UserForgotten``), for every projection to apply its part: ``kind`` is
    ``fact``, ``episode``, ``edge`` or ``user``; ``target`` the fact id, the turn's event id, the
    edge id, or None for the user. ``actor`` and ``reason`` are the request's. ``keep_derived``
    (kind episode, when a forgotten fact takes the turns it was read from): the turn's other
    facts and edges stay, with a note, instead of going with it when it is their only source."""

    SCHEMA_VERSION: ClassVar[int] = 1

    kind: Literal["fact", "episode", "edge", "user"]
    target: uuid.UUID | None = None
    actor: Actor
    reason: Reason = ""
    keep_derived: bool = False
    generation: Annotated[int, msgspec.Meta(ge=0)] | None = None  # the user's data key it ends (kind user)


class NothingDecided(Decision, tag="NothingDecided", kw_only=True, frozen=True):
    """Formation decided nothing for the events of ``source``'s partition up to and including
    ``source`` since the last turn it formed there: commands (the projections apply them from
    the events topic) or records it dead-lettered. Written after them, as a turn's
    ``EpisodeRecorded`` is written after its other decisions, so every projection of the
    decisions topic knows how far along the events topic it has applied what formation made.
    ``user_id`` and ``source_event_id`` are that last event's, or, for a record that could not
    be decoded, its key and an id derived from its position."""

    SCHEMA_VERSION: ClassVar[int] = 1


EVENT_TYPES: tuple[type[Event], ...] = (TurnRecorded, ReminderScheduled, ReminderResolved, PersonIdentitySet,
                                         ExpertIdentityUpserted, ExpertIdentityDeleted, FactCorrected, FactForgotten,
                                         EpisodeForgotten, EdgeForgotten, UserForgotten, MemoriesUsed, DecaySwept,
                                         ReflectRequested)
# Commands the commands projection applies straight from the events topic.
COMMAND_TYPES = (ReminderScheduled, ReminderResolved, PersonIdentitySet, ExpertIdentityUpserted, ExpertIdentityDeleted,
                 UserForgotten, MemoriesUsed)
# Requests about a user's memory that formation turns into decisions, in order with their turns.
CONTROL_TYPES = (FactCorrected, FactForgotten, EpisodeForgotten, EdgeForgotten, UserForgotten, DecaySwept,
                 ReflectRequested)
HOST_WIDE_TYPES = (ExpertIdentityUpserted, ExpertIdentityDeleted)
DECISION_TYPES: tuple[type[Decision], ...] = (EpisodeRecorded, FactAdded, FactUpdated, FactDeleted,
                                               FactReinforced, FactChangeDeferred, FactRefused, FactArchived,
                                               FactRestored, ReflectionRecorded, EpisodesSwept, EntityCreated, AliasAdded,
                                               EdgeOpened, EdgeClosed, MemoryForgotten, NothingDecided)
AnyEvent = TurnRecorded
