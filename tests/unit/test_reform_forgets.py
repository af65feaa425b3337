"""A forget re-formed by another extractor finds the fact it named by its slot and value: the
fact's id may be another fact's there (ids come from a candidate's place in its turn)."""
import asyncio
from datetime import datetime, timedelta, timezone

from memstream.llm.offline import OfflineResolver
from memstream.llm.offline_relations import OfflineTurnExtractor
from memstream.projections.facts.core import fact_id
from memstream.schemas import FactForgotten, TurnRecorded
from memstream.schemas.events import new_event_id
from memstream.streams.worker.formation.pipeline import Formation
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.views import MemoryView
from memstream.streams.log.records import Record

from .test_turn_resolution import Scattered

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def formation() -> tuple[Formation, MemoryView, GraphView]:
    """Formation as a reform runs it: every fact and edge in memory, no stack."""
    f = Formation(producer=None, decisions_topic="d", embedder=Scattered(), extractor=None, resolver=OfflineResolver(),
                  dead_letters=None, pool=None, barrier=None, turn_extractor=OfflineTurnExtractor())
    return f, MemoryView("scattered"), GraphView(None)


def test_a_forget_whose_id_is_another_facts_in_the_reform_forgets_the_one_it_named():
    f, view, graph = formation()
    said = TurnRecorded.new(user_id="u", conversation_id="c", user_message="I like tea. I live in Rome.",
                            assistant_message="Ok.", occurred_at=AT)
    # The first extractor had "Lives in Rome" first: its fact:0 is this one's "Likes tea".
    forget = FactForgotten(event_id=new_event_id(), user_id="u", occurred_at=AT + timedelta(days=1), actor="user",
                           fact_id=fact_id(said.event_id, 0), attribute="home", value="rome")

    async def run():
        for i, e in enumerate((said, forget)):
            await f.decide([(Record("e", 0, i, b"u", b"", (), 1_700_000_000_000 + i), e)], view=view, graph=graph)

    asyncio.run(run())
    status = {r.text: r.status for r in view.rows.values()}
    assert status == {"Likes tea": "current", "Lives in Rome": "forgotten"}, status


def test_an_edge_forget_whose_id_is_another_edges_in_the_reform_forgets_the_one_it_named():
    from memstream.projections.graph.core import EdgeRow
    from memstream.schemas import EdgeForgotten

    f, view, graph = formation()
    said = TurnRecorded.new(user_id="u", conversation_id="c", user_message="I work at Acme. I live in Rome.",
                            assistant_message="Ok.", occurred_at=AT)

    async def form(i, e):
        await f.decide([(Record("e", 0, i, b"u", b"", (), 1_700_000_000_000 + i), e)], view=view, graph=graph)

    asyncio.run(form(0, said))
    edges = {x.relation: x for x in graph.rows.values() if isinstance(x, EdgeRow)}
    work, home = edges["works_at"], next(x for r, x in edges.items() if r != "works_at")
    place = graph.rows["u", home.target_entity_id].name if home.target_entity_id else home.target_value
    # The first extractor's edge of this id said where the user lives.
    asyncio.run(form(1, EdgeForgotten(event_id=new_event_id(), user_id="u", occurred_at=AT + timedelta(days=1),
                                      actor="user", edge_id=work.edge_id, relation=home.relation,
                                      source="the user", target=place)))
    assert not graph.rows["u", work.edge_id].forgotten and graph.rows["u", home.edge_id].forgotten


def test_a_forgotten_turn_on_the_log_again_is_not_formed_again():
    from memstream.schemas import EpisodeForgotten

    f, view, graph = formation()
    said = TurnRecorded.new(user_id="u", conversation_id="c", user_message="I work at Acme.", assistant_message="Ok.",
                            occurred_at=AT)
    forget = EpisodeForgotten(event_id=new_event_id(), user_id="u", occurred_at=AT + timedelta(days=1), actor="user",
                              turn_event_id=said.event_id)

    async def form(i, e):
        return await f.decide([(Record("e", 0, i, b"u", b"", (), 1_700_000_000_000 + i), e)], view=view, graph=graph)

    made = [asyncio.run(form(i, e)) for i, e in enumerate((said, forget, said))]
    assert made[0] and made[1] and made[2] == []
