"""Public memory benchmarks other than LoCoMo, read into LoCoMo's model (``Sample``).

One model means one harness: whatever the set, a sample is ingested utterance by utterance and
its questions are scored by whether the evidence utterances come back (``locomo.score``).

* LoCoMo: a JSON list of samples; delegated to ``locomo``.
* BEAM (github.com/mohammadtavakoli78/BEAM): a chat directory ``chats/<size>/<n>/`` holding
  ``chat.json`` (batches of turns of messages with integer ids) and
  ``probing_questions/probing_questions.json`` (ability -> questions citing message ids).
* LongMemEval (github.com/xiaowu0162/LongMemEval): a JSON list of items, each one question
  over its own haystack of sessions.

Everything here is pure apart from reading the files, so it is unit-tested without the stack.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

from memstream.bench.locomo import (_MONTHS, Question, Sample, Session, Utterance, load_locomo, parse_locomo,
                                    unique, warn_unknown_evidence)

log = logging.getLogger("memstream.eval")

FORMATS = ("auto", "locomo", "beam", "longmemeval")

BEAM_CHAT = "chat.json"
BEAM_QUESTIONS = ("probing_questions/probing_questions.json", "pq.json")  # repo layout first
BEAM_FIRST_DAY = datetime(2024, 1, 1, tzinfo=timezone.utc)  # a chat whose first batch has no anchor
_BEAM_ANSWER_KEYS = ("answer", "ideal_answer", "ideal_response", "ideal_summary")
_SIZE = re.compile(r"^\d+(?:\.\d+)?[KMB]$", re.IGNORECASE)  # "100K", "500K", "1M", "10M"
# "January-05-2024" as BEAM writes it; also "Jan 5, 2024", "Sept-5th-2024" and the like.
_MONTH_DAY_YEAR = re.compile(r"^\s*([a-z]+)\.?[\s\-/]+(\d{1,2})(?:st|nd|rd|th)?,?[\s\-/]+(\d{4})\s*$", re.IGNORECASE)
_ISO_DATE = re.compile(r"^\s*(\d{4})-(\d{1,2})-(\d{1,2})\s*$")
# "2023/05/20 (Sat) 02:21" as LongMemEval writes it; the weekday and the time are optional.
_LME_DATE = re.compile(r"^\s*(\d{4})/(\d{1,2})/(\d{1,2})\s*(?:\([A-Za-z]+\))?\s*(?:(\d{1,2}):(\d{2}))?\s*$")


def load_set(path: Path, fmt: str = "auto") -> list[Sample]:
    """The samples of a benchmark at ``path``. ``fmt="auto"`` tells the set by its shape: a
    directory is BEAM; a ``.json`` list of objects with ``conversation`` is LoCoMo, with
    ``haystack_sessions`` LongMemEval. Anything else is a ``ValueError`` naming the path."""
    path = Path(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if fmt == "locomo":
        return load_locomo(path)
    if fmt == "beam":
        return load_beam(path)
    if fmt == "longmemeval":
        return parse_longmemeval(_read_json(path))
    if path.is_dir():
        return load_beam(path)
    if path.suffix.lower() != ".json":
        raise ValueError(f"{path}: cannot tell the benchmark format (expected a BEAM directory or a .json file)")
    data = _read_json(path)
    # Decoded once here and handed to the parser: LongMemEval files run to gigabytes.
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        if all("conversation" in x for x in data):
            return parse_locomo(data)
        if all("haystack_sessions" in x for x in data):
            return parse_longmemeval(data)
    raise ValueError(f"{path}: not a LoCoMo or LongMemEval file (expected a JSON list of objects with "
                     f"'conversation' or 'haystack_sessions')")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc


# ---------------------------------------------------------------- BEAM


def load_beam(path: Path) -> list[Sample]:
    """One sample per chat directory: ``path`` itself when it holds ``chat.json``, else every
    subdirectory that does, in numeric order (``2`` before ``10``)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: a BEAM set is a chat directory or a directory of them")
    if (path / BEAM_CHAT).is_file():
        return [_load_beam_chat(path)]
    subdirs = sorted((p for p in path.iterdir() if p.is_dir()), key=lambda p: _numeric_first(p.name))
    chats = [p for p in subdirs if (p / BEAM_CHAT).is_file()]
    if not chats:
        raise ValueError(f"{path}: no BEAM chat directories (none of its subdirectories holds {BEAM_CHAT})")
    skipped = [p.name for p in subdirs if p not in chats]
    if skipped:
        log.warning("%s: subdirectories without %s skipped: %s", path, BEAM_CHAT, skipped)
    return [_load_beam_chat(p) for p in chats]


