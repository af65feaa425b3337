"""Relationships: candidates -> entity and edge decisions (deterministic; no LLM after extraction).

Per candidate: gate (explicit, or confidence >= MIN_COMMIT_CONFIDENCE) -> resolve the source and
target entities by exact, case-insensitive name or alias within the user (the user is one entity,
"I" / "me" / their name) -> canonical relation -> for a single-valued relation, close the current
edge of (source, relation) when its target differs and open the new one; for a multi-valued one,
open unless that exact edge is current; a negated candidate closes its edge.

Intervals of a single-valued (source, relation) never overlap, which the database also enforces
(exclusion constraint): a new edge dated before the current one began closes it at its own start,
and ends the earlier ones it overlaps where it begins (the projection's core does that).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Awaitable, Callable, Mapping

from memstream.llm.relations import USER, RelationCandidate
from memstream.schemas.vocabulary import MULTI_VALUED, canonical, fact_sentence
from memstream.projections.graph.core import EdgeRow, EntityRow, Key, Row, fold, key
from memstream.streams.worker.formation.by_user import ByUser
from memstream.schemas import (AliasAdded, Decision, EdgeClosed, EdgeOpened, EntityCreated, Event,
                               MemoryForgotten)

log = logging.getLogger("memstream.formation")

MIN_COMMIT_CONFIDENCE = 0.7
USER_NAMESPACE = uuid.UUID("6f1c2d0e-0b5e-4a43-9d0c-7b7e2a5f9a11")
_USER_WORDS = {"i", "me", "myself", "user", "the user"}


def user_entity_id(user_id: str) -> uuid.UUID:
    """The user's own entity: one per user, whichever turn first needs it."""
    return uuid.uuid5(USER_NAMESPACE, f"user:{user_id}")


Loader = Callable[[str], Awaitable[list[Row]]]  # user -> entities and edges (current + closed)


class GraphView:
    """Users' entities and edges as the graph projection will hold them after this batch's
    decisions: each user's loaded once (from Postgres, or nothing for an in-memory backfill),
    then folded with the projection's own pure core, kept by user (``ByUser``)."""

    def __init__(self, loader: Loader | None):
        self._loader = loader
        self.rows: ByUser[Key, Row] = ByUser()  # by (user_id, id), as the projection's core keys them
        self._loaded: set[str] = set()
        self._read = 0  # rows read from the store (the rest: what ``apply`` added)

    def of(self, user_id: str) -> Mapping[Key, Row]:
        """One user's rows."""
        return self.rows.of(user_id)

    async def ensure_user(self, user_id: str) -> None:
        if user_id in self._loaded:
            return
        self._loaded.add(user_id)
        if self._loader is not None:
            for row in await self._loader(user_id):
                rows = self.rows.mine(row.user_id)
                self._read += key(row) not in rows
                rows.setdefault(key(row), row)

    @property
    def grown(self) -> int:
        """Rows ``apply`` added since the view was read: what a busy user's view gains between reads."""
        return len(self.rows) - self._read

    def apply(self, decision: Decision) -> None:
        fold(self.rows.mine(decision.user_id), [decision])

    def fork(self) -> "GraphView":
        """A view that answers as this one does now; what is applied to it later stays its own."""
        other = GraphView(self._loader)
        other.rows, other._loaded, other._read = self.rows.fork(), set(self._loaded), self._read
        return other

    def entity_named(self, user_id: str, name: str) -> EntityRow | None:
        folded = name.casefold()
        found = [r for r in self.of(user_id).values() if isinstance(r, EntityRow) and folded in r.names()]
        return min(found, key=lambda r: (r.recorded_at, r.entity_id)) if found else None

    def edges(self, user_id: str, source: uuid.UUID, relation: str) -> list[EdgeRow]:
        return [r for r in self.of(user_id).values() if isinstance(r, EdgeRow)
                and r.source_entity_id == source and r.relation == relation]


@dataclass(frozen=True)
class GraphContext:
    turn: Event  # what is decided on (a turn, a control request): its event id names the decisions
    common: dict  # decision_id-free envelope fields: source_event_id, source, recorded_at, user_id
    extractor: str
    why: str | None = None  # every decision's reason (a control request's), instead of the decider's own


