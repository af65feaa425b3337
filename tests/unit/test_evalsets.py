"""Benchmark loaders (BEAM, LongMemEval, LoCoMo by detection) and the oversized-message cut,
on small synthetic files: no stack, no real data."""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest

from memstream.bench.evalsets import fit_messages, load_set, parse_beam_date, parse_longmemeval_date
from memstream.bench.locomo import Question, Sample, Session, Utterance, score

LOCOMO_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "locomo" / "small.json"


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def msg(mid, role, content, **extra) -> dict:
    return {"role": role, "id": mid, "content": content, **extra}


def beam_chat() -> list[dict]:
    return [
        {"batch_number": 1, "time_anchor": None, "turns": [
            [msg(0, "user", "I set up Express on port 3000.", time_anchor="January-05-2024", index="1,1",
                 question_type="main_question"),
             msg(1, "assistant", "Good start.")],
            [msg(2, "user", "Now I moved it to port 4000."), msg(3, "assistant", "Noted.")],
        ]},
        {"batch_number": 2, "time_anchor": None, "turns": [  # no anchor anywhere: the day after
            [msg(4, "user", "Deadline is March 1."), msg(5, "assistant", "Ok.")],
        ]},
        {"batch_number": 3, "time_anchor": None, "turns": [
            [msg(6, "user", "Back again.", time_anchor="Feb-03-2024"), msg(7, "assistant", "Welcome back.")],
        ]},
    ]


def beam_questions() -> dict:
    return {
        "abstention": [{"question": "What is my dog's name?", "ideal_response": "You never said."}],
        "contradiction_resolution": [{"question": "Which port?", "ideal_answer": "It changed.",
                                      "source_chat_ids": {"first_statement": [0], "second_statement": [2, 0]}}],
        "event_ordering": [{"question": "Order the events.", "answer": "port, deadline",
                            "source_chat_ids": [[0, 2], [4], 2]}],
        "information_extraction": [{"question": "Which port first?", "answer": 3000, "source_chat_ids": [0, 99]}],
        "instruction_following": [{"question": "Use bullets.", "source_chat_ids": [6]}],
    }


def write_beam(root: Path, n: int | str = 1, *, questions: dict | None = None) -> Path:
    chat_dir = root / str(n)
    (chat_dir / "probing_questions").mkdir(parents=True)
    (chat_dir / "chat.json").write_text(json.dumps(beam_chat()), encoding="utf-8")
    (chat_dir / "probing_questions" / "probing_questions.json").write_text(
        json.dumps(beam_questions() if questions is None else questions), encoding="utf-8")
    return chat_dir


def longmemeval() -> list[dict]:
    return [{
        "question_id": "q1", "question_type": "single-session-user", "question": "Where did I move?",
        "answer": "Oslo", "question_date": "2023/06/01 (Thu) 10:00",
        "haystack_session_ids": ["s_a", "answer_s_b"],
        "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 14:05"],
        "haystack_sessions": [
            [{"role": "user", "content": "I like tea."}, {"role": "assistant", "content": "Nice."}],
            [{"role": "user", "content": "I moved to Oslo.", "has_answer": True},
             {"role": "assistant", "content": "Congrats!", "has_answer": False}],
        ],
        "answer_session_ids": ["answer_s_b"],
    }, {
        "question_id": "q2_abs", "question_type": "temporal-reasoning", "question": "When?", "answer": 3,
        "question_date": "2023/06/02 (Fri) 10:00",
        "haystack_session_ids": ["s_c"], "haystack_dates": ["2023/05/22 (Mon) 09:00"],
        "haystack_sessions": [[{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]],
        "answer_session_ids": ["s_c"],
    }]


# ---------------------------------------------------------------- BEAM


