"""The graph, the pure core: entity and edge decisions folded into rows.

``apply(state, decision)`` returns the rows a decision creates or changes; ``state`` must hold
the rows it targets (``targets``), keyed by ``key`` — ``(user_id, id)``: a decision looks up
rows under its own user only, so it can never change, or link to, another user's graph, even
when a host gave two users' turns one event id (and so the same entity and edge ids). Idempotent: an existing entity, alias or edge is not created
twice, and closing a closed edge changes nothing. System time is the decision's
``recorded_at``; a close never ends an edge before it began (``valid_to >= valid_from``). A
single-valued edge opened dated before an earlier edge of its (source, relation) ended ends that
one where it begins (``spans``: the store loads them): the latest word on a time holds, and the
intervals never overlap, as the database's exclusion constraint requires.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Iterable, Union

from memstream.schemas import AliasAdded, Decision, EdgeClosed, EdgeOpened, EntityCreated, MemoryForgotten
from memstream.schemas.errors import Refused


class MissingGraphTarget(Refused, LookupError):
    """A decision names an entity or edge its user does not hold (another user's is not theirs)."""


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
    forgotten: bool = False  # forgotten edges are closed and shown by no query, now or as of any date

    @property
    def current(self) -> bool:
        return self.valid_to is None


ENTITY_COLUMNS = tuple(EntityRow.__dataclass_fields__)
EDGE_COLUMNS = tuple(EdgeRow.__dataclass_fields__)
Row = Union[EntityRow, EdgeRow]
Key = tuple[str, uuid.UUID]


def key(row: Row) -> Key:
    return row.user_id, row.entity_id if isinstance(row, EntityRow) else row.edge_id


def targets(d: Decision) -> list[uuid.UUID]:
    """Ids of the rows ``apply`` needs in ``state`` for this decision (an edge's entities too)."""
    if isinstance(d, (EntityCreated, AliasAdded)):
        return [d.entity_id]
    if isinstance(d, EdgeOpened):
        return [d.edge_id, d.source_entity_id] + ([d.target_entity_id] if d.target_entity_id else [])
    if isinstance(d, EdgeClosed) or (isinstance(d, MemoryForgotten) and d.kind == "edge"):
        return [d.edge_id if isinstance(d, EdgeClosed) else d.target]
    return []


def spans(d: Decision) -> list[tuple[str, uuid.UUID, str, datetime]]:
    """``(user_id, source entity, relation, from)``: the closed edges of that single-valued
    (source, relation) ending after ``from`` are the ones ``apply`` needs in ``state`` as well."""
    if isinstance(d, EdgeOpened) and not d.multi_valued:
        return [(d.user_id, d.source_entity_id, d.relation, d.valid_from)]
    return []


def sources(d: Decision) -> list[tuple[str, uuid.UUID]]:
    """``(user_id, turn event id)`` whose edges ``apply`` needs in ``state`` as well."""
    if isinstance(d, MemoryForgotten) and d.kind == "episode":
        return [(d.user_id, d.target)]
    return []


def _forget(edge: EdgeRow, d: MemoryForgotten, why: str) -> EdgeRow:
    return replace(edge, valid_to=edge.valid_to or max(d.recorded_at, edge.valid_from),
                   closed_at=edge.closed_at or d.recorded_at, forgotten=True,
                   close_reason=f"{why} by {d.actor}" + (f": {d.reason}" if d.reason else ""))


def _own(state: dict[Key, Row], id_: uuid.UUID, kind: type, d: Decision) -> Row:
    row = state.get((d.user_id, id_))
    if not isinstance(row, kind):
        raise MissingGraphTarget(f"{type(d).__name__} {d.decision_id} targets {kind.__name__[:-3].lower()} {id_}, "
                                 "unknown to its user")
    return row


def apply(state: dict[Key, Row], d: Decision) -> list[Row]:
    """The rows ``d`` creates or changes, touching or linking to its own user's rows only
    (``MissingGraphTarget`` for a row its user lacks)."""
    if isinstance(d, EntityCreated):
        if (d.user_id, d.entity_id) in state:
            _own(state, d.entity_id, EntityRow, d)  # a redelivery changes nothing
            return []
        return [EntityRow(d.entity_id, d.user_id, d.name, (), d.is_user, d.recorded_at, d.source_event_id)]
    if isinstance(d, AliasAdded):
        ent = _own(state, d.entity_id, EntityRow, d)
        if d.alias.casefold() in ent.names():
            return []
        return [replace(ent, aliases=ent.aliases + (d.alias,))]
    if isinstance(d, EdgeOpened):
        for entity in (d.source_entity_id, d.target_entity_id):
            if entity is not None:
                _own(state, entity, EntityRow, d)
        if (d.user_id, d.edge_id) in state:
            _own(state, d.edge_id, EdgeRow, d)
            return []
        # "I have lived in Madrid since March", after Porto until June and then Lisbon: formation
        # closed Lisbon at its own start; Porto ends in March. (A current edge is formation's to close.)
        overlapped = [] if d.multi_valued else [
            replace(r, valid_to=max(d.valid_from, r.valid_from)) for r in state.values()
            if isinstance(r, EdgeRow) and r.user_id == d.user_id and r.source_entity_id == d.source_entity_id
            and r.relation == d.relation and not r.multi_valued and r.valid_to is not None
            and r.valid_to > max(d.valid_from, r.valid_from)]
        return [*overlapped, EdgeRow(
            edge_id=d.edge_id, user_id=d.user_id, source_entity_id=d.source_entity_id, relation=d.relation,
            target_entity_id=d.target_entity_id, target_value=d.target_value, multi_valued=d.multi_valued,
            valid_from=d.valid_from, valid_to=None, recorded_at=d.recorded_at, closed_at=None,
            fact_sentence=d.fact_sentence, confidence=d.confidence, explicit=d.explicit,
            source_event_id=d.source_event_id, extractor=d.extractor, reason=d.reason, close_reason=None,
            embedding=d.embedding, embedding_model=d.embedding_model)]
    if isinstance(d, MemoryForgotten):
        if d.kind == "edge":
            edge = _own(state, d.target, EdgeRow, d)
            return [] if edge.forgotten else [_forget(edge, d, "forgotten")]
        if d.kind == "episode" and not d.keep_derived:
            return [_forget(r, d, "forgotten with its source turn") for r in state.values()
                    if isinstance(r, EdgeRow) and r.user_id == d.user_id and r.source_event_id == d.target
                    and not r.forgotten]
        return []  # a whole user: the store deletes their rows
    if isinstance(d, EdgeClosed):
        edge = _own(state, d.edge_id, EdgeRow, d)
        if edge.valid_to is not None:
            return []
        return [replace(edge, valid_to=max(d.valid_to, edge.valid_from), closed_at=d.recorded_at,
                        close_reason=d.reason)]
    return []


def fold(state: dict[Key, Row], decisions: Iterable[Decision]) -> dict[Key, Row]:
    changed: dict[Key, Row] = {}
    for d in decisions:
        for row in apply(state, d):
            state[key(row)] = changed[key(row)] = row
    return changed
