"""The LoCoMo format, and the model every evaluated set is read into: parsing and scoring.

``memstream eval`` (``evaluation.run_eval``) ingests samples through the real write path and
asks their questions through ``MemoryReader.read``; the evidence utterances (``dia_id`` such as
``"D1:3"``) are looked for among the episodes ``read`` returned. Parsing (``parse_locomo``) and
scoring (``score``) are pure so they can be unit-tested without the stack.

Mapping: each utterance becomes one ``TurnRecorded`` of user ``locomo-<tag>-<sample_id>`` in
conversation ``session_<n>``, with ``"<speaker>: <text>"`` as the user message, no assistant
message, ``occurred_at`` = session time + utterance index seconds (so the log order is the
dialogue order), and ``metadata={"dia_id": ...}`` so a retrieved episode names its utterance.
"""
from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence


log = logging.getLogger("memstream.eval")

QA_CONVERSATION = "locomo-qa"  # the conversation questions are asked in (no recent turns there)

_MONTHS = {m: i for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"], start=1)}
_MONTHS.update({name[:3]: i for name, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
# "1:56 pm on 8 May, 2023"; tolerant of "p.m.", missing comma and extra spaces.
_DATE_TIME = re.compile(
    r"^\s*(\d{1,2}):(\d{2})\s*([ap])\.?\s*m\.?\s+on\s+(\d{1,2})\s+([a-z]+)\.?,?\s+(\d{4})\s*$", re.IGNORECASE)
_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"D\d+:\d+")


# ---------------------------------------------------------------- parsed model


@dataclass(frozen=True)
class Utterance:
    dia_id: str
    speaker: str
    text: str


@dataclass(frozen=True)
class Session:
    index: int
    occurred_at: datetime  # tz-aware UTC; LoCoMo gives no zone, so the wall time is read as UTC
    utterances: list[Utterance]


@dataclass(frozen=True)
class Question:
    question: str
    answer: str | None  # None when absent (adversarial items); ints become strings
    evidence: list[str]
    category: int | str  # LoCoMo's numbered categories; other sets (BEAM) name theirs


@dataclass(frozen=True)
class Sample:
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    questions: list[Question] = field(default_factory=list)


# ---------------------------------------------------------------- parsing (pure)


def load_locomo(path: Path) -> list[Sample]:
    """Read and parse a LoCoMo JSON file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    return parse_locomo(data)


def parse_locomo(data: Any) -> list[Sample]:
    """Parse the decoded JSON of a LoCoMo file: a list of samples. Raises ``ValueError`` naming
    the sample and the field, so a bad file is fixed at its source rather than half-scored."""
    if not isinstance(data, list):
        raise ValueError(f"LoCoMo data must be a JSON list of samples, got {type(data).__name__}")
    return unique([_parse_sample(raw, i) for i, raw in enumerate(data)], "sample {!r}: duplicate sample_id")


def unique(samples: list[Sample], refusal: str) -> list[Sample]:
    """``samples``, refused (``refusal`` formatted with the id) if two share a ``sample_id``."""
    seen: set[str] = set()
    for s in samples:
        if s.sample_id in seen:
            raise ValueError(refusal.format(s.sample_id))
        seen.add(s.sample_id)
    return samples


def parse_locomo_datetime(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> 2023-05-08 13:56 UTC. Month names may be full or short."""
    m = _DATE_TIME.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"unrecognised date_time {text!r} (expected like '1:56 pm on 8 May, 2023')")
    hour, minute, meridiem, day, month_name, year = m.groups()
    hour, minute = int(hour), int(minute)
    month = _MONTHS.get(month_name.lower())
    if month is None or not 1 <= hour <= 12 or minute > 59:
        raise ValueError(f"unrecognised date_time {text!r}: bad month, hour or minute")
    hour = hour % 12 + (12 if meridiem.lower() == "p" else 0)
    try:
        return datetime(int(year), month, int(day), hour, minute, tzinfo=timezone.utc)
    except ValueError as exc:
        raise ValueError(f"invalid date_time {text!r}: {exc}") from exc


def _parse_sample(raw: Any, position: int) -> Sample:
    if not isinstance(raw, dict):
        raise ValueError(f"sample #{position}: must be an object, got {type(raw).__name__}")
    sample_id = raw.get("sample_id")
    if not isinstance(sample_id, (str, int)) or str(sample_id) == "":
        raise ValueError(f"sample #{position}: missing or invalid 'sample_id'")
    sid = str(sample_id)
    conv = raw.get("conversation")
    if not isinstance(conv, dict):
        raise ValueError(f"sample {sid!r}: missing or invalid 'conversation'")
    speakers = [_required_str(conv, name, sid, "conversation.") for name in ("speaker_a", "speaker_b")]
    sessions = _parse_sessions(conv, sid)
    qa = raw.get("qa", [])
    if not isinstance(qa, list):
        raise ValueError(f"sample {sid!r}: 'qa' must be a list")
    questions = [_parse_question(q, sid, i) for i, q in enumerate(qa)]
    warn_unknown_evidence(sid, sessions, questions)
    return Sample(sid, speakers[0], speakers[1], sessions, questions)


def _parse_sessions(conv: dict, sid: str) -> list[Session]:
    """Every ``session_N`` list with its ``session_N_date_time``, in N order."""
    numbered = sorted((int(m.group(1)), key) for key in conv if (m := _SESSION_KEY.match(key)))
    if not numbered:
        raise ValueError(f"sample {sid!r}: 'conversation' has no session_N lists")
    sessions = []
    for n, key in numbered:
        turns = conv[key]
        if not isinstance(turns, list):
            raise ValueError(f"sample {sid!r}: conversation.{key} must be a list")
        stamp_key = f"{key}_date_time"
        if stamp_key not in conv:
            raise ValueError(f"sample {sid!r}: conversation.{stamp_key} is missing")
        try:
            when = parse_locomo_datetime(conv[stamp_key])
        except ValueError as exc:
            raise ValueError(f"sample {sid!r}: conversation.{stamp_key}: {exc}") from exc
        utterances = [_parse_utterance(u, sid, f"conversation.{key}[{i}]") for i, u in enumerate(turns)]
        sessions.append(Session(n, when, utterances))
    return sessions


def _parse_utterance(raw: Any, sid: str, where: str) -> Utterance:
    if not isinstance(raw, dict):
        raise ValueError(f"sample {sid!r}: {where} must be an object")
    prefix = f"{where}."
    return Utterance(_required_str(raw, "dia_id", sid, prefix), _required_str(raw, "speaker", sid, prefix),
                     _required_str(raw, "text", sid, prefix, allow_empty=True))


def _parse_question(raw: Any, sid: str, i: int) -> Question:
    where = f"qa[{i}]"
    if not isinstance(raw, dict):
        raise ValueError(f"sample {sid!r}: {where} must be an object")
    text = _required_str(raw, "question", sid, f"{where}.")
    category = raw.get("category")
    if isinstance(category, str) and category.strip().isdigit():
        category = int(category)
    if not isinstance(category, int) or isinstance(category, bool):
        raise ValueError(f"sample {sid!r}: {where}.category must be an integer, got {category!r}")
    answer = raw.get("answer")
    return Question(text, None if answer is None else str(answer), _parse_evidence(raw.get("evidence"), sid, where),
                    category)


def _parse_evidence(raw: Any, sid: str, where: str) -> list[str]:
    """dia_ids in order, without duplicates. Entries such as ``"D8:6; D9:17"`` occur in the wild,
    so every ``D<n>:<m>`` inside an entry counts; an entry with none is logged and dropped."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"sample {sid!r}: {where}.evidence must be a list of dia_ids")
    out: list[str] = []
    for entry in raw:
        found = _DIA_ID.findall(entry) if isinstance(entry, str) else []
        if not found:
            log.warning("sample %r: %s.evidence entry %r names no dia_id; ignored", sid, where, entry)
        out += [d for d in found if d not in out]
    return out


def warn_unknown_evidence(sid: str, sessions: Sequence[Session], questions: Iterable[Question]) -> None:
    """Evidence naming no utterance can never be retrieved; say so instead of scoring it silently
    (it is kept, and counts as missed)."""
    known = {u.dia_id for s in sessions for u in s.utterances}
    for q in questions:
        missing = [d for d in q.evidence if d not in known]
        if missing:
            log.warning("sample %r: question %r cites unknown utterance ids %s", sid, q.question, missing)


def _required_str(raw: dict, name: str, sid: str, prefix: str = "", *, allow_empty: bool = False) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ValueError(f"sample {sid!r}: {prefix}{name} is missing or not a non-empty string")
    return value


# ---------------------------------------------------------------- scoring (pure)


def question_metrics(evidence: Iterable[str], ranked: Sequence[str], k: int | None = None) -> tuple[float, float, float]:
    """(Hit@k, Recall@k, reciprocal rank) of one question; ``evidence`` must be non-empty.

    Duplicate ids in ``ranked`` are dropped first (keeping the best rank) so one utterance
    returned twice cannot count twice. The reciprocal rank is taken within the top k as well."""
    gold = set(evidence)
    if not gold:
        raise ValueError("a question without evidence cannot be scored")
    top = list(dict.fromkeys(ranked))[:k] if k is not None else list(dict.fromkeys(ranked))
    found = gold.intersection(top)
    rr = next((1.0 / rank for rank, d in enumerate(top, start=1) if d in gold), 0.0)
    return (1.0 if found else 0.0), len(found) / len(gold), rr


def score(results: Iterable[tuple[int | str, Iterable[str], Sequence[str]]], k: int | None = None) -> dict:
    """Mean Hit@k, Recall@k and MRR, overall and per category.

    ``results`` holds ``(category, evidence dia_ids, ranked retrieved dia_ids)`` per question.
    Questions without evidence (adversarial items, mostly) have nothing to find: they are counted
    in ``skipped_no_evidence`` rather than scored as misses or hits. ``per_category`` keys are
    strings so the dict is the same before and after a JSON round trip."""
    by_cat: dict[int | str, list[tuple[float, float, float]]] = defaultdict(list)
    skipped = 0
    for category, evidence, ranked in results:
        gold = set(evidence)
        if not gold:
            skipped += 1
            continue
        by_cat[category].append(question_metrics(gold, ranked, k))
    every = [m for ms in by_cat.values() for m in ms]
    return {
        "overall": _means(every),
        "per_category": {str(c): _means(by_cat[c]) for c in sorted(by_cat, key=_category_order)},
        "skipped_no_evidence": skipped,
    }


def _category_order(category: int | str) -> tuple:
    """Numbered categories in number order (LoCoMo's 1..5), named ones after them by name, so
    a mix of both sorts instead of raising a TypeError."""
    if isinstance(category, int):
        return (0, category, "")
    return (1, 0, str(category))


def _means(metrics: list[tuple[float, float, float]]) -> dict:
    if not metrics:
        return {"questions": 0, "hit_at_k": 0.0, "recall_at_k": 0.0, "mrr": 0.0}
    hit, recall, rr = (round(sum(col) / len(metrics), 3) for col in zip(*metrics))
    return {"questions": len(metrics), "hit_at_k": hit, "recall_at_k": recall, "mrr": rr}


def user_id_for(tag: str, sample: Sample) -> str:
    return f"locomo-{tag}-{sample.sample_id}"


def sample_turns(sample: Sample, tag: str):
    """The sample's utterances as ``TurnRecorded`` events, in dialogue order."""
    from memstream.schemas import TurnRecorded

    user_id = user_id_for(tag, sample)
    return [
        TurnRecorded.new(user_id=user_id, conversation_id=f"session_{s.index}", user_message=f"{u.speaker}: {u.text}",
                         assistant_message="", occurred_at=s.occurred_at + timedelta(seconds=i),
                         metadata={"dia_id": u.dia_id})
        for s in sample.sessions for i, u in enumerate(s.utterances)
    ]


def select_samples(samples: list[Sample], conv: str | None) -> list[Sample]:
    if conv is None:
        return samples
    chosen = [s for s in samples if s.sample_id == conv]
    if not chosen:
        raise ValueError(f"no sample {conv!r}; the file has {[s.sample_id for s in samples]}")
    return chosen