def test_beam_chat_dir_in_the_repo_layout_becomes_one_sample_with_a_session_per_batch(tmp_path):
    chat_dir = write_beam(tmp_path / "chats" / "500K")
    [s] = load_set(chat_dir)
    assert (s.sample_id, s.speaker_a, s.speaker_b) == ("beam-500K-1", "user", "assistant")
    assert [x.index for x in s.sessions] == [1, 2, 3]
    assert [(u.dia_id, u.speaker, u.text) for u in s.sessions[0].utterances] == [
        ("0", "user", "I set up Express on port 3000."), ("1", "assistant", "Good start."),
        ("2", "user", "Now I moved it to port 4000."), ("3", "assistant", "Noted.")]
    assert [u.dia_id for x in s.sessions for u in x.utterances] == [str(i) for i in range(8)]


def test_beam_batches_take_their_first_anchor_or_the_day_after_the_previous_one(tmp_path):
    chat = beam_chat()
    chat[0]["turns"][0][0].pop("time_anchor")  # first batch without an anchor: the default first day
    chat_dir = write_beam(tmp_path)
    (chat_dir / "chat.json").write_text(json.dumps(chat), encoding="utf-8")
    [s] = load_set(chat_dir, "beam")
    assert [x.occurred_at for x in s.sessions] == [utc(2024, 1, 1), utc(2024, 1, 2), utc(2024, 2, 3)]
    [s] = load_set(write_beam(tmp_path / "other"))
    assert [x.occurred_at for x in s.sessions] == [utc(2024, 1, 5), utc(2024, 1, 6), utc(2024, 2, 3)]


def test_beam_an_anchor_earlier_than_the_previous_session_is_kept_as_written(tmp_path, caplog):
    chat = beam_chat()
    chat[2]["turns"][0][0]["time_anchor"] = "January-01-2024"
    chat_dir = write_beam(tmp_path)
    (chat_dir / "chat.json").write_text(json.dumps(chat), encoding="utf-8")
    with caplog.at_level(logging.DEBUG, logger="memstream.eval"):
        [s] = load_set(chat_dir)
    assert [x.index for x in s.sessions] == [1, 2, 3]
    assert s.sessions[2].occurred_at == utc(2024, 1, 1)
    assert any("before the previous session" in r.getMessage() for r in caplog.records)


def test_beam_questions_take_the_ability_the_answer_and_flattened_source_ids(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="memstream.eval"):
        [s] = load_set(write_beam(tmp_path))
    assert [(q.category, q.answer, q.evidence) for q in s.questions] == [
        ("abstention", "You never said.", []),
        ("contradiction_resolution", "It changed.", ["0", "2"]),  # dict of lists, deduplicated in order
        ("event_ordering", "port, deadline", ["0", "2", "4"]),   # nested lists
        ("information_extraction", "3000", ["0", "99"]),         # unknown id kept, and reported
        ("instruction_following", None, ["6"]),
    ]
    assert any("99" in r.getMessage() and "beam-1" in r.getMessage() for r in caplog.records)


def test_beam_a_duplicate_message_id_is_refused_naming_chat_and_id(tmp_path):
    chat = beam_chat()
    chat[1]["turns"][0][1]["id"] = 2
    chat_dir = write_beam(tmp_path)
    (chat_dir / "chat.json").write_text(json.dumps(chat), encoding="utf-8")
    with pytest.raises(ValueError, match=r"beam-1.*duplicate message id 2"):
        load_set(chat_dir)


def test_beam_a_directory_of_chats_loads_every_chat_in_numeric_order(tmp_path):
    size_dir = tmp_path / "100K"
    for n in (10, 2, 1):
        write_beam(size_dir, n)
    (size_dir / "notes").mkdir()  # not a chat: skipped
    samples = load_set(size_dir)
    assert [s.sample_id for s in samples] == ["beam-100K-1", "beam-100K-2", "beam-100K-10"]
    with pytest.raises(ValueError, match="no BEAM chat"):
        load_set(size_dir / "notes")


@pytest.mark.parametrize("text, expected", [
    ("January-05-2024", utc(2024, 1, 5)), ("Jan-05-2024", utc(2024, 1, 5)), ("Sept-30-2024", utc(2024, 9, 30)),
    ("March 2, 2024", utc(2024, 3, 2)), ("2024-12-31", utc(2024, 12, 31)),
])
def test_beam_time_anchors_parse_to_utc_midnight(text, expected):
    assert parse_beam_date(text) == expected


