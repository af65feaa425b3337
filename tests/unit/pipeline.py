"""Offline formation as pure steps, for unit tests: the offline extractors, the slot resolver,
``decide`` and the edge decider, folded with the projections' own pure cores (no Kafka, no
Postgres, no embedder: one fixed vector, and neighbours with similarity 0 so nothing merges)."""
from __future__ import annotations

from datetime import datetime

import numpy as np

from memstream.llm.offline import extract_facts, resolve_fact
from memstream.llm.offline_relations import extract_relations
from memstream.llm.protocols import ExistingFact
from memstream.projections.facts.core import FactRow, fold
from memstream.projections.graph.core import EdgeRow
from memstream.schemas import Decision, LogPosition, TurnRecorded
from memstream.streams.worker.formation.decide import Context, decide
from memstream.streams.worker.formation.graph import EdgeDecider, GraphContext, GraphView

VEC = np.ones(384, dtype=np.float32) / np.sqrt(384)


def turn(message: str, at: datetime) -> TurnRecorded:
    return TurnRecorded.new(user_id="u", conversation_id="c", user_message=message, assistant_message="Okay.",
                            occurred_at=at)


class Memory:
    """One user's facts and graph, as the projections would hold them after each turn."""

    def __init__(self):
        self.facts: dict = {}
        self.graph = GraphView(None)
        self.decisions: list[Decision] = []
        self._offset = 0

    def say(self, message: str, at: datetime) -> list[Decision]:
        t = turn(message, at)
        self._offset += 1
        source = LogPosition("e", 0, self._offset)
        ctx = Context(turn=t, source=source, recorded_at=at, extractor="offline", resolver="offline",
                      embedding_model="m")
        out: list[Decision] = []
        for n, cand in enumerate(extract_facts(t)):
            near = [ExistingFact(r.fact_id, r.text, r.category, r.attribute, r.value, 0.0)
                    for r in self.facts.values() if r.current]
            d = decide(ctx, n, cand, VEC, resolve_fact(cand, near), near, self.facts)
            if d is not None:
                fold(self.facts, [d])
                out.append(d)
        edges = EdgeDecider(GraphContext(turn=t, extractor="offline", common=dict(
            source_event_id=t.event_id, source=source, recorded_at=at, user_id="u")), self.graph)
        for c in extract_relations(t):
            edges.add(c)
        out += edges.finish({s: b"\0" * 1536 for s in edges.sentences()}, "m")
        self.decisions += out
        return out

    def versions(self, attribute: str) -> list[FactRow]:
        return sorted((r for r in self.facts.values() if r.attribute == attribute),
                      key=lambda r: (r.lineage_id, r.version))

    def edges(self, relation: str) -> list[EdgeRow]:
        return sorted((r for r in self.graph.rows.values() if isinstance(r, EdgeRow) and r.relation == relation),
                      key=lambda e: (e.valid_from, e.recorded_at))
