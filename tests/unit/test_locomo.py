"""LoCoMo harness: parsing of the file format and the retrieval metrics, without the stack."""
from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memstream.bench.locomo import (
    load_locomo,
    parse_locomo,
    parse_locomo_datetime,
    question_metrics,
    sample_turns,
    score,
    select_samples,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "locomo" / "small.json"


def tiny() -> list[dict]:
    return [{
        "sample_id": "s1",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bo",
            "session_2_date_time": "10:04 am on 19 June, 2023",
            "session_2": [{"speaker": "Bo", "dia_id": "D2:1", "text": "I adopted a cat."}],
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I moved to Oslo."},
                          {"speaker": "Bo", "dia_id": "D1:2", "text": "Nice!"}],
        },
        "qa": [
            {"question": "Where did Ann move?", "answer": "Oslo", "evidence": ["D1:1"], "category": 4},
            {"question": "How many cats?", "answer": 1, "evidence": ["D2:1"], "category": "1"},
            {"question": "Where did Bo move?", "adversarial_answer": "Oslo", "evidence": [], "category": 5},
        ],
    }]


# ---------------------------------------------------------------- dates


@pytest.mark.parametrize("text, expected", [
    ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)),
    ("10:04 am on 19 June, 2023", datetime(2023, 6, 19, 10, 4, tzinfo=timezone.utc)),
    ("12:00 am on 1 January, 2024", datetime(2024, 1, 1, 0, 0, tzinfo=timezone.utc)),
    ("12:30 pm on 31 Dec, 2022", datetime(2022, 12, 31, 12, 30, tzinfo=timezone.utc)),
    ("  7:05 P.M. on 3 sept 2023 ", datetime(2023, 9, 3, 19, 5, tzinfo=timezone.utc)),
])
def test_locomo_date_times_parse_to_utc(text, expected):
    got = parse_locomo_datetime(text)
    assert got == expected and got.utcoffset() == timedelta(0)


@pytest.mark.parametrize("text", ["", "13:56 pm on 8 May, 2023", "1:56 pm on 8 Maytember, 2023",
                                  "1:56 pm on 31 February, 2023", "8 May 2023", None])
def test_bad_date_times_are_refused(text):
    with pytest.raises(ValueError):
        parse_locomo_datetime(text)


# ---------------------------------------------------------------- parsing


def test_sessions_come_back_in_number_order_with_their_times_and_utterances():
    [s] = parse_locomo(tiny())
    assert (s.sample_id, s.speaker_a, s.speaker_b) == ("s1", "Ann", "Bo")
    assert [x.index for x in s.sessions] == [1, 2]
    assert s.sessions[0].occurred_at == datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    assert [(u.dia_id, u.speaker, u.text) for u in s.sessions[0].utterances] == [
        ("D1:1", "Ann", "I moved to Oslo."), ("D1:2", "Bo", "Nice!")]


def test_questions_tolerate_int_answers_string_categories_and_adversarial_items():
    [s] = parse_locomo(tiny())
    assert [(q.answer, q.evidence, q.category) for q in s.questions] == [
        ("Oslo", ["D1:1"], 4), ("1", ["D2:1"], 1), (None, [], 5)]


def test_evidence_entries_holding_several_dia_ids_are_split():
    data = tiny()
    data[0]["qa"][0]["evidence"] = ["D1:1; D2:1", "D1:1"]
    assert parse_locomo(data)[0].questions[0].evidence == ["D1:1", "D2:1"]


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["conversation"].pop("session_1_date_time"), r"sample 's1'.*session_1_date_time"),
    (lambda s: s["conversation"].__setitem__("session_1_date_time", "yesterday"), r"sample 's1'.*session_1_date_time"),
    (lambda s: s["conversation"]["session_1"][1].pop("text"), r"sample 's1'.*session_1\[1\]\.text"),
    (lambda s: s["conversation"].pop("speaker_b"), r"sample 's1'.*speaker_b"),
    (lambda s: s["qa"][0].__setitem__("category", "multi-hop"), r"sample 's1'.*qa\[0\]\.category"),
    (lambda s: s["qa"][1].pop("question"), r"sample 's1'.*qa\[1\]\.question"),
    (lambda s: s.pop("conversation"), r"sample 's1'.*conversation"),
])
def test_a_malformed_sample_is_refused_naming_the_sample_and_the_field(mutate, message):
    data = copy.deepcopy(tiny())
    mutate(data[0])
    with pytest.raises(ValueError, match=message):
        parse_locomo(data)


