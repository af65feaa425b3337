"""The graph, the pure core: entity and edge decisions folded into rows.

``apply(state, decision)`` returns the rows a decision creates or changes; ``state`` must hold
the rows it targets (``targets``). Idempotent: an existing entity, alias or edge is not created
twice, and closing a closed edge changes nothing. System time is the decision's
``recorded_at``; a close never ends an edge before it began (``valid_to >= valid_from``).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Iterable, Union

from memstream.schemas import AliasAdded, Decision, EdgeClosed, EdgeOpened, EntityCreated
from memstream.schemas.errors import Refused


class MissingGraphTarget(Refused, LookupError):
    """A decision names an entity or edge this projection does not hold."""


@dataclass(frozen=True)
class EntityRow:
    entity_id: uuid.UUID
    user_id: str
    name: str
    aliases: tuple[str, ...]
    is_user: bool
    recorded_at: datetime
    source_event_id: uuid.UUID

    def names(self) -> set[str]:
        return {self.name.casefold(), *(a.casefold() for a in self.aliases)}


@dataclass(frozen=True)
class EdgeRow:
    edge_id: uuid.UUID
    user_id: str
    source_entity_id: uuid.UUID
    relation: str
    target_entity_id: uuid.UUID | None
    target_value: str | None
    multi_valued: bool
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    closed_at: datetime | None
    fact_sentence: str
    confidence: float
    explicit: bool
    source_event_id: uuid.UUID
    extractor: str
    reason: str
    close_reason: str | None
    embedding: bytes
    embedding_model: str

    @property
    def current(self) -> bool:
        return self.valid_to is None


ENTITY_COLUMNS = tuple(EntityRow.__dataclass_fields__)
EDGE_COLUMNS = tuple(EdgeRow.__dataclass_fields__)
Row = Union[EntityRow, EdgeRow]


def targets(d: Decision) -> list[uuid.UUID]:
    if isinstance(d, (EntityCreated, AliasAdded)):
        return [d.entity_id]
    if isinstance(d, (EdgeOpened, EdgeClosed)):
        return [d.edge_id]
    return []


def apply(state: dict[uuid.UUID, Row], d: Decision) -> list[Row]:
    if isinstance(d, EntityCreated):
        if d.entity_id in state:
            return []
        return [EntityRow(d.entity_id, d.user_id, d.name, (), d.is_user, d.recorded_at, d.source_event_id)]
    if isinstance(d, AliasAdded):
        ent = state.get(d.entity_id)
        if not isinstance(ent, EntityRow):
            raise MissingGraphTarget(f"AliasAdded {d.decision_id} targets unknown entity {d.entity_id}")
        if d.alias.casefold() in ent.names():
            return []
        return [replace(ent, aliases=ent.aliases + (d.alias,))]
    if isinstance(d, EdgeOpened):
        if d.edge_id in state:
            return []
        return [EdgeRow(
            edge_id=d.edge_id, user_id=d.user_id, source_entity_id=d.source_entity_id, relation=d.relation,
            target_entity_id=d.target_entity_id, target_value=d.target_value, multi_valued=d.multi_valued,
            valid_from=d.valid_from, valid_to=None, recorded_at=d.recorded_at, closed_at=None,
            fact_sentence=d.fact_sentence, confidence=d.confidence, explicit=d.explicit,
            source_event_id=d.source_event_id, extractor=d.extractor, reason=d.reason, close_reason=None,
            embedding=d.embedding, embedding_model=d.embedding_model)]
    if isinstance(d, EdgeClosed):
        edge = state.get(d.edge_id)
        if not isinstance(edge, EdgeRow):
            raise MissingGraphTarget(f"EdgeClosed {d.decision_id} targets unknown edge {d.edge_id}")
        if edge.valid_to is not None:
            return []
        return [replace(edge, valid_to=max(d.valid_to, edge.valid_from), closed_at=d.recorded_at,
                        close_reason=d.reason)]
    return []


def fold(state: dict[uuid.UUID, Row], decisions: Iterable[Decision]) -> dict[uuid.UUID, Row]:
    changed: dict[uuid.UUID, Row] = {}
    for d in decisions:
        for row in apply(state, d):
            key = row.entity_id if isinstance(row, EntityRow) else row.edge_id
            state[key] = row
            changed[key] = row
    return changed
