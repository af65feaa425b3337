"""Facts and the graph are one truth: the invariant, as a pure check over one user's rows.

For every relation of the graph that states a fact slot of the user (``relation_of``: ``home``
is ``lives_in``, ``sister`` is ``has_sibling``), whenever the user's facts have ever filled that
slot: at every valid time and every recorded time, the values of the user's fact versions that
held then as believed then are exactly the targets of the user's edges of that relation that
held then as believed then (by name or alias, case aside). A forgotten fact or edge holds at no
time; a moment at which one was believed is erased history, and is not compared (a forget can
end a version of a statement another version still makes, over a span no single edge can be cut
to: there, one representation may still hold the statement's surviving twin). The read path answers ``as_of`` with the same two predicates (``visible_fact``,
``visible_edge``), so a context as of any moment says one thing in its facts and its edges.

Formation keeps it (``streams.worker.formation.slot_edges``); the unit and integration suites check
it over random sequences of turns, corrections and forgets (``disagreements``).
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Iterable

from memstream.projections.facts.core import FactRow
from memstream.projections.graph.core import EdgeRow, EntityRow, Row
from memstream.schemas.vocabulary import relation_of


def visible_fact(f: FactRow, valid: datetime, recorded: datetime, forgotten: bool = False) -> bool:
    """``facts.query``'s as-of predicate (``forgotten``: as if the fact were not forgotten)."""
    return ((forgotten or f.status != "forgotten") and f.recorded_at <= recorded and f.valid_from <= valid
            and (f.valid_to is None or (f.superseded_at is not None and f.superseded_at > recorded)
                 or f.valid_to > valid))


def visible_edge(e: EdgeRow, valid: datetime, recorded: datetime, forgotten: bool = False) -> bool:
    """``graph.query``'s as-of predicate (``forgotten``: as if the edge were not forgotten)."""
    return ((forgotten or not e.forgotten) and e.recorded_at <= recorded and e.valid_from <= valid
            and (e.valid_to is None or (e.closed_at is not None and e.closed_at > recorded) or e.valid_to > valid))


def disagreements(user_id: str, facts: Iterable[FactRow], graph: Iterable[Row], user_entity) -> list[str]:
    """Where the user's facts and edges disagree, at any valid and recorded time either changed
    at (and just before each): empty when they are one truth."""
    facts = [f for f in facts if f.user_id == user_id and relation_of(f.attribute)]
    rows = [r for r in graph if r.user_id == user_id]
    entities = {r.entity_id: r for r in rows if isinstance(r, EntityRow)}
    relations = {relation_of(f.attribute) for f in facts}
    edges = [e for e in rows if isinstance(e, EdgeRow) and e.source_entity_id == user_entity and e.relation in relations]
    times = sorted({t for f in facts for t in (f.valid_from, f.valid_to, f.recorded_at, f.superseded_at) if t}
                   | {t for e in edges for t in (e.valid_from, e.valid_to, e.recorded_at, e.closed_at) if t})
    probes = times + [t - timedelta(microseconds=1) for t in times]
    out = []
    for relation in sorted(relations):
        for valid in probes:
            for recorded in times:
                if any(f.status == "forgotten" and relation_of(f.attribute) == relation
                       and visible_fact(f, valid, recorded, forgotten=True) for f in facts) or any(
                        e.forgotten and e.relation == relation and visible_edge(e, valid, recorded, forgotten=True)
                        for e in edges):
                    continue  # erased history
                said = sorted(f.value.casefold() for f in facts
                              if relation_of(f.attribute) == relation and visible_fact(f, valid, recorded))
                held = [e for e in edges if e.relation == relation and visible_edge(e, valid, recorded)]
                named = [_names(e, entities) for e in held]
                unmatched_facts = [v for v in said if not any(v in n for n in named)]
                unmatched_edges = [sorted(n) for n in named if not any(v in n for v in said)]
                if unmatched_facts or unmatched_edges:
                    out.append(f"{relation} valid {valid:%Y-%m-%d %H:%M:%S.%f} recorded {recorded:%H:%M:%S.%f}: "
                               f"facts {said} vs edges {sorted(sorted(n) for n in named)}")
    return out


def _names(edge: EdgeRow, entities: dict) -> set[str]:
    if edge.target_entity_id is None:
        return {(edge.target_value or "").casefold()}
    target = entities.get(edge.target_entity_id)
    return target.names() if target is not None else set()
