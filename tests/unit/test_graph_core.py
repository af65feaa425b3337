"""The graph's pure core and edge decisions: supersession across phrasings, multi-valued
relations, negation, sequential intervals, and the user as one entity."""
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from memstream.llm.relations import RelationCandidate
from memstream.schemas.vocabulary import canonical, fact_sentence
from memstream.projections.graph.core import EdgeRow, EntityRow, MissingGraphTarget, apply
from memstream.schemas import EdgeClosed, EdgeOpened, EntityCreated, LogPosition, TurnRecorded
from memstream.streams.worker.formation.graph import EdgeDecider, GraphContext, GraphView, user_entity_id

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def turn_at(days):
    return TurnRecorded.new(user_id="u", conversation_id="c", user_message="x", assistant_message="y",
                            occurred_at=T0 + timedelta(days=days))


def decide(view, days, *cands):
    t = turn_at(days)
    ctx = GraphContext(turn=t, extractor="x", common=dict(source_event_id=t.event_id, source=LogPosition("e", 0, days),
                                                           recorded_at=t.occurred_at, user_id="u"))
    d = EdgeDecider(ctx, view)
    for c in cands:
        d.add(c)
    return d.finish({s: b"\0" * 1536 for s in d.sentences()}, "m")


def rel(relation, target, source="I", **kw):
    return RelationCandidate(source, relation, target, True, kw.pop("confidence", 0.9), kw.pop("explicit", True), **kw)


def current(view, user="u"):
    return sorted((r.relation, r.target_entity_id and view.rows[user, r.target_entity_id].name, r.valid_from.date().isoformat())
                  for r in view.of(user).values() if isinstance(r, EdgeRow) and r.current)


def test_synonymous_phrasings_map_to_one_canonical_relation():
    assert {canonical(r) for r in ("managed_by", "has_manager", "Reports To", "boss")} == {"managed_by"}
    assert {canonical(r) for r in ("works_at", "employed_by", "works-for")} == {"works_at"}
    assert canonical("plays_chess_with") == "plays_chess_with"
    assert fact_sentence("Maria", "works_at", "Acme Corp") == "Maria works at Acme Corp"


def test_a_new_target_closes_the_current_single_valued_edge_and_opens_the_next():
    view = GraphView(None)
    decide(view, 0, rel("works_at", "Acme"))
    out = decide(view, 30, rel("employed_by", "Globex"))
    assert [type(d) for d in out] == [EntityCreated, EdgeClosed, EdgeOpened]
    assert current(view) == [("works_at", "Globex", "2026-01-31")]
    closed = [r for r in view.rows.values() if isinstance(r, EdgeRow) and not r.current]
    assert [(view.rows["u", c.target_entity_id].name, c.valid_to) for c in closed] == [("Acme", T0 + timedelta(days=30))]


def test_the_same_edge_said_again_changes_nothing_and_the_user_is_one_entity():
    view = GraphView(None)
    decide(view, 0, rel("managed_by", "David"))
    assert decide(view, 1, rel("has_manager", "david")) == []
    users = [r for r in view.rows.values() if isinstance(r, EntityRow) and r.is_user]
    assert [u.entity_id for u in users] == [user_entity_id("u")]


def test_multi_valued_relations_keep_concurrent_edges():
    view = GraphView(None)
    decide(view, 0, rel("has_child", "Lily"), rel("friend_of", "Ana"))
    decide(view, 1, rel("has_daughter", "Mia"), rel("friend_of", "Bo"))
    assert [c[:2] for c in current(view)] == [("friend_of", "Ana"), ("friend_of", "Bo"), ("has_child", "Lily"), ("has_child", "Mia")]


def test_a_negation_closes_only_its_edge():
    view = GraphView(None)
    decide(view, 0, rel("works_at", "Initech"), rel("lives_in", "Oslo"))
    out = decide(view, 5, rel("works_at", "Initech", negated=True))
    assert [type(d) for d in out] == [EdgeClosed]
    assert [c[0] for c in current(view)] == ["lives_in"]


