"""``memstream eval formation``: what formation stores, scored against labelled conversations.

Each conversation's turns go through formation as the worker forms them (``Formation.decide``:
extraction, resolution, the safety gate, the junk guard, the graph), in order, on in-memory views
(no Kafka, no Postgres: formation is deterministic given the model's answers). Every turn is
labelled with the facts a careful reader would store, change or leave (``op``), the user's
relationships, and what must not be stored (``must_not``: other people's facts, questions,
hypotheticals, prompt text, ...). Scored per extractor:

* **precision / recall** of stored facts (added or updated) and of opened edges;
* **junk rate**: stored facts the labels do not hold — the share of what was stored that should
  not exist (a guard that stores nothing has none, so recall stands beside it);
* **wrong-subject rate**: stored facts a label says belong to someone else;
* **decision accuracy**: labelled ADD / UPDATE / DELETE / NOOP decided as labelled;
* LLM calls and tokens per turn.

A stored fact matches a label by its value (case and surrounding punctuation aside; one may hold
the other, "Lisbon" / "Lisbon, Portugal") and a compatible slot (the same attribute, or ones the
vocabulary maps to the same relation): extractors name slots differently, and the value is what
would be wrong.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterable

from memstream.schemas import (Decision, EdgeOpened, FactAdded, FactDeleted, FactRefused, FactReinforced,
                               FactUpdated, TurnRecorded, encode)
from memstream.llm.protocols import ModelRefused, ModelUnavailable, Unanswered
from memstream.schemas.vocabulary import canonical, relation_of

log = logging.getLogger("memstream.bench")

DATASET = Path(__file__).with_name("data") / "formation_eval.json"
OPS = ("ADD", "UPDATE", "DELETE", "NOOP")


def _norm(value: str) -> str:
    return re.sub(r"[\s\"'.,!?;:()]+", " ", value.casefold()).strip()


def same_value(a: str, b: str) -> bool:
    a, b = _norm(a), _norm(b)
    return bool(a and b) and (a == b or (min(len(a), len(b)) >= 3 and (a in b or b in a)))


def same_slot(a: str, b: str) -> bool:
    if a == b or canonical(a) == canonical(b):
        return True
    ra, rb = relation_of(a), relation_of(b)
    return ra is not None and ra == rb


@dataclass
class Score:
    """Counts over every labelled turn of one extractor."""

    turns: int = 0
    stored: int = 0
    stored_right: int = 0
    junk: int = 0
    wrong_subject: int = 0
    labelled: int = 0
    found: int = 0
    ops: int = 0
    ops_right: int = 0
    edges: int = 0
    edges_right: int = 0
    edges_labelled: int = 0
    edges_found: int = 0
    calls: int = 0
    tokens: tuple[int, int] = (0, 0)
    seconds: float = 0.0
    refused_turns: int = 0
    guard_refused: int = 0
    guard_wrong: int = 0  # refusals of facts the labels hold: what the guard cost in recall
    guard_wrong_examples: list[dict] = field(default_factory=list)
    junk_by_trap: dict[str, int] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        def ratio(a: int, b: int) -> float | None:
            return round(a / b, 3) if b else None

        return {"turns": self.turns, "facts_stored": self.stored, "precision": ratio(self.stored_right, self.stored),
                "recall": ratio(self.found, self.labelled), "junk_rate": ratio(self.junk, self.stored),
                "wrong_subject_rate": ratio(self.wrong_subject, self.stored),
                "decision_accuracy": ratio(self.ops_right, self.ops),
                "edge_precision": ratio(self.edges_right, self.edges), "edge_recall": ratio(self.edges_found,
                                                                                           self.edges_labelled),
                "llm_calls_per_turn": ratio(self.calls, self.turns),
                "tokens_per_turn": [round(t / self.turns, 1) if self.turns else None for t in self.tokens],
                "seconds_per_turn": ratio(round(self.seconds * 1000), self.turns * 1000),
                "turns_given_up": self.refused_turns, "guard_refused": self.guard_refused,
                "guard_refused_labelled_facts": self.guard_wrong, "junk_by_trap": dict(sorted(self.junk_by_trap.items())),
                "junk_examples": self.examples[:12], "guard_wrong_examples": self.guard_wrong_examples[:12]}


def score_turn(score: Score, label: dict, made: Iterable[Decision], said: str) -> None:
    """Add one turn's decisions to ``score`` against its labels."""
    made = list(made)
    stored = [d for d in made if isinstance(d, (FactAdded, FactUpdated))]
    facts = label.get("facts", [])
    keep = [f for f in facts if f["op"] in ("ADD", "UPDATE")]
    score.turns += 1
    score.stored += len(stored)
    score.labelled += len(keep)
    matched: set[int] = set()
    for d in stored:
        hit = next((i for i, f in enumerate(keep) if i not in matched and same_value(d.value, f["value"])
                    and same_slot(d.attribute, f["attribute"])), None)
        if hit is None:  # its value under another slot name still counts as found, not as junk
            hit = next((i for i, f in enumerate(keep) if i not in matched and same_value(d.value, f["value"])), None)
        if hit is not None:
            matched.add(hit)
            score.stored_right += 1
            continue
        score.junk += 1
        why = next((m["why"] for m in label.get("must_not", []) if same_value(d.value, m["value"])), None)
        if why == "other_person":
            score.wrong_subject += 1
        trap = why or (label.get("traps") or ["plain"])[0]
        score.junk_by_trap[trap] = score.junk_by_trap.get(trap, 0) + 1
        score.examples.append({"said": said[:160], "stored": f"{d.attribute}={d.value}", "trap": trap})
    score.found += len(matched)
    for d in made:
        if isinstance(d, FactRefused):
            score.guard_refused += 1
            if any(same_value(d.value, f["value"]) for f in keep):
                score.guard_wrong += 1
                score.guard_wrong_examples.append({"said": said[:160], "refused": f"{d.attribute}={d.value}",
                                                   "as": d.refusal, "evidence": (d.evidence or "")[:160]})
    for f in facts:
        score.ops += 1
        values = lambda kind: [d for d in made if isinstance(d, kind) and same_value(getattr(d, "value", ""),  # noqa: E731
                                                                                      f["value"])]
        if f["op"] == "ADD":
            right = bool(values(FactAdded))
        elif f["op"] == "UPDATE":
            right = bool(values(FactUpdated)) or bool(values(FactAdded))  # a first value of a slot is an ADD
        elif f["op"] == "DELETE":
            right = any(isinstance(d, FactDeleted) for d in made)
        else:  # NOOP: said again, nothing new stored for it
            right = not values(FactAdded) and not values(FactUpdated)
            right = right or any(isinstance(d, FactReinforced) for d in made)
        score.ops_right += right
    opened = [d for d in made if isinstance(d, EdgeOpened)]
    wanted = label.get("edges", [])
    score.edges += len(opened)
    score.edges_labelled += len(wanted)
    seen: set[int] = set()
    for e in opened:
        hit = next((i for i, w in enumerate(wanted) if i not in seen and canonical(e.relation) == canonical(w["relation"])
                    and _norm(w["target"]) in _norm(e.fact_sentence)), None)
        if hit is not None:
            seen.add(hit)
            score.edges_right += 1
    score.edges_found += len(seen)