def test_the_top_level_must_be_a_list_of_samples_with_unique_ids():
    with pytest.raises(ValueError, match="list"):
        parse_locomo({"sample_id": "s1"})
    with pytest.raises(ValueError, match="sample #0"):
        parse_locomo([{"conversation": {}}])
    with pytest.raises(ValueError, match="duplicate"):
        parse_locomo(tiny() + tiny())


def test_the_fixture_parses(tmp_path):
    samples = load_locomo(FIXTURE)
    assert len(samples) == 2
    for s in samples:
        assert len(s.sessions) == 3 and all(6 <= len(x.utterances) <= 10 for x in s.sessions)
        known = {u.dia_id for x in s.sessions for u in x.utterances}
        assert all(d in known for q in s.questions for d in q.evidence)
        assert {q.category for q in s.questions} == {1, 2, 3, 4, 5}
        assert [q.evidence for q in s.questions if q.category == 5] == [[]]
    bad = tmp_path / "bad.json"
    bad.write_text("[{", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_locomo(bad)


def test_turns_keep_dialogue_order_and_name_their_utterance():
    [s] = parse_locomo(tiny())
    turns = sample_turns(s, "abc")
    assert [t.metadata for t in turns] == [{"dia_id": "D1:1"}, {"dia_id": "D1:2"}, {"dia_id": "D2:1"}]
    assert {t.user_id for t in turns} == {"locomo-abc-s1"}
    assert [t.conversation_id for t in turns] == ["session_1", "session_1", "session_2"]
    assert turns[0].user_message == "Ann: I moved to Oslo." and turns[0].assistant_message == ""
    assert turns[1].occurred_at - turns[0].occurred_at == timedelta(seconds=1)
    assert turns == sorted(turns, key=lambda t: t.occurred_at)


def test_selecting_an_unknown_conversation_names_the_known_ones():
    samples = parse_locomo(tiny())
    assert select_samples(samples, None) == samples == select_samples(samples, "s1")
    with pytest.raises(ValueError, match="'s1'"):
        select_samples(samples, "nope")


# ---------------------------------------------------------------- scoring


def test_metrics_of_one_question_by_hand():
    # evidence {a, b}; ranked x, b, y, a: first hit at rank 2, both found within 4, one within 2
    assert question_metrics({"a", "b"}, ["x", "b", "y", "a"]) == (1.0, 1.0, 0.5)
    assert question_metrics({"a", "b"}, ["x", "b", "y", "a"], k=2) == (1.0, 0.5, 0.5)
    assert question_metrics({"a", "b"}, ["x", "y", "a"], k=2) == (0.0, 0.0, 0.0)
    assert question_metrics({"a"}, []) == (0.0, 0.0, 0.0)
    assert question_metrics({"a"}, ["a", "a", "b"]) == (1.0, 1.0, 1.0)
    assert question_metrics({"a", "b"}, ["c", "c", "b"], k=2) == (1.0, 0.5, 0.5)  # duplicates do not take a slot
    with pytest.raises(ValueError):
        question_metrics(set(), ["a"])


def test_score_aggregates_per_category_and_overall_and_skips_empty_evidence():
    results = [
        (1, ["a", "b"], ["x", "b", "y", "a"]),  # hit 1, recall 1,   rr 1/2
        (1, ["c"], ["x", "y", "z"]),             # hit 0, recall 0,   rr 0
        (2, ["d", "e", "f"], ["d", "x"]),        # hit 1, recall 1/3, rr 1
        (5, [], ["a"]),                          # skipped
        (5, set(), []),                          # skipped
    ]
    got = score(results)
    assert got["skipped_no_evidence"] == 2
    assert got["per_category"] == {
        "1": {"questions": 2, "hit_at_k": 0.5, "recall_at_k": 0.5, "mrr": 0.25},
        "2": {"questions": 1, "hit_at_k": 1.0, "recall_at_k": 0.333, "mrr": 1.0},
    }
    assert got["overall"] == {"questions": 3, "hit_at_k": 0.667, "recall_at_k": 0.444, "mrr": 0.5}
    assert json.loads(json.dumps(got)) == got


def test_score_truncates_to_k():
    got = score([(4, ["a"], ["x", "y", "a"])], k=2)
    assert got["overall"] == {"questions": 1, "hit_at_k": 0.0, "recall_at_k": 0.0, "mrr": 0.0}
    assert score([(4, ["a"], ["x", "y", "a"])])["overall"]["mrr"] == 0.333


def test_score_of_nothing_is_zero_not_an_error():
    got = score([(5, [], ["a"])])
    assert got == {"overall": {"questions": 0, "hit_at_k": 0.0, "recall_at_k": 0.0, "mrr": 0.0},
                   "per_category": {}, "skipped_no_evidence": 1}