def test_a_backdated_edge_begins_when_it_was_said_to_and_ends_the_edges_it_overlaps_there():
    view = GraphView(None)
    decide(view, 0, rel("works_at", "Acme"))
    decide(view, 10, rel("works_at", "Globex"))
    out = decide(view, 20, rel("works_at", "Hooli", valid_at=T0 + timedelta(days=2)))  # "I joined Hooli on Jan 3"
    assert [type(d) for d in out] == [EntityCreated, EdgeClosed, EdgeOpened]  # the log says only what was said
    edges = {view.rows["u", r.target_entity_id].name: (r.valid_from, r.valid_to)
             for r in view.rows.values() if isinstance(r, EdgeRow)}
    day = lambda n: T0 + timedelta(days=n)
    # The latest word on a time holds: Acme ends where Hooli begins, Globex at its own start.
    assert edges == {"Acme": (day(0), day(2)), "Globex": (day(10), day(10)), "Hooli": (day(2), None)}


def test_an_edge_opened_ends_only_the_earlier_edges_of_its_own_single_valued_source_and_relation():
    def edge(relation, days_from, days_to, multi=False, user="u", source=None):
        return EdgeRow(uuid.uuid4(), user, source or user_entity_id(user), relation, None, relation, multi,
                       T0 + timedelta(days=days_from), T0 + timedelta(days=days_to), T0, T0, "s", 0.9, True,
                       uuid.uuid4(), "x", "r", "r", b"", "m")
    kept = [edge("works_at", 0, 10, user="v"), edge("lives_in", 0, 10), edge("friend_of", 0, 10, multi=True),
            edge("works_at", 0, 2), edge("works_at", 0, 10, source=uuid.uuid4())]
    ended = edge("works_at", 4, 10)
    state = {(r.user_id, r.edge_id): r for r in [*kept, ended]}
    state["u", user_entity_id("u")] = EntityRow(user_entity_id("u"), "u", "user", (), True, T0, uuid.uuid4())
    opened = EdgeOpened(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), source=LogPosition("d", 0, 1), recorded_at=T0 + timedelta(days=20),
                        user_id="u", reason="r", edge_id=uuid.uuid4(), source_entity_id=user_entity_id("u"),
                        relation="works_at", target_entity_id=None, target_value="Hooli", multi_valued=False,
                        valid_from=T0 + timedelta(days=2), fact_sentence="s", confidence=0.9, explicit=True,
                        extractor="x", embedding=b"", embedding_model="m")
    rows = apply(state, opened)
    assert [(r.edge_id, r.valid_from, r.valid_to) for r in rows[:-1]] == [(ended.edge_id, ended.valid_from, ended.valid_from)]
    assert rows[-1].edge_id == opened.edge_id and rows[-1].valid_from == opened.valid_from
    assert apply({**state, **{(r.user_id, r.edge_id): r for r in rows}}, opened) == []  # a redelivery changes nothing


def test_inferred_low_confidence_candidates_do_not_commit():
    view = GraphView(None)
    assert decide(view, 0, rel("works_at", "Acme", explicit=False, confidence=0.5)) == []


def test_the_users_name_becomes_an_alias_and_sentences_say_the_user_whatever_their_name():
    view = GraphView(None)
    decide(view, 0, rel("is_named", "Maria"))
    out = decide(view, 1, rel("works_at", "Acme"))
    decide(view, 2, rel("is_named", "Mia"))  # a name changes; a sentence would keep the old one for good
    assert [d.fact_sentence for d in out if isinstance(d, EdgeOpened)] == ["The user works at Acme"]
    assert view.entity_named("u", "Maria") == view.entity_named("u", "Mia") == view.rows["u", user_entity_id("u")]