def _event_id(at: datetime, name: str) -> uuid.UUID:
    """A UUIDv7 of ``at`` whose other bits come from ``name``: the same run decides the same ids."""
    rand = int.from_bytes(hashlib.sha256(name.encode()).digest()[:10], "big")
    ms = int(at.timestamp() * 1000) & ((1 << 48) - 1)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)


class _Counting:
    """A model client that counts its calls (tokens come from the client's own ``tokens``)."""

    METHODS = ("extract", "resolve", "resolve_all", "extract_turn")

    def __init__(self, client, calls: list[int]):
        self._client, self._calls = client, calls

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if name not in self.METHODS:
            return attr

        async def counted(*args, **kwargs):
            self._calls[0] += 1
            return await attr(*args, **kwargs)

        return counted


def _tokens(*clients) -> tuple[int, int]:
    seen, total = set(), [0, 0]
    for c in clients:
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        t = getattr(c, "tokens", (0, 0))
        total[0] += t[0]
        total[1] += t[1]
    return total[0], total[1]


async def evaluate(settings, dataset: Path = DATASET, *, limit: int | None = None, embedder=None,
                   on_progress=None, parallel: int = 1) -> dict[str, Any]:
    """Score ``settings.extractor`` on ``dataset`` (at most ``limit`` conversations)."""
    from memstream.embedding import embedder_for
    from memstream.llm.clients import llm_clients
    from memstream.streams.log.records import Record
    from memstream.streams.worker.formation.graph import GraphView
    from memstream.streams.worker.formation.pipeline import Formation
    from memstream.streams.worker.formation.views import MemoryView

    data = json.loads(Path(dataset).read_text())
    conversations = data["conversations"][:limit] if limit else data["conversations"]
    embedder = embedder or embedder_for(settings)
    clients = llm_clients(settings)
    calls = [0]
    counted = [(_Counting(c, calls) if c is not None else None) for c in clients]
    formation = Formation(producer=None, decisions_topic="eval", embedder=embedder, extractor=counted[0],
                          resolver=counted[1], dead_letters=None, pool=None, barrier=None, relations=counted[2],
                          turn_extractor=counted[3], concurrency=settings.formation_concurrency,
                          gate_observations=settings.gate_observations, model_attempts=settings.formation_model_attempts)
    score = Score()
    total = sum(len(c["turns"]) for c in conversations)
    started = time.perf_counter()
    done = [0]
    # Conversations side by side (each its own user), as the worker forms users: a model server
    # answers several calls at once. Each conversation's turns stay in order.
    at_once = asyncio.Semaphore(max(1, min(parallel, len(conversations))))

    async def one(conv: dict) -> None:
        async with at_once:
            view, graph = MemoryView(embedder.model_id), GraphView(None)
            at = datetime.fromisoformat(conv["started_at"])
            for n, t in enumerate(conv["turns"]):
                at += timedelta(minutes=t.get("minutes_after_previous", 1))
                turn = TurnRecorded(event_id=_event_id(at, f"{conv['id']}:{n}"),
                                    user_id=conv["user_id"], conversation_id=conv["id"], occurred_at=at,
                                    user_message=t["user"], assistant_message=t["assistant"])
                record = Record("eval", 0, n, conv["user_id"].encode(), encode(turn), (), int(at.timestamp() * 1000))
                letters: list = []
                made = []
                # As the worker does: a turn the model gives no usable answer for is asked again, on
                # forks of the views (nothing half-made stays), and given up after its attempts.
                for attempt in range(settings.formation_model_attempts):
                    facts, edges = view.fork(), graph.fork()
                    try:
                        made = await formation.decide([(record, turn)], facts, edges, letters=letters)
                    except (Unanswered, ModelRefused, ModelUnavailable) as exc:
                        log.info("turn %s of %s: %s", n, conv["id"], exc)
                        if isinstance(exc, ModelRefused) or attempt == settings.formation_model_attempts - 1:
                            letters.append((record, "eval", str(exc)))
                            break
                        continue
                    view, graph = facts, edges
                    break
                score.refused_turns += len(letters)
                score_turn(score, t, [d for _, d in made], t["user"])
                done[0] += 1
                if on_progress is not None:
                    on_progress(done[0], total)

    await asyncio.gather(*(one(c) for c in conversations))
    score.seconds = time.perf_counter() - started
    score.calls = calls[0]
    score.tokens = _tokens(*clients)
    return {"extractor": settings.extractor, "model": getattr(clients[0], "model_id", settings.extractor),
            "dataset": str(dataset), "conversations": len(conversations), **score.report()}


