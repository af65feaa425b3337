"""``eval formation``'s labelled set and its scoring: the set is what its docs say (its size, each
trap at least 20 times, values in the user's own words, canonical relations), and a stored fact
counts as found, as junk, or as someone else's by its value and slot."""
from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timezone

from memstream.bench.formation_eval import DATASET, Score, same_slot, same_value, score_turn
from memstream.schemas import FactAdded, FactRefused, LogPosition
from memstream.schemas.vocabulary import canonical

TRAPS = ("other_person", "question", "request", "hypothetical", "sarcasm", "joke", "echo", "prompt", "correction",
         "negated", "forget_request", "relative_date", "assistant_only", "multi_fact")


def test_the_labelled_set_is_what_its_docs_say():
    data = json.loads(DATASET.read_text())
    turns = [t for c in data["conversations"] for t in c["turns"]]
    assert len(data["conversations"]) >= 30 and len(turns) >= 300
    traps = Counter(k for t in turns for k in t["traps"])
    assert all(traps[k] >= 20 for k in TRAPS), traps
    for t in turns:
        assert {f["op"] for f in t["facts"]} <= {"ADD", "UPDATE", "DELETE", "NOOP"}
        assert all(canonical(e["relation"]) == e["relation"] for e in t["edges"])
    said = [(t["user"].casefold(), f["value"].casefold()) for t in turns for f in t["facts"] if f["op"] == "ADD"]
    assert sum(v in u for u, v in said) / len(said) > 0.95  # values are the user's own words


def decision(kind, value: str, attribute: str = "home", **extra):
    common = dict(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), source=LogPosition("e", 0, 0),
                  recorded_at=datetime(2026, 1, 1, tzinfo=timezone.utc), user_id="u", extractor="x", resolver="y",
                  reason="r", confidence=0.9, explicit=True)
    if kind is FactRefused:
        return FactRefused(**common, text=value, category="location", attribute=attribute, value=value,
                           refusal=extra.get("refusal", "other_person"))
    return FactAdded(**common, fact_id=uuid.uuid4(), text=value, category="location", attribute=attribute, value=value,
                     valid_from=datetime(2026, 1, 1, tzinfo=timezone.utc), embedding=b"\0" * 16, embedding_model="m")


def test_a_stored_fact_is_found_or_junk_and_junk_about_someone_else_is_the_wrong_subject():
    label = {"facts": [{"attribute": "home", "value": "Lisbon", "op": "ADD"}], "edges": [], "traps": ["other_person"],
             "must_not": [{"attribute": "home", "value": "Oslo", "why": "other_person"}]}
    score = Score()
    score_turn(score, label, [decision(FactAdded, "Lisbon, Portugal", "city"), decision(FactAdded, "Oslo"),
                              decision(FactRefused, "Lisbon")], "I live in Lisbon; my brother lives in Oslo.")
    r = score.report()
    assert (r["facts_stored"], r["precision"], r["recall"], r["junk_rate"], r["wrong_subject_rate"]) == (2, 0.5, 1.0,
                                                                                                       0.5, 0.5)
    assert r["decision_accuracy"] == 1.0 and r["guard_refused"] == 1 and r["guard_refused_labelled_facts"] == 1
    assert r["junk_by_trap"] == {"other_person": 1}


def test_values_and_slots_match_as_people_write_them():
    assert same_value("Lisbon", "lisbon.") and same_value("Lisbon", "Lisbon, Portugal") and not same_value("Li", "Lima")
    assert same_slot("home", "lives_in") and same_slot("employer", "works_at") and not same_slot("home", "employer")
