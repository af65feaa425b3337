"""Read models returned by the read client (pydantic: validated, documented, JSON-able)."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from memstream.schemas.facts import FactContent


class Turn(BaseModel):
    """One recent turn of the current conversation (Tier 0)."""

    episode_id: uuid.UUID
    occurred_at: datetime
    user_message: str
    assistant_message: str


class Episode(BaseModel):
    """One remembered turn."""

    episode_id: uuid.UUID
    conversation_id: str
    occurred_at: datetime
    user_message: str
    assistant_message: str
    metadata: dict[str, Any] | None = None


class Edge(BaseModel):
    """One relationship edge with both time axes: true from ``valid_from`` to ``valid_to`` (world
    time), believed from ``recorded_at`` until ``closed_at`` recorded its end (system time)."""

    edge_id: uuid.UUID
    relation: str
    source: str
    target: str
    fact_sentence: str
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    closed_at: datetime | None


class RankedEpisode(Episode):
    """A past turn retrieved for the message, with how it scored. In a ``read``'s context a turn
    too long for its share of the episodes budget is an excerpt: ``excerpt`` holds the characters
    of its text (``user_message + "\n" + assistant_message``) kept, and the two messages only
    their parts of them; ``search`` never cuts."""

    score: float
    relevance: float
    recency: float
    channels: list[str] = Field(description="channels that retrieved it: vector, keyword")
    rank: int = Field(0, description="its place in the ranking, 1 the best (a read's section is in time order)")
    excerpt: tuple[int, int] | None = Field(
        None, description="characters [start, end) of the turn's text shown, if only a passage of it is")


class RankedFact(BaseModel, FactContent):
    """A current fact about the user (what it says: ``FactContent``), with how it scored for the
    message; or, when asked for, an archived one (still believed, off the read path by decay)."""

    fact_id: uuid.UUID
    observation_count: int
    valid_from: datetime
    recorded_at: datetime
    score: float
    relevance: float
    recency: float
    importance: float
    type_weight: float
    channels: list[str]
    archived: bool = False  # a decay sweep took it off the read path; read(include_archived=True) asked for it


class RankedEdge(Edge):
    """A relationship edge retrieved for the message; ``hop`` is 0 for a direct match of the
    message, 1 for an edge reached from one by one-hop expansion."""

    hop: int
    score: float
    similarity: float


class Reminder(BaseModel):
    """A pending reminder whose time has come (prospective memory)."""

    reminder_id: uuid.UUID
    text: str
    due_at: datetime


class AsOf(BaseModel):
    """A bi-temporal point: ``valid_time`` — what was true then; ``recorded_time`` — as we
    believed it then. ``recorded_time`` defaults to now (what we know today about the past);
    ``valid_time`` defaults to ``recorded_time``. ``read(as_of=<datetime>)`` sets both: the graph
    exactly as it was at that moment."""

    valid_time: datetime | None = None
    recorded_time: datetime | None = None


class FactVersion(BaseModel, FactContent):
    """One version in a fact's history (what it says: ``FactContent``): what was believed, from
    when, until when and why."""

    fact_id: uuid.UUID
    lineage_id: uuid.UUID
    version: int
    status: str = Field(description="current, superseded, deleted or forgotten")
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    superseded_at: datetime | None
    superseded_by: uuid.UUID | None
    reason: str = Field(description="why this version was recorded")
    end_reason: str | None = Field(description="why it stopped being believed")
    observation_count: int
    decision_id: uuid.UUID | None = Field(None, description="the decision on the log that recorded this version")
    source_event_id: uuid.UUID | None = Field(None, description="the event it was decided from: a turn or a request (a correction)")
    extractor: str | None = Field(None, description="what extracted it from the turn (an LLM, a rule, a person)")
    resolver: str | None = Field(None, description="what decided it against the facts held before")
    source_turn: Episode | None = Field(None, description="the turn it came from, while remembered (fact history only)")
    derived_from: list[uuid.UUID] = Field(default_factory=list,
                                          description="a reflection's source facts (category reflection): it ends "
                                                      "when one of them does")
    derived_from_turns: list[uuid.UUID] = Field(default_factory=list,
                                                description="a reflection's source turns (event ids: the user's "
                                                            "own words): it is forgotten with any of them")


class MemoryContext(BaseModel):
    """Everything memstream knows that is worth putting in front of the model for a message.

    ``degraded`` names channels that failed (their sections are empty, the rest is intact);
    ``caught_up`` is False when ``read(after=...)`` timed out before the projection reached the
    requested log position.
    """

    user_id: str
    conversation_id: str
    message: str
    gated: bool = Field(False, description="the retrieval gate skipped the embedding and Tier 2 channels")
    profile: dict[str, Any] = Field(default_factory=dict, description="Tier 1: always injected")
    person_identity: dict[str, Any] | None = None
    expert_identity: dict[str, Any] | None = None
    due_reminders: list[Reminder] = Field(default_factory=list)
    recent_turns: list[Turn] = Field(default_factory=list)
    facts: list[RankedFact] = Field(default_factory=list)
    edges: list[RankedEdge] = Field(default_factory=list)
    episodes: list[RankedEpisode] = Field(default_factory=list)
    degraded: list[str] = Field(default_factory=list)
    caught_up: bool = True
    as_of: AsOf | None = None
    left_out: list[str] = Field(default_factory=list, description="sections a read as of a past moment leaves "
                                "out: the recent turns (a cache of now)")
    timings_ms: dict[str, float] = Field(default_factory=dict)
    tokens: dict[str, int] = Field(default_factory=dict, description="tokens used per budgeted section")


class RefusedFact(BaseModel):
    """A candidate fact the junk guard did not keep, and why (``FactRefused``): what a turn was read
    to say, the words it was said to rest on, and the kind of refusal (a question, someone else's
    fact, a hypothetical, text put in the turn...)."""

    decision_id: uuid.UUID
    source_event_id: uuid.UUID = Field(description="the turn it was read from")
    recorded_at: datetime
    refusal: str = Field(description="ungrounded, assistant_only, question, request, hypothetical, joke, "
                                     "other_person, quoted, prompt or echo")
    reason: str
    text: str
    category: str
    attribute: str
    value: str
    evidence: str | None = Field(None, description="the words of the turn the extractor said it rests on")
    extractor: str


class MemoryPage(BaseModel):
    """One page of what memstream holds about a user (``MemoryReader.memories``). Pass
    ``next_cursor`` back for the next page; ``None`` means this was the last."""

    kind: str = Field(description="facts, episodes, edges, or refused (candidates the junk guard did not keep)")
    items: list[FactVersion] | list[Episode] | list[Edge] | list[RefusedFact]
    next_cursor: str | None


class KindStats(BaseModel):
    """How many of one kind of memory, by status, and the oldest and newest of them."""

    by_status: dict[str, int]
    oldest: datetime | None
    newest: datetime | None


class MemoryStats(BaseModel):
    """What memstream holds about a user, in numbers (``MemoryReader.stats``)."""

    user_id: str
    facts: KindStats
    episodes: KindStats
    edges: KindStats
    entities: int
    conversations: int
    last_recorded: datetime | None = Field(description="system time of the latest change to this user's memory")


class UserPage(BaseModel):
    """One page of the users a caller may see, in byte order of their ids (``MemoryReader.users``)."""

    users: list[str]
    next_cursor: str | None


class UserOverview(BaseModel):
    """A user at a glance: their Tier 1 profile, identities and memory in numbers."""

    user_id: str
    profile: dict[str, Any] = Field(default_factory=dict)
    person_identity: dict[str, Any] | None = None
    stats: MemoryStats


class GraphNode(BaseModel):
    id: str = Field(description="an entity's id, or 'value:<text>' for a target that is a value")
    name: str
    is_user: bool


class GraphEdge(Edge):
    source_id: str
    target_id: str


class Graph(BaseModel):
    """The user's relationship graph as it was at ``as_of``: ``nodes`` are every end of the user's
    edges ever (so a drawing keeps its places from date to date), ``edges`` those held then."""

    user_id: str
    as_of: AsOf
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    earliest: datetime | None = Field(description="when the first known relationship began or was recorded, whichever came first")
    latest: datetime | None = Field(description="the last opening, closing or recording of a relationship")
    truncated: bool = Field(False, description="more nodes or edges than one response holds: the first ones (nodes by "
                            "name, edges by relation)")


class SearchResult(BaseModel):
    """``MemoryReader.search``: the best memories of each kind asked for a query, ranked as a
    context's are, without the rest of a context."""

    user_id: str
    query: str
    facts: list[RankedFact] = Field(default_factory=list)
    episodes: list[RankedEpisode] = Field(default_factory=list)
    edges: list[RankedEdge] = Field(default_factory=list)
    degraded: list[str] = Field(default_factory=list)
    as_of: AsOf | None = None
    timings_ms: dict[str, float] = Field(default_factory=dict)
