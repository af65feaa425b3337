"""The two formation calls as typed async protocols.

Both are called only by formation, never by the read path or by a replay: their output is
recorded as decision events, so it is decided once. Implementations must be safe to call
concurrently and should raise (not return garbage) when the model's output is malformed.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Protocol, Sequence

from memstream.schemas import TurnRecorded
from memstream.schemas.errors import Refused, Retryable
from memstream.schemas.facts import FactContent

# Categories whose facts define who the user is or what must never be violated: changing or
# removing them needs an explicit statement or repeated observation (the safety gate).
GATED_CATEGORIES = frozenset({"identity", "constraint"})
CATEGORIES = ("identity", "location", "work", "preference", "constraint", "relationship", "plan", "other")


@dataclass(frozen=True)
class CandidateFact(FactContent):
    """One fact the extractor read in a turn (what it says: ``FactContent``). ``valid_at`` is
    the world time the fact refers to, when the turn says so."""

    valid_at: datetime | None = None
    negated: bool = False  # "I no longer have a car": the fact stops being true
    # The words of the turn it rests on, as said (the junk guard looks for them in the turn).
    evidence: str | None = None


@dataclass(frozen=True)
class ExistingFact:
    fact_id: uuid.UUID
    text: str
    category: str
    attribute: str
    value: str
    similarity: float


class Operation(str, Enum):
    ADD = "ADD"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    NOOP = "NOOP"


@dataclass(frozen=True)
class Resolution:
    op: Operation
    target: uuid.UUID | None = None
    reason: str = ""


class ExtractionClient(Protocol):
    model_id: str

    async def extract(self, turn: TurnRecorded) -> Sequence[CandidateFact]:
        """Candidate facts about the user stated or implied in ``turn`` (may be empty)."""
        ...


class ResolutionClient(Protocol):
    model_id: str

    async def resolve(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> Resolution:
        """Classify ``candidate`` against the user's nearest current facts. ``target`` names one
        of ``neighbours`` for UPDATE, DELETE and NOOP; None for ADD."""
        ...

    async def resolve_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> list[Resolution]:
        """``resolve`` for each ``(candidate, neighbours)`` of one turn, in one call: one
        resolution per pair, in their order, each as ``resolve`` would answer it alone."""
        ...


@dataclass(frozen=True)
class TurnCandidates:
    facts: Sequence[CandidateFact]
    relations: Sequence  # of memstream.llm.relations.RelationCandidate


class TurnExtractionClient(Protocol):
    """Fact and relation extraction of one turn in one call (one structured answer with both).
    ``model_id`` is recorded on the fact decisions, ``relations_model_id`` on the edge ones."""

    model_id: str
    relations_model_id: str

    async def extract_turn(self, turn: TurnRecorded) -> TurnCandidates:
        """What ``ExtractionClient.extract`` and ``RelationExtractionClient.extract`` would find."""
        ...


class Unanswered(Retryable):
    """The model gave no usable answer to this call: asked again, logged each time, never
    guessed at — at most ``formation_model_attempts`` times for a turn's one extraction call,
    and as often for the rest of the turn (its resolution; without a turn extractor, its
    extractions too); then the turn is given up as ``ModelRefused`` (one user's turn the model
    cannot answer must not hold up the others; a prompt or model that fails every turn passes
    the dead-letter limit and stops the worker)."""


class MalformedOutput(Unanswered, ValueError):
    """The model returned output that does not fit the expected structure."""


class ModelFailed(Unanswered):
    """The model failed on this request (Bedrock's ``ModelErrorException``): often for what the
    turn says, so formation's attempts of the turn count it."""


class Throttled(Retryable):
    """The model refused the call for now (a quota of calls or tokens): retried after a backoff."""


class ModelUnavailable(Retryable):
    """The model's service failed or could not be reached, past the adapter's own retries: the
    turn is retried from its start."""


class ModelRefused(Refused):
    """The model will not read this turn: a content filter or guardrail stopped it, the service
    rejected the request made of it (too long for the model), or its answers never fitted.
    Formation records the turn's episode without facts or relations and dead-letters the turn
    with this reason (``memstream dead-letters retry`` forms it again)."""


class CountsTokens:
    """A model client whose ``tokens`` (input and output so far, cumulative) are those its
    service's answers reported: what the workers' metrics read (``streams.worker.metrics``)."""

    _service: "TokenCounter"

    @property
    def tokens(self) -> tuple[int, int]:
        return self._service.tokens


class TokenCounter(Protocol):
    tokens: tuple[int, int]


@dataclass(frozen=True)
class Reflection:
    """What a reflection model drew from several memories: one sentence about the user
    (``text``) and the memories it rests on (``cited``: indexes into the texts it was shown)."""

    text: str
    cited: tuple[int, ...]


class ReflectionClient(Protocol):
    """Tier 3: one sentence drawn from a cluster of the user's memories, shown as texts: facts
    ("Likes hiking") and the user's own words from turns no fact was read from. Called by
    formation only, its answer recorded (``ReflectionRecorded``) — never by the read path or a
    replay. ``prompt_version`` names the prompt, recorded with each reflection."""

    model_id: str
    prompt_version: str

    async def reflect(self, memories: Sequence[str]) -> Reflection:
        ...
