"""A turn with several candidate facts decides each as if the ones before it were already held:
one resolution call for the candidates no earlier one bears on, one by one for the others
(in memory: the offline clients, ``MemoryView``, no stack)."""
import asyncio
import hashlib
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from memstream.llm.offline import OfflineResolver
from memstream.llm.offline_relations import OfflineTurnExtractor
from memstream.schemas import TurnRecorded
from memstream.streams.worker.formation.pipeline import Formation
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.views import MemoryView
from memstream.streams.log.records import Record


class Scattered:
    """Every text its own direction (no two facts near in meaning): the slot rules decide alone."""

    model_id, dim = "scattered", 384

    def embed(self, texts):
        out = []
        for t in texts:
            v = np.frombuffer(hashlib.sha256(t.encode()).digest() * 12, dtype=np.uint8)[:384].astype(np.float32) - 127.5
            out.append(v / np.linalg.norm(v))
        return np.stack(out)


class Counting(OfflineResolver):
    def __init__(self):
        self.calls = 0

    async def resolve(self, candidate, neighbours):
        self.calls += 1
        return await super().resolve(candidate, neighbours)

    async def resolve_all(self, asked):
        self.calls += 1
        return await super().resolve_all(asked)


def formed(messages: list[str]) -> tuple[dict[str, str], int]:
    """Each message a turn of one user, in order: the status of every fact text, and resolver calls."""
    resolver = Counting()
    f = Formation(producer=None, decisions_topic="d", embedder=Scattered(), extractor=None, resolver=resolver,
                  dead_letters=None, pool=None, barrier=None, turn_extractor=OfflineTurnExtractor())
    view, graph = MemoryView("scattered"), GraphView(None)
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)

    async def run():
        for i, said in enumerate(messages):
            t = TurnRecorded.new(user_id="u", conversation_id="c", user_message=said, assistant_message="Ok.",
                                 occurred_at=at + timedelta(days=i))
            await f.decide([(Record("e", 0, i, b"u", b"", (), 1_700_000_000_000 + i), t)], view=view, graph=graph)

    asyncio.run(run())
    return {r.text: r.status for r in view.rows.values()}, resolver.calls


@pytest.mark.parametrize("messages, expected", [
    (["I live in Rome.", "I moved to Berlin. I no longer live in Rome."],
     {"Lives in Rome": "superseded", "Lives in Berlin": "current"}),
    (["I live in Paris. I moved to Berlin."], {"Lives in Paris": "superseded", "Lives in Berlin": "current"}),
    (["I work at Acme.", "I joined Globex. I work at Acme."], {"Works at Globex": "superseded"}),
    (["I work at Acme. I quit Acme."], {"Works at Acme": "deleted"}),
    (["I live in Rome.", "I no longer live in Rome. I live in Milan."],
     {"Lives in Rome": "deleted", "Lives in Milan": "current"}),
    (["I like jazz.", "Forget that I like jazz. I love jazz."], {"Likes jazz": "current"}),
])
def test_each_candidate_of_a_turn_sees_the_decisions_of_the_ones_before_it(messages, expected):
    statuses, _ = formed(messages)
    assert {t: statuses.get(t) for t in expected} == expected, statuses
    assert sum(1 for t, s in statuses.items() if s == "current" and t.startswith("Lives in")) <= 1


def test_independent_candidates_share_one_resolution_call():
    _, calls = formed(["I live in Rome and I work at Acme.", "I moved to Oslo and I work at Globex."])
    assert calls == 1  # the second turn's two candidates, other slots, other neighbours: one call


def test_a_turn_decides_no_more_candidates_than_forgetting_it_can_name():
    from memstream.projections.facts.core import MAX_CANDIDATES, turn_decisions

    f = Formation(producer=None, decisions_topic="d", embedder=Scattered(), extractor=None, resolver=OfflineResolver(),
                  dead_letters=None, pool=None, barrier=None, turn_extractor=OfflineTurnExtractor())
    said = " ".join(f"I like topic{i}." for i in range(MAX_CANDIDATES + 6))
    t = TurnRecorded.new(user_id="u", conversation_id="c", user_message=said, assistant_message="Ok.",
                         occurred_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    made = asyncio.run(f.decide([(Record("e", 0, 0, b"u", b"", (), 1_700_000_000_000), t)], MemoryView("scattered"),
                                GraphView(None)))
    facts = [d for _, d in made if type(d).__name__ == "FactAdded"]
    assert len(facts) == MAX_CANDIDATES and {d.fact_id for d in facts} == set(turn_decisions(t.event_id))


def test_a_fact_said_again_is_known_without_asking_the_resolver():
    statuses, calls = formed(["I live in Rome.", "As I said, I live in Rome.", "Yes, I live in Rome and I like jazz."])
    assert statuses == {"Lives in Rome": "current", "Likes jazz": "current"} and calls == 0
