"""Facts and the graph never disagree (``projections.agreement``), as a property of formation's
pure cores: random sequences of turns, corrections and forgets, formed as a reform forms them (every
fact and edge in memory, the offline rules, no stack). The integration suite runs the same
property on the real stack (tests/integration/test_one_truth.py)."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstream.llm.offline import OfflineResolver
from memstream.llm.offline_relations import OfflineTurnExtractor
from memstream.projections.agreement import disagreements
from memstream.projections.graph.core import EdgeRow
from memstream.schemas import EdgeForgotten, EpisodeForgotten, FactCorrected, FactForgotten, TurnRecorded
from memstream.schemas.events import new_event_id
from memstream.streams.worker.formation.pipeline import Formation
from memstream.streams.worker.formation.graph import GraphView, user_entity_id
from memstream.streams.worker.formation.views import MemoryView
from memstream.streams.log.records import Record

from .test_turn_resolution import Scattered

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
PLACES = ["Porto", "Lisbon", "Braga", "Zürich", "São Paulo"]
EMPLOYERS = ["Acme", "Initech", "Globex"]
NAMES = ["Ana", "Tom", "Zoë", "Rex", "Luna"]
# What people say of the slots the graph states, in several phrasings (and dated), and their ends.
SAID = ["I live in {p}.", "I moved to {p}.", "I moved to {p} last month.", "I'm based in {p}.", "My home is in {p}.",
        "I no longer live in {p}.", "I work at {e}.", "I joined {e} last week.", "I left {e}.",
        "I no longer work at {e}.", "My sister {n} is visiting.", "My dog {n} is sick.", "My dog {n} died.",
        "My friend {n} called.", "My wife {n} is great.", "I'm from {p}."]

# One step: a turn (statement, value), a correction (which current fact, new value), a forget of
# a fact (which, keeping its turns or not), a forget of an edge (which).
STEP = st.one_of(
    st.tuples(st.just("turn"), st.integers(0, len(SAID) - 1), st.integers(0, 4)),
    st.tuples(st.just("correct"), st.integers(0, 50), st.integers(0, 4)),
    st.tuples(st.just("forget_fact"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("forget_edge"), st.integers(0, 50), st.just(0)),
    st.tuples(st.just("forget_turn"), st.integers(0, 50), st.just(0)))


def run(steps) -> tuple[MemoryView, GraphView]:
    f = Formation(producer=None, decisions_topic="d", embedder=Scattered(), extractor=None, resolver=OfflineResolver(),
                  dead_letters=None, pool=None, barrier=None, turn_extractor=OfflineTurnExtractor())
    view, graph = MemoryView("scattered"), GraphView(None)
    said = []

    async def go():
        for i, (kind, a, b) in enumerate(steps):
            at = AT + timedelta(days=i)
            current = sorted((r for r in view.rows.values() if r.current), key=lambda r: (r.recorded_at, r.fact_id))
            edges = sorted((e for e in graph.rows.values() if isinstance(e, EdgeRow) and e.current),
                           key=lambda e: (e.recorded_at, e.edge_id))
            common = dict(event_id=new_event_id(), user_id="u", occurred_at=at, actor="user")
            if kind == "turn":
                text = SAID[a].format(p=PLACES[b], e=EMPLOYERS[b % len(EMPLOYERS)], n=NAMES[b])
                event = TurnRecorded.new(user_id="u", conversation_id="c", user_message=text, assistant_message="Ok.",
                                         occurred_at=at)
                said.append(event.event_id)
            elif kind == "correct" and current:
                fact = current[a % len(current)]
                event = FactCorrected(**common, fact_id=fact.fact_id, value=(PLACES + NAMES)[b])
            elif kind == "forget_fact" and current:
                fact = current[a % len(current)]
                event = FactForgotten(**common, fact_id=fact.fact_id, attribute=fact.attribute, value=fact.value,
                                      keep_episodes=b)
            elif kind == "forget_edge" and edges:
                event = EdgeForgotten(**common, edge_id=edges[a % len(edges)].edge_id)
            elif kind == "forget_turn" and said:
                event = EpisodeForgotten(**common, turn_event_id=said[a % len(said)])
            else:
                continue
            record = Record("e", 0, i, b"u", b"", (), int(at.timestamp() * 1000) + 3_600_000)
            await f.decide([(record, event)], view=view, graph=graph, letters=[])

    asyncio.run(go())
    return view, graph


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, min_size=1, max_size=24))
def test_facts_and_edges_agree_at_every_time_after_any_turns_corrections_and_forgets(steps):
    view, graph = run(steps)
    assert disagreements("u", view.rows.values(), graph.rows.values(), user_entity_id("u")) == []


def test_a_correction_and_a_forget_reach_the_graph():
    view, graph = run([("turn", 0, 0), ("turn", 6, 0), ("correct", 0, 2), ("forget_fact", 0, False)])
    edges = {(e.relation, graph.rows["u", e.target_entity_id].name, e.current, e.forgotten)
             for e in graph.rows.values() if isinstance(e, EdgeRow)}
    assert ("lives_in", "Braga", True, False) in edges and ("lives_in", "Porto", False, False) in edges
    assert ("works_at", "Acme", False, True) in edges
    assert disagreements("u", view.rows.values(), graph.rows.values(), user_entity_id("u")) == []