def _numeric_first(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _load_beam_chat(chat_dir: Path) -> Sample:
    size = chat_dir.parent.name
    sid = f"beam-{size}-{chat_dir.name}" if _SIZE.match(size) else f"beam-{chat_dir.name}"
    batches = _read_json(chat_dir / BEAM_CHAT)
    questions_file = next((chat_dir / name for name in BEAM_QUESTIONS if (chat_dir / name).is_file()), None)
    if questions_file is None:
        log.warning("%s: no %s; the chat is loaded without questions", chat_dir, BEAM_QUESTIONS[0])
        probing: Any = {}
    else:
        probing = _read_json(questions_file)
    return parse_beam_chat(sid, batches, probing)


def parse_beam_chat(sid: str, batches: Any, probing: Any) -> Sample:
    """A decoded ``chat.json`` and ``probing_questions.json`` as one sample: a session per batch,
    an utterance per message (``dia_id`` = the message id), a question per probing question
    (``category`` = its ability, ``evidence`` = its ``source_chat_ids``)."""
    if not isinstance(batches, list):
        raise ValueError(f"chat {sid!r}: chat.json must be a list of batches, got {type(batches).__name__}")
    sessions = _beam_sessions(sid, batches)
    if not isinstance(probing, dict):
        raise ValueError(f"chat {sid!r}: probing questions must be an object of ability -> list")
    questions = []
    for ability, items in probing.items():
        if not isinstance(items, list):
            raise ValueError(f"chat {sid!r}: probing questions[{ability!r}] must be a list")
        questions += [_beam_question(sid, ability, i, q) for i, q in enumerate(items)]
    warn_unknown_evidence(sid, sessions, questions)
    return Sample(sid, "user", "assistant", sessions, questions)


def _beam_sessions(sid: str, batches: list) -> list[Session]:
    sessions: list[Session] = []
    seen: set[str] = set()
    for position, batch in enumerate(batches):
        where = f"batch #{position + 1}"
        if not isinstance(batch, dict) or not isinstance(batch.get("turns"), list):
            raise ValueError(f"chat {sid!r}: {where} must be an object with a 'turns' list")
        number = batch.get("batch_number")
        index = number if isinstance(number, int) and not isinstance(number, bool) else position + 1
        messages = list(_beam_messages(sid, where, batch["turns"]))
        utterances = []
        for m in messages:
            dia_id = str(m["id"])
            if dia_id in seen:
                raise ValueError(f"chat {sid!r}: duplicate message id {dia_id}")
            seen.add(dia_id)
            utterances.append(Utterance(dia_id, m["role"], m["content"]))
        sessions.append(Session(index, _beam_batch_time(sid, where, batch, messages, sessions), utterances))
    return sessions


def _beam_messages(sid: str, where: str, turns: list) -> Iterator[dict]:
    for t, turn in enumerate(turns):
        if not isinstance(turn, list):
            raise ValueError(f"chat {sid!r}: {where} turns[{t}] must be a list of messages")
        for j, m in enumerate(turn):
            at = f"{where} turns[{t}][{j}]"
            if not isinstance(m, dict):
                raise ValueError(f"chat {sid!r}: {at} must be an object")
            if not isinstance(m.get("role"), str) or not m["role"].strip():
                raise ValueError(f"chat {sid!r}: {at}.role is missing or not a non-empty string")
            if not isinstance(m.get("content"), str):
                raise ValueError(f"chat {sid!r}: {at}.content is missing or not a string")
            mid = m.get("id")
            if isinstance(mid, bool) or not (isinstance(mid, int) or (isinstance(mid, str) and mid.strip())):
                raise ValueError(f"chat {sid!r}: {at}.id is missing or not an integer")
            yield m


def _beam_batch_time(sid: str, where: str, batch: dict, messages: list[dict],
                     earlier: Sequence[Session]) -> datetime:
    """The first anchor among the batch's messages (BEAM puts it on the opening user message),
    else the batch's own, else the day after the previous session: a plausible order is better
    than refusing a chat over a missing date."""
    anchors = [m["time_anchor"] for m in messages if m.get("time_anchor")]
    if batch.get("time_anchor"):
        anchors.append(batch["time_anchor"])
    previous = earlier[-1].occurred_at if earlier else None
    if anchors:
        try:
            when = parse_beam_date(anchors[0])
        except ValueError as exc:
            log.warning("chat %r: %s: %s; dated after the previous session instead", sid, where, exc)
        else:
            if previous is not None and when < previous:
                # Kept as written: reordering would change which turns the harness sees as recent.
                log.debug("chat %r: %s is dated %s, before the previous session (%s)", sid, where, when, previous)
            return when
    return BEAM_FIRST_DAY if previous is None else previous + timedelta(days=1)


def parse_beam_date(text: Any) -> datetime:
    """``"January-05-2024"`` -> 2024-01-05 00:00 UTC; short month names and ``"2024-01-05"`` too."""
    if isinstance(text, str):
        if m := _MONTH_DAY_YEAR.match(text):
            month, day, year = _MONTHS.get(m.group(1).lower()), int(m.group(2)), int(m.group(3))
        elif m := _ISO_DATE.match(text):
            year, month, day = (int(g) for g in m.groups())
        else:
            month = None
        if month is not None:
            try:
                return datetime(year, month, day, tzinfo=timezone.utc)
            except ValueError:
                pass
    raise ValueError(f"unrecognised time anchor {text!r} (expected like 'January-05-2024')")


def _beam_question(sid: str, ability: str, i: int, raw: Any) -> Question:
    where = f"probing questions[{ability!r}][{i}]"
    if not isinstance(raw, dict):
        raise ValueError(f"chat {sid!r}: {where} must be an object")
    text = raw.get("question")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"chat {sid!r}: {where}.question is missing or not a non-empty string")
    answer = next((raw[k] for k in _BEAM_ANSWER_KEYS if raw.get(k) is not None), None)
    evidence = list(dict.fromkeys(_flat_ids(sid, where, raw.get("source_chat_ids"))))
    return Question(text, None if answer is None else str(answer), evidence, ability)