def render(reports: list[dict[str, Any]]) -> str:
    keys = ("turns", "facts_stored", "precision", "recall", "junk_rate", "wrong_subject_rate", "decision_accuracy",
            "edge_precision", "edge_recall", "llm_calls_per_turn", "tokens_per_turn", "seconds_per_turn",
            "turns_given_up", "guard_refused", "guard_refused_labelled_facts")
    head = f"{'':<22}" + "".join(f"{r['model'][:24]:>26}" for r in reports)
    lines = [head] + [f"{k:<22}" + "".join(f"{str(r[k]):>26}" for r in reports) for k in keys]
    for r in reports:
        lines.append(f"\n{r['model']}: junk by trap {r['junk_by_trap']}")
    return "\n".join(lines)


def run(settings, extractors: list[str], dataset: Path = DATASET, limit: int | None = None, on_progress=None,
        parallel: int = 1) -> list[dict[str, Any]]:
    from memstream.embedding import embedder_for

    embedder = embedder_for(settings)  # one for every extractor: the same vectors, loaded once
    out = []
    for name in extractors:
        s = settings.model_copy(update={"extractor": name})
        out.append(asyncio.run(evaluate(s, dataset, limit=limit, embedder=embedder, on_progress=on_progress,
                                        parallel=parallel)))
    return out
