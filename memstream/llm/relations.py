"""Relation extraction for the graph: the candidate and the client protocol. The vocabulary that
makes phrasings of one relationship the same relation is ``schemas.vocabulary``'s."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Sequence

from memstream.schemas import TurnRecorded

USER = "I"  # how an extractor names the user as a source or target

@dataclass(frozen=True)
class RelationCandidate:
    source: str  # "I" for the user
    relation: str
    target: str
    target_is_entity: bool
    confidence: float
    explicit: bool
    valid_at: datetime | None = None
    negated: bool = False  # "I left Acme": the edge stops being true


class RelationExtractionClient(Protocol):
    model_id: str

    async def extract(self, turn: TurnRecorded) -> Sequence[RelationCandidate]:
        """``(source, relation, target)`` candidates stated or implied in ``turn``."""
        ...