def _flat_ids(sid: str, where: str, raw: Any) -> Iterator[str]:
    """Message ids in order from ``source_chat_ids``: a list of ints, a list of lists (event
    ordering) or an object of lists (``first_statement``/``second_statement``)."""
    if raw is None:
        return
    if isinstance(raw, dict):
        raw = list(raw.values())
    if isinstance(raw, list):
        for x in raw:
            yield from _flat_ids(sid, where, x)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        yield str(raw)
    elif isinstance(raw, str) and raw.strip():
        yield raw.strip()
    else:
        log.warning("chat %r: %s.source_chat_ids entry %r is not a message id; ignored", sid, where, raw)


# ---------------------------------------------------------------- LongMemEval


def parse_longmemeval(data: Any) -> list[Sample]:
    """A decoded LongMemEval file: one sample per item (its own haystack, one question)."""
    if not isinstance(data, list):
        raise ValueError(f"LongMemEval data must be a JSON list of items, got {type(data).__name__}")
    return unique([_lme_item(raw, i) for i, raw in enumerate(data)], "item {!r}: duplicate question_id")


def parse_longmemeval_date(text: Any) -> datetime:
    """``"2023/05/20 (Sat) 02:21"`` -> 2023-05-20 02:21 UTC (the file gives no zone)."""
    m = _LME_DATE.match(text) if isinstance(text, str) else None
    if m is not None:
        year, month, day, hour, minute = (int(g) if g is not None else 0 for g in m.groups())
        try:
            return datetime(year, month, day, hour, minute, tzinfo=timezone.utc)
        except ValueError:
            pass
    raise ValueError(f"unrecognised date {text!r} (expected like '2023/05/20 (Sat) 02:21')")