@pytest.mark.parametrize("text", ["Smarch-05-2024", "February-30-2024", "", None])
def test_beam_bad_time_anchors_are_refused(text):
    with pytest.raises(ValueError):
        parse_beam_date(text)


def test_score_handles_named_categories_after_numbered_ones():
    got = score([("event_ordering", ["a"], ["a"]), (2, ["b"], []), ("abstention", ["c"], ["c"])])
    assert list(got["per_category"]) == ["2", "abstention", "event_ordering"]


# ---------------------------------------------------------------- LongMemEval


def test_longmemeval_items_become_samples_with_one_question_over_their_haystack(tmp_path):
    path = tmp_path / "longmemeval_s.json"
    path.write_text(json.dumps(longmemeval()), encoding="utf-8")
    first, second = load_set(path)
    assert (first.sample_id, [x.index for x in first.sessions]) == ("q1", [1, 2])
    assert [x.occurred_at for x in first.sessions] == [utc(2023, 5, 20, 2, 21), utc(2023, 5, 21, 14, 5)]
    assert [(u.dia_id, u.speaker) for u in first.sessions[1].utterances] == [
        ("answer_s_b:0", "user"), ("answer_s_b:1", "assistant")]
    assert first.questions == [Question("Where did I move?", "Oslo", ["answer_s_b:0"], "single-session-user")]
    # No turn marked has_answer: every turn of the answer sessions is the evidence.
    assert second.questions == [Question("When?", "3", ["s_c:0", "s_c:1"], "temporal-reasoning")]


def test_longmemeval_dates_parse_with_or_without_the_weekday():
    assert parse_longmemeval_date("2023/05/20 (Sat) 02:21") == utc(2023, 5, 20, 2, 21)
    assert parse_longmemeval_date("2023/05/20 02:21") == utc(2023, 5, 20, 2, 21)
    with pytest.raises(ValueError):
        parse_longmemeval_date("20 May 2023")


# ---------------------------------------------------------------- detection


def test_auto_detection_tells_the_three_sets_apart_and_names_an_unknown_path(tmp_path):
    lme = tmp_path / "lme.json"
    lme.write_text(json.dumps(longmemeval()), encoding="utf-8")
    assert [s.sample_id for s in load_set(lme)] == ["q1", "q2_abs"]
    assert len(load_set(LOCOMO_FIXTURE)) == 2 == len(load_set(LOCOMO_FIXTURE, "locomo"))
    assert load_set(write_beam(tmp_path / "b"))[0].sample_id == "beam-1"
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"foo": 1}]), encoding="utf-8")
    with pytest.raises(ValueError, match="other.json"):
        load_set(other)
    text = tmp_path / "notes.txt"
    text.write_text("hi", encoding="utf-8")
    with pytest.raises(ValueError, match="notes.txt"):
        load_set(text)
    with pytest.raises(ValueError, match="format"):
        load_set(lme, "squad")


# ---------------------------------------------------------------- oversized messages


def test_fit_messages_cuts_a_huge_message_so_its_stored_form_fits_and_counts_it(caplog):
    huge = "x" * 400_000
    sample = Sample("s", "user", "assistant", [Session(1, utc(2024, 1, 1), [
        Utterance("0", "user", huge), Utterance("1", "assistant", "short")])],
        [Question("q", None, ["0"], "c")])
    with caplog.at_level(logging.WARNING, logger="memstream.eval"):
        [fitted], cut = fit_messages([sample], 100_000)
    assert cut == 1
    big, small = fitted.sessions[0].utterances
    assert len(f"{big.speaker}: {big.text}") == 100_000 and big.text == huge[:100_000 - len("user: ")]
    assert small == sample.sessions[0].utterances[1]
    assert sample.sessions[0].utterances[0].text == huge  # the input is left alone
    assert fitted.questions == sample.questions
    [record] = caplog.records
    assert "'s'" in record.getMessage() and "400000" in record.getMessage() and "xxx" not in record.getMessage()
    assert fit_messages([sample], 1_000_000) == ([sample], 0)
