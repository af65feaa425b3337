"""The user's edges follow their facts: one truth held two ways.

A relation of the graph may state a fact slot of the user (``relation_of``: home is ``lives_in``,
a sister ``has_sibling``, a pet ``has_pet``). For each such relation of a slot the user's facts
have ever filled, after every turn and every control request formation decides, the user's
current edges of that relation are exactly the values of their current facts of that slot (one,
the newest, for a single-valued relation), opened from when the fact holds and closed when it
ended; an edge stating a forgotten fact's value is forgotten with it. Facts lead: they pass the
resolver and the safety gate, and a correction or a forget names a fact. The relation extractor's
edges for such a slot stand when the facts agree, are closed when they do not, and are opened
when it missed them ("I'm based in Lisbon"). The graph's other relations (a third person's, the
user's manager) are the relation extractor's alone.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterable

from memstream.llm.relations import USER, RelationCandidate
from memstream.projections.facts.core import FactRow
from memstream.projections.graph.core import EdgeRow, EntityRow
from memstream.schemas import (Decision, EdgeClosed, EdgeOpened, FactAdded, FactDeleted, FactUpdated,
                               MemoryForgotten)
from memstream.schemas.vocabulary import MULTI_VALUED, attributes_of, relation_of
from memstream.streams.worker.formation.graph import EdgeDecider, GraphView, user_entity_id
from memstream.streams.worker.formation.views import FactView


_NEVER = datetime.max.replace(tzinfo=timezone.utc)


def touched(decisions: Iterable[Decision], facts: FactView, graph: GraphView, user_id: str) -> set[str]:
    """The relations of slots these decisions changed: a fact of the slot, or the user's edge."""
    user, out = user_entity_id(user_id), set()
    for d in decisions:
        attribute = None
        if isinstance(d, (FactAdded, FactUpdated)):
            attribute = d.attribute
        elif isinstance(d, FactDeleted) or (isinstance(d, MemoryForgotten) and d.kind == "fact"):
            row = facts.rows.get((d.user_id, d.target))
            attribute = row.attribute if row is not None else None
        elif isinstance(d, EdgeOpened) and d.source_entity_id == user and attributes_of(d.relation):
            out.add(d.relation)
        elif isinstance(d, EdgeClosed):
            edge = graph.rows.get((d.user_id, d.edge_id))
            if isinstance(edge, EdgeRow) and edge.source_entity_id == user and attributes_of(edge.relation):
                out.add(edge.relation)
        if attribute is not None and (relation := relation_of(attribute)) is not None:
            out.add(relation)
    return out


async def follow(decider: EdgeDecider, facts: FactView, relations: Iterable[str], *,
                 forgot: tuple[str, str, Iterable[str]] | None = None) -> None:
    """Decide, on ``decider``, what makes the user's edges of ``relations`` say what their facts
    say; ``forgot``: (actor, reason, values) of a request that forgot facts of these values,
    whose edges are forgotten with them."""
    user_id = decider.ctx.turn.user_id
    user = user_entity_id(user_id)
    for relation in sorted(relations):
        rows = await facts.slot(user_id, attributes_of(relation))
        if not rows:
            continue  # no fact ever filled it: the relation extractor's alone
        await decider.view.ensure_user(user_id)
        # Archived facts are believed still (decay takes them off the read path, not out of the
        # world): their edges stay, and a new value of a multi-valued slot closes none of them.
        current = sorted((r for r in rows if r.status in ("current", "archived")),
                         key=lambda r: (r.valid_from, r.recorded_at, r.fact_id))
        if relation not in MULTI_VALUED:  # one value at a time: the newest word
            current = current[-1:]
        held: dict[str, FactRow] = {}  # value -> the version holding it from the earliest
        for r in current:
            held.setdefault(r.value.casefold(), r)
        forgotten = {v.casefold() for v in (forgot[2] if forgot else ())}
        kept = [r for r in rows if r.status != "forgotten"]
        edges = decider.view.edges(user_id, user, relation)
        for e in sorted(edges, key=lambda e: (e.valid_from, e.edge_id)):
            names = target_names(decider.view, e)
            if e.forgotten:
                continue
            # An edge of a forgotten value goes, unless a version still held says it while the
            # edge was believed (an older version of another lineage, believed then).
            if names & forgotten and not any(r.value.casefold() in names and overlap(r, e) for r in kept):
                decider.forget(e, *forgot[:2])
            elif names & held.keys():
                continue
            elif e.current:
                decider.close(e, _ended(rows, names) or e.valid_from, "the facts no longer say so")
        for value, row in held.items():
            stating = [e for e in decider.view.edges(user_id, user, relation)
                       if e.current and value in target_names(decider.view, e)]
            if any(e.valid_from == row.valid_from for e in stating):
                continue
            for e in stating:  # held from another time than the facts say: ended, and opened anew
                end = min(_ended(rows, target_names(decider.view, e)) or e.valid_from, row.valid_from)
                decider.close(e, end, "the facts say it holds from another time")
            decider.add(RelationCandidate(source=USER, relation=relation, target=row.value, target_is_entity=True,
                                          confidence=1.0, explicit=True, valid_at=row.valid_from))


def overlap(fact: FactRow, edge: EdgeRow) -> bool:
    """Whether the fact version and the edge were believed at some common recorded time."""
    return (fact.recorded_at < (edge.closed_at or _NEVER)) and (edge.recorded_at < (fact.superseded_at or _NEVER))


def target_names(graph: GraphView, edge: EdgeRow) -> set[str]:
    """Every name of the edge's target, casefolded (its value, for a value target)."""
    if edge.target_entity_id is None:
        return {(edge.target_value or "").casefold()}
    target = graph.rows.get((edge.user_id, edge.target_entity_id))
    return target.names() if isinstance(target, EntityRow) else set()


def _ended(rows: list[FactRow], names: set[str]):
    """When the newest ended fact of one of these values stopped holding."""
    ended = [r for r in rows if not r.current and r.valid_to is not None and r.value.casefold() in names]
    return max(ended, key=lambda r: (r.superseded_at or r.recorded_at, r.fact_id)).valid_to if ended else None