def _lme_item(raw: Any, position: int) -> Sample:
    if not isinstance(raw, dict):
        raise ValueError(f"item #{position}: must be an object, got {type(raw).__name__}")
    qid = raw.get("question_id")
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid) == "":
        raise ValueError(f"item #{position}: missing or invalid 'question_id'")
    sid = str(qid)
    haystack, ids, dates = raw.get("haystack_sessions"), raw.get("haystack_session_ids"), raw.get("haystack_dates")
    if not all(isinstance(x, list) for x in (haystack, ids, dates)) or not len(haystack) == len(ids) == len(dates):
        raise ValueError(f"item {sid!r}: haystack_sessions, haystack_session_ids and haystack_dates must be "
                         f"lists of the same length")
    sessions: list[Session] = []
    answer_turns: list[str] = []
    turns_of: dict[str, list[str]] = {}  # original session id -> its dia_ids, for answer_session_ids
    used: set[str] = set()
    for n, (turns, session_id, date) in enumerate(zip(haystack, ids, dates), start=1):
        where = f"haystack_sessions[{n - 1}]"
        if not isinstance(turns, list):
            raise ValueError(f"item {sid!r}: {where} must be a list of turns")
        try:
            when = parse_longmemeval_date(date)
        except ValueError as exc:
            raise ValueError(f"item {sid!r}: haystack_dates[{n - 1}]: {exc}") from exc
        key = _unique_session_key(sid, str(session_id), used)
        utterances = []
        for t, turn in enumerate(turns):
            if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) \
                    or not isinstance(turn.get("content"), str):
                raise ValueError(f"item {sid!r}: {where}[{t}] must be an object with string role and content")
            dia_id = f"{key}:{t}"
            utterances.append(Utterance(dia_id, turn["role"], turn["content"]))
            if turn.get("has_answer") is True:
                answer_turns.append(dia_id)
        turns_of.setdefault(str(session_id), []).extend(u.dia_id for u in utterances)
        sessions.append(Session(n, when, utterances))
    if not answer_turns:
        # Older releases mark no turns; the whole answer sessions are then the evidence.
        answer_turns = [d for s in raw.get("answer_session_ids") or [] for d in turns_of.get(str(s), [])]
    text = raw.get("question")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"item {sid!r}: question is missing or not a non-empty string")
    category = raw.get("question_type")
    if not isinstance(category, str) or not category.strip():
        raise ValueError(f"item {sid!r}: question_type is missing or not a non-empty string")
    answer = raw.get("answer")
    question = Question(text, None if answer is None else str(answer), list(dict.fromkeys(answer_turns)), category)
    return Sample(sid, "user", "assistant", sessions, [question])


def _unique_session_key(sid: str, session_id: str, used: set[str]) -> str:
    """A session id that repeats in one haystack gets a ``#<k>`` suffix so dia_ids stay unique."""
    key, k = session_id, 1
    while key in used:
        k += 1
        key = f"{session_id}#{k}"
    if key != session_id:
        log.warning("item %r: haystack session id %r repeats; later copy named %r", sid, session_id, key)
    used.add(key)
    return key


# ---------------------------------------------------------------- shared


def fit_messages(samples: Sequence[Sample], limit_chars: int) -> tuple[list[Sample], int]:
    """``samples`` with every utterance whose stored form ``"<speaker>: <text>"`` is longer than
    ``limit_chars`` cut so that form is exactly ``limit_chars`` long, and how many were cut.
    BEAM has single messages of hundreds of thousands of characters (pasted logs) that the turn
    log would refuse; a cut message is still ingested, so its questions stay answerable."""
    if limit_chars < 1:
        raise ValueError("limit_chars must be >= 1")
    cut = 0
    out = []
    for sample in samples:
        sessions = []
        for session in sample.sessions:
            utterances = []
            for u in session.utterances:
                stored = len(u.speaker) + 2 + len(u.text)
                if stored > limit_chars:
                    room = limit_chars - len(u.speaker) - 2
                    if room < 0:
                        raise ValueError(f"sample {sample.sample_id!r}: {u.dia_id}: limit {limit_chars} is "
                                         f"shorter than the speaker prefix {u.speaker!r}")
                    log.warning("sample %r: %s has %d characters (%d stored); cut to %d stored",
                                sample.sample_id, u.dia_id, len(u.text), stored, limit_chars)
                    u = replace(u, text=u.text[:room])
                    cut += 1
                utterances.append(u)
            sessions.append(replace(session, utterances=utterances))
        out.append(replace(sample, sessions=sessions, questions=list(sample.questions)))
    return out, cut