def test_closing_an_unknown_edge_is_refused():
    t = turn_at(0)
    with pytest.raises(MissingGraphTarget):
        apply({}, EdgeClosed(decision_id=uuid.uuid4(), source_event_id=t.event_id, source=LogPosition("e", 0, 0),
                             recorded_at=T0, user_id="u", extractor="x", reason="r", edge_id=uuid.uuid4(), valid_to=T0))


@pytest.mark.parametrize("sentence, triple", [
    ("I live in Lisbon and work as a data engineer at Acme Corp.", ("I", "works_at", "Acme Corp")),
    ("I report to Priya now.", ("I", "reports_to", "Priya")),
    ("Jonas is my manager.", ("I", "has_manager", "Jonas")),
    ("My brother Tom works for Hooli.", ("Tom", "works_at", "Hooli")),
    ("Hey, I'm Dana.", ("I", "is_named", "Dana")),
])
def test_offline_relations_read_triples_from_plain_sentences(sentence, triple):
    from memstream.llm.offline_relations import extract_relations

    t = TurnRecorded.new(user_id="u", conversation_id="c", user_message=sentence, assistant_message="ok", occurred_at=T0)
    assert triple in {(c.source, c.relation, c.target) for c in extract_relations(t)}


def test_a_negated_name_adds_no_alias_to_the_user():
    view = GraphView(None)
    assert decide(view, 0, rel("is_named", "Maria", negated=True)) == []


def test_an_old_logs_close_dated_before_the_edge_began_ends_it_at_its_start():
    view = GraphView(None)
    (opened,) = [d for d in decide(view, 10, rel("lives_in", "Porto")) if isinstance(d, EdgeOpened)]
    t = turn_at(11)
    (edge,) = apply(view.rows, EdgeClosed(decision_id=uuid.uuid4(), source_event_id=t.event_id,
                                          source=LogPosition("e", 0, 11), recorded_at=t.occurred_at, user_id="u",
                                          extractor="x", reason="moved last week", edge_id=opened.edge_id,
                                          valid_to=T0 + timedelta(days=3)))
    assert edge.valid_to == edge.valid_from == opened.valid_from


def test_a_views_growth_counts_what_was_decided_into_it_not_what_it_read():
    import asyncio

    said = GraphView(None)
    decide(said, 0, rel("works_at", "Acme"), rel("lives_in", "Porto"))
    stored = list(said.rows.values())

    async def load(user):
        return stored

    view = GraphView(load)
    asyncio.run(view.ensure_user("u"))
    assert view.grown == 0 and len(view.rows) == len(stored)
    decide(view, 1, rel("likes", "jazz"))  # a new entity and its edge
    fork = view.fork()
    assert view.grown == fork.grown >= 2


def test_a_fork_and_its_view_each_keep_what_is_decided_into_them_and_each_user_reads_only_their_own():
    view = GraphView(None)
    decide(view, 0, rel("works_at", "Acme"))
    t = TurnRecorded.new(user_id="v", conversation_id="c", user_message="x", assistant_message="y", occurred_at=T0)
    other = EdgeDecider(GraphContext(turn=t, extractor="x", common=dict(
        source_event_id=t.event_id, source=LogPosition("e", 0, 99), recorded_at=T0, user_id="v")), view)
    other.add(rel("works_at", "Acme"))
    other.finish({s: b"\0" * 1536 for s in other.sentences()}, "m")
    fork = view.fork()
    decide(fork, 5, rel("works_at", "Globex"))
    decide(view, 6, rel("lives_in", "Oslo"))
    assert current(fork) == [("works_at", "Globex", "2026-01-06")]
    assert current(view) == [("lives_in", "Oslo", "2026-01-07"), ("works_at", "Acme", "2026-01-01")]
    assert current(view, "v") == current(fork, "v") == [("works_at", "Acme", "2026-01-01")]
    assert {r.user_id for r in view.of("v").values()} == {"v"} and view.entity_named("v", "Acme").user_id == "v"
    assert view.entity_named("u", "Acme").user_id == "u" and view.entity_named("v", "Globex") is None
