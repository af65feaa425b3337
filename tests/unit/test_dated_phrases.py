"""Dated phrases: each date dates only the fact it is said of, and a version never ends before
it began, whatever the order in which the user dates things."""
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings, strategies as st

from memstream.llm.offline import extract_facts
from memstream.llm.offline_relations import extract_relations
from tests.unit.pipeline import Memory, turn

SEPT_3 = datetime(2026, 9, 3, 10, tzinfo=timezone.utc)

# Every past phrase the offline extractor dates (``_when`` with past=True).
PAST = ["last week", "last month", "last year", "yesterday", "two days ago", "3 weeks ago", "a couple of weeks ago",
        "a month ago", "on October 12th", "on May 3rd", "in March", "since March"]
LEADING = [p for p in PAST if not p.startswith(("in ", "since "))]  # those that read well before a comma
PLACES = ["Porto", "Lisbon", "Berlin", "Oslo"]
EMPLOYERS = ["Initech", "Globex", "Hooli", "Acme"]


def _said(draw, verb, value):
    phrase = draw(st.sampled_from(PAST))
    if phrase in LEADING and draw(st.booleans()):
        return f"{phrase[0].upper()}{phrase[1:]}, I {verb} {value}."
    return f"I {verb} {value} {phrase}."


@st.composite
def histories(draw):
    """(attribute, relation, [(message, at)]): an old value, then a dated change, then maybe its end."""
    attribute = draw(st.sampled_from(["home", "employer"]))
    old, new = draw(st.permutations(PLACES if attribute == "home" else EMPLOYERS))[:2]
    t1 = draw(st.datetimes(datetime(2025, 1, 1), datetime(2027, 12, 31), timezones=st.just(timezone.utc)))
    t2 = t1 + draw(st.timedeltas(timedelta(0), timedelta(days=90)))
    t3 = t2 + draw(st.timedeltas(timedelta(0), timedelta(days=90)))
    if attribute == "home":
        first = draw(st.sampled_from([f"I live in {old}.", _said(draw, "moved to", old)]))
        change = _said(draw, "moved to", new)
        end = draw(st.sampled_from([None, f"I no longer live in {new}.", f"Please forget that I live in {new}."]))
    else:
        first = draw(st.sampled_from([f"I work at {old}.", _said(draw, "joined", old)]))
        change = _said(draw, "joined", new)
        end = draw(st.sampled_from([None, f"I left {new}.", f"Forget that I work at {new}, please."]))
    said = [(first, t1), (change, t2)] + ([(end, t3)] if end else [])
    return attribute, "lives_in" if attribute == "home" else "works_at", said


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_dated_change_never_ends_a_version_before_it_began(history):
    attribute, relation, said = history
    memory = Memory()
    for message, at in said:
        memory.say(message, at)
    t2 = said[1][1]

    versions = memory.versions(attribute)
    assert [v.version for v in versions] == [1, 2], [(v.value, v.status) for v in versions]
    old, new = versions
    assert all(v.valid_to is None or v.valid_to >= v.valid_from for v in versions)
    assert old.status == "superseded" and old.valid_to == max(new.valid_from, old.valid_from)
    assert new.valid_from <= t2  # dated by its own past phrase, not by something else's date
    assert new.status == ("deleted" if len(said) == 3 else "current")

    edges = memory.edges(relation)
    assert len(edges) == 2
    # The first one said is the one the change closed (both may be said at one time).
    before, after = sorted(edges, key=lambda e: "changed to" not in (e.close_reason or ""))
    assert all(e.valid_to is None or e.valid_to >= e.valid_from for e in edges)
    assert before.valid_to == max(after.valid_from, before.valid_from)  # as the fact's versions: no overlap, no gap
    assert after.valid_from <= t2
    assert (after.valid_to is not None) == (len(said) == 3)


def facts(message, at=SEPT_3):
    return {c.attribute: c for c in extract_facts(turn(message, at))}


def relations(message, at=SEPT_3):
    return {(c.relation, c.target): c for c in extract_relations(turn(message, at))}


def test_a_birthday_dates_the_birthday_fact_and_not_the_child_relationship():
    message = "My daughter Lily turns 7 on October 12th and she loves dinosaurs."
    assert facts(message)["birthday"].valid_at == datetime(2026, 10, 12, tzinfo=timezone.utc)
    assert facts(message)["daughter"].valid_at is None
    assert relations(message)[("has_child", "Lily")].valid_at is None
    memory = Memory()
    memory.say(message, SEPT_3)
    assert [e.valid_from for e in memory.edges("has_child")] == [SEPT_3]  # Lily exists from when she was mentioned


def test_a_birthday_later_in_the_sentence_does_not_date_a_move():
    message = "I moved to Lisbon, and my daughter Lily turns 7 on October 12th."
    assert facts(message)["home"].valid_at is None
    assert relations(message)[("lives_in", "Lisbon")].valid_at is None
    assert relations(message)[("has_child", "Lily")].valid_at is None


def test_a_move_last_week_dates_the_new_home_on_either_side_of_the_phrase():
    for message in ("I moved to Lisbon last week.", "Last week, I moved to Lisbon.",
                    "My son Leo turns 4 on May 3rd. I moved to Lisbon last week."):
        assert facts(message)["home"].valid_at == SEPT_3 - timedelta(days=7), message
        assert relations(message)[("lives_in", "Lisbon")].valid_at == SEPT_3 - timedelta(days=7), message


def test_a_phrase_n_units_ago_dates_the_fact_and_stays_out_of_its_value():
    home = facts("I moved to Lisbon two days ago.")["home"]
    assert (home.value, home.valid_at) == ("Lisbon", SEPT_3 - timedelta(days=2))
    job = relations("I joined Globex 3 weeks ago.")[("works_at", "Globex")]
    assert job.valid_at == SEPT_3 - timedelta(days=21)


def test_a_past_move_in_a_named_month_is_the_last_such_month_not_the_next():
    # Said in September: "on October 12th" of a move already made is last October.
    assert facts("I moved to Lisbon on October 12th.")["home"].valid_at == datetime(2025, 10, 12, tzinfo=timezone.utc)
    assert relations("I moved to Lisbon on October 12th.")[("lives_in", "Lisbon")].valid_at.year == 2025


def test_a_trip_is_dated_by_its_own_clause_not_by_a_birthday_in_the_same_sentence():
    found = facts("We're flying to Rome, and my son Leo turns 4 on May 3rd.")
    assert found["trip"].valid_at is None and found["birthday"].valid_at.month == 5
    found = facts("Next month we're flying to Rome, and my son Leo turns 4 on May 3rd.")
    assert found["trip"].valid_at == SEPT_3 + timedelta(days=30)


def test_leaving_a_job_last_week_ends_it_last_week():
    memory = Memory()
    memory.say("I work at Initech.", SEPT_3 - timedelta(days=60))
    memory.say("I left Initech last week.", SEPT_3)
    (job,) = memory.versions("employer")
    assert job.status == "deleted" and job.valid_to == SEPT_3 - timedelta(days=7)
    (edge,) = memory.edges("works_at")
    assert edge.valid_to == SEPT_3 - timedelta(days=7)