class EdgeDecider:
    """Builds the decisions for one turn's relation candidates; ``embed`` is called once for
    all new fact sentences of the turn (through formation's cached embedder)."""

    def __init__(self, ctx: GraphContext, view: GraphView, prefix: str = ""):
        self.ctx, self.view = ctx, view
        self.decisions: list[Decision] = []
        self._n, self._prefix = 0, prefix  # a second decider for one event names its decisions apart
        self._pending: list[dict] = []  # EdgeOpened fields waiting for their embedding

    def _id(self, kind: str) -> uuid.UUID:
        self._n += 1
        return uuid.uuid5(self.ctx.turn.event_id, f"{self._prefix}{kind}:{self._n}")

    def _emit(self, decision: Decision) -> None:
        self.view.apply(decision)
        self.decisions.append(decision)

    def _base(self, reason: str) -> dict:
        return {**self.ctx.common, "decision_id": self._id("graph"), "extractor": self.ctx.extractor,
                "reason": self.ctx.why or reason}

    def _user(self) -> EntityRow:
        uid = self.ctx.turn.user_id
        eid = user_entity_id(uid)
        if (uid, eid) not in self.view.rows:
            self._emit(EntityCreated(**self._base("the user"), entity_id=eid, name="the user", is_user=True))
        return self.view.rows[uid, eid]  # type: ignore[return-value]

    def _entity(self, name: str) -> EntityRow:
        if name.casefold() in _USER_WORDS:
            return self._user()
        found = self.view.entity_named(self.ctx.turn.user_id, name)
        if found is not None:
            return found
        self._emit(EntityCreated(**self._base(f"first mention of {name!r}"), entity_id=self._id("entity"), name=name))
        return self.view.entity_named(self.ctx.turn.user_id, name)  # type: ignore[return-value]

    def alias(self, name: str) -> None:
        """The user said their name: it becomes an alias of the user entity."""
        user = self._user()
        if name.casefold() not in user.names():
            self._emit(AliasAdded(**self._base("the user gave their name"), entity_id=user.entity_id, alias=name))

    def add(self, c: RelationCandidate) -> None:
        if not (c.explicit or c.confidence >= MIN_COMMIT_CONFIDENCE):
            log.info("GATE REFUSED an edge: inferred with confidence %.2f < %.2f [event %s]",
                     c.confidence, MIN_COMMIT_CONFIDENCE, self.ctx.turn.event_id)
            log.debug("GATE REFUSED edge %s %s %s [event %s]", c.source, c.relation, c.target, self.ctx.turn.event_id)
            return
        relation = canonical(c.relation)
        if relation == "is_named" and c.source == USER:
            return None if c.negated else self.alias(c.target)  # an alias is never taken back
        source = self._entity(c.source)
        target = self._entity(c.target) if c.target_is_entity else None
        target_key = target.entity_id if target else c.target.casefold()
        when = c.valid_at or self.ctx.turn.occurred_at
        edges = self.view.edges(self.ctx.turn.user_id, source.entity_id, relation)
        current = [e for e in edges if e.current]
        same = [e for e in current if (e.target_entity_id or (e.target_value or "").casefold()) == target_key]
        if c.negated:
            for e in same:
                self._emit(EdgeClosed(**self._base(f"user says {e.fact_sentence!r} is no longer true"),
                                      edge_id=e.edge_id, valid_to=max(when, e.valid_from)))
            return
        if same:
            return  # already true: nothing changes in the graph
        multi = relation in MULTI_VALUED
        if not multi:
            for e in current:
                self._emit(EdgeClosed(**self._base(f"{relation} changed to {c.target!r}"), edge_id=e.edge_id,
                                      valid_to=max(when, e.valid_from)))
        # The user is "the user" in every sentence, whatever they are called: a name changes (the
        # profile and the name fact carry it) and a sentence would keep the old one for good.
        source_name = "The user" if source.is_user else source.name
        target_name = ("the user" if target.is_user else target.name) if target else c.target
        fields = dict(
            **self._base(f"{'explicit' if c.explicit else 'inferred'} statement, confidence {c.confidence:.2f}"),
            edge_id=self._id("edge"), source_entity_id=source.entity_id, relation=relation,
            target_entity_id=target.entity_id if target else None, target_value=None if target else c.target,
            multi_valued=multi, valid_from=when, fact_sentence=fact_sentence(source_name, relation, target_name),
            confidence=float(c.confidence), explicit=c.explicit)
        self._pending.append(fields)
        # Opened now (without its vector) so later candidates of this turn see it.
        self._emit(EdgeOpened(**fields, embedding=b"", embedding_model=""))

    def close(self, edge: EdgeRow, valid_to: datetime, reason: str) -> None:
        """End a current edge at ``valid_to`` (never before it began)."""
        self._emit(EdgeClosed(**self._base(reason), edge_id=edge.edge_id, valid_to=max(valid_to, edge.valid_from)))

    def forget(self, edge: EdgeRow, actor: str, reason: str) -> None:
        """Forget an edge: closed, and shown by no query, now or as of any date."""
        self._emit(MemoryForgotten(**self.ctx.common, decision_id=self._id("forgotten"), kind="edge",
                                   target=edge.edge_id, actor=actor, reason=reason))

    def finish(self, vectors: dict[str, bytes], model: str) -> list[Decision]:
        """Fill in the fact-sentence embeddings; returns the turn's decisions in order."""
        done = []
        for d in self.decisions:
            if isinstance(d, EdgeOpened):
                d = EdgeOpened(**{**{f: getattr(d, f) for f in d.__struct_fields__},
                                  "embedding": vectors[d.fact_sentence], "embedding_model": model})
            done.append(d)
        return done

    def sentences(self) -> list[str]:
        return [f["fact_sentence"] for f in self._pending]
