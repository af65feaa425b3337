"""A turn formed again (a crash before formation saved its position, a host's retry) decides
nothing its facts' rows or edges already hold: before, the facts view folded its old update as
new (the next update left two current facts for one single-valued slot), and the graph closed
the current edge and opened the old one again."""
import asyncio
import contextlib
import hashlib
from datetime import datetime, timedelta, timezone

import numpy as np

import memstream.projections.facts.query as facts_query
import memstream.projections.facts.store as facts_store
from memstream.llm.offline import OfflineExtractor, OfflineResolver
from memstream.llm.offline_relations import OfflineRelationExtractor
from memstream.projections.facts.core import fold
from memstream.projections.graph import core as graph_core
from memstream.schemas import TurnRecorded
from memstream.streams.worker.formation.pipeline import Formation
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.views import PostgresView
from memstream.streams.log.records import Record

AT = datetime(2026, 3, 1, tzinfo=timezone.utc)


def _vector(text: str) -> np.ndarray:
    v = np.frombuffer(hashlib.sha512(text.encode()).digest() * 24, dtype=np.uint8)[:384].astype(np.float32) - 127
    return v / np.linalg.norm(v)


class _Embedder:
    model_id = "m"

    def embed(self, texts):
        return [_vector(t) for t in texts]


class _Pool:
    @contextlib.asynccontextmanager
    async def acquire(self):
        yield None


def test_a_turn_formed_again_after_later_turns_leaves_one_current_fact(monkeypatch):
    store = {}  # the facts projection's rows: its core folds every decision formation makes

    def row(r, **more):
        return dict(fact_id=r.fact_id, text=r.text, category=r.category, attribute=r.attribute, value=r.value, **more)

    async def nearest(conn, user, vector, k, model):
        now = [r for r in store.values() if r.user_id == user and r.current]
        return sorted((row(r, distance=1 - float(np.frombuffer(r.embedding, "<f4") @ vector)) for r in now),
                      key=lambda x: x["distance"])[:k]

    async def current_by_attribute(conn, user, attributes, model):
        class Vec:
            def __init__(self, v):
                self.to_numpy = lambda: v

        return [row(r, embedding=Vec(np.frombuffer(r.embedding, "<f4"))) for r in store.values()
                if r.user_id == user and r.current and r.attribute in attributes]

    async def load(conn, keys):
        return {k: store[k] for k in keys if k in store}

    async def load_drawn_from(conn, user, ids, turns=()):
        return {k: r for k, r in store.items() if r.user_id == user
                and (set(r.derived_from) & set(ids) or set(r.derived_from_turns) & set(turns))
                and r.status != "forgotten"}

    monkeypatch.setattr(facts_store, "load_drawn_from", load_drawn_from)
    monkeypatch.setattr(facts_query, "nearest", nearest)
    monkeypatch.setattr(facts_query, "current_by_attribute", current_by_attribute)
    monkeypatch.setattr(facts_store, "load", load)
    formation = Formation(producer=None, decisions_topic="d", embedder=_Embedder(), extractor=OfflineExtractor(),
                          resolver=OfflineResolver(), dead_letters=None, pool=_Pool(), barrier=None)
    acme, beta, gamma = (TurnRecorded.new(user_id="u", conversation_id="c", user_message=f"I work at {name}.",
                                          assistant_message="ok", occurred_at=AT + timedelta(days=i))
                         for i, name in enumerate(("Acme", "Beta", "Gamma")))

    async def form(turn, view, offset):
        record = Record("events", 0, offset, b"u", b"", (), int((AT + timedelta(days=offset)).timestamp() * 1000))
        decisions = await formation.turns.facts(record, turn, view)
        fold(store, decisions)
        return decisions

    async def run():
        await form(acme, PostgresView(_Pool(), "m"), 1)
        await form(beta, PostgresView(_Pool(), "m"), 2)
        view = PostgresView(_Pool(), "m")  # the batch [Acme, Beta] delivered again, on a fresh view
        assert await form(acme, view, 1) == [] and await form(beta, view, 2) == []
        await form(gamma, view, 3)

    asyncio.run(run())
    assert [r.value for r in store.values() if r.current] == ["Gamma"]


def test_a_turn_formed_again_after_later_turns_reopens_no_edge():
    graph = {}  # the graph projection's rows

    async def load(user_id):
        return [r for r in graph.values() if r.user_id == user_id]

    formation = Formation(producer=None, decisions_topic="d", embedder=_Embedder(), extractor=OfflineExtractor(),
                          resolver=OfflineResolver(), dead_letters=None, pool=_Pool(), barrier=None,
                          relations=OfflineRelationExtractor())
    acme, beta = (TurnRecorded.new(user_id="u", conversation_id="c", user_message=f"I work at {name}.",
                                   assistant_message="ok", occurred_at=AT + timedelta(days=i))
                  for i, name in enumerate(("Acme", "Beta")))

    async def form(turn, offset):
        record = Record("events", 0, offset, b"u", b"", (), int((AT + timedelta(days=offset)).timestamp() * 1000))
        decisions = await formation.turns.edges(record, turn, GraphView(load))  # a fresh view: the projection's rows
        graph_core.fold(graph, decisions)
        return decisions

    async def run():
        assert await form(acme, 1) and await form(beta, 2)
        assert await form(acme, 1) == []

    asyncio.run(run())
    assert [e.fact_sentence for e in graph.values() if isinstance(e, graph_core.EdgeRow) and e.current] == [
        "The user works at Beta"]
