"""Turn a resolved candidate into a fact decision: near-duplicate merge and the safety gate.

Pure: the inputs are the candidate, its embedding, the resolver's answer and the current rows
it may target; the output is at most one decision. No clock, no I/O.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Mapping

import numpy as np

from memstream.embedding import to_bytes
from memstream.llm.protocols import GATED_CATEGORIES, CandidateFact, ExistingFact, Operation, Resolution
from memstream.projections.facts.core import FactRow, Key, deferral_key
from memstream.schemas.vocabulary import fact_attribute
from memstream.schemas import (Decision, FactAdded, FactChangeDeferred, FactDeleted, FactReinforced,
                               FactUpdated, LogPosition, TurnRecorded)

NEAR_DUPLICATE = 0.85  # cosine at or above which an ADD reinforces the existing fact instead


@dataclass(frozen=True)
class Context:
    """Who is deciding about which turn."""

    turn: TurnRecorded
    source: LogPosition
    recorded_at: datetime
    extractor: str
    resolver: str
    embedding_model: str
    gate_observations: int = 3  # an inferred change to a gated fact needs this many observations


def _names(row: FactRow, cand: CandidateFact) -> bool:
    """Whether a retraction names ``row``: its slot (in memstream's words: "current_city" is "home"),
    and its value if it gives one, whole words of it ("Lisbon" names "Lisbon, Portugal")."""
    if fact_attribute(row.attribute) != fact_attribute(cand.attribute):
        return False
    said, held = (cand.value or "").casefold().strip(), row.value.casefold().strip()
    # Less said than held, not more: "green tea" does not name "tea"; "C++" names "C++".
    return not said or said == held or re.search(rf"(?<!\w){re.escape(said)}(?!\w)", held) is not None


def decide(ctx: Context, n: int, cand: CandidateFact, vector: np.ndarray, resolution: Resolution,
           neighbours: list[ExistingFact], rows: Mapping[Key, FactRow]) -> Decision | None:
    """The decision for the ``n``-th candidate of ``ctx.turn`` (``None``: nothing to record);
    ``rows`` by ``(user_id, fact_id)``, as the facts core keys them."""
    user = ctx.turn.user_id
    fid = uuid.uuid5(ctx.turn.event_id, f"fact:{n}")
    common = dict(
        decision_id=fid, source_event_id=ctx.turn.event_id, source=ctx.source, recorded_at=ctx.recorded_at,
        user_id=ctx.turn.user_id, extractor=ctx.extractor, resolver=ctx.resolver,
        confidence=float(cand.confidence), explicit=cand.explicit, said_at=ctx.turn.occurred_at,
    )
    body = dict(fact_id=fid, text=cand.text, category=cand.category, attribute=cand.attribute, value=cand.value,
                valid_from=cand.valid_at or ctx.turn.occurred_at, embedding=to_bytes(vector),
                embedding_model=ctx.embedding_model)
    known = {n.fact_id for n in neighbours}
    op, target = resolution.op, resolution.target
    if target is not None and (target not in known or (user, target) not in rows):
        # The resolver named a fact it was not shown: do not act on a guess.
        op, target = Operation.ADD, None
        resolution = Resolution(op, None, f"resolver named an unknown target; treated as new ({resolution.reason})")
    if cand.negated and target is not None and op is not Operation.ADD:
        # A retraction ("forget that I live in Lisbon") never reinforces or rewrites a fact: it
        # deletes the one it names, or nothing (not a neighbour the resolver pointed at).
        named = rows[user, target]
        if not _names(named, cand):
            return None
        if op is not Operation.DELETE:
            resolution = Resolution(Operation.DELETE, target,
                                    f"user retracts {named.text!r} (resolver said {op.value}: {resolution.reason})")
            op = Operation.DELETE
    if op is Operation.ADD:
        # A near-duplicate is the same kind of fact said again ("Likes jazz" / "Loves jazz"),
        # not a different kind that happens to read alike ("trip to Berlin" / "move to Berlin").
        top = max((x for x in neighbours if x.category == cand.category), key=lambda x: x.similarity, default=None)
        if top is not None and top.similarity >= NEAR_DUPLICATE and not cand.negated:
            return FactReinforced(**common, target=top.fact_id,
                                  reason=f"near-duplicate of {top.text!r} (cosine {top.similarity:.2f})")
        if cand.negated:
            return None
        return FactAdded(**common, **body, reason=resolution.reason or "new fact")
    if op is Operation.NOOP:
        if target is None:
            return None
        return FactReinforced(**common, target=target, reason=resolution.reason or "observed again")
    old = rows[user, target]
    if old.category in GATED_CATEGORIES and not cand.explicit:
        key = deferral_key(op.value, cand.value)
        seen = old.deferred.get(key, 0) + (fid not in old.observed_by)  # a turn formed again is not seen again
        if seen < ctx.gate_observations:
            return FactChangeDeferred(
                **common, target=target, operation=op.value, value=cand.value, text=cand.text,
                reason=f"safety gate: inferred {op.value} of {old.category} fact {old.text!r} "
                       f"needs an explicit statement or {ctx.gate_observations} observations (seen {seen})")
    if op is Operation.UPDATE:
        return FactUpdated(**common, **body, supersedes=target, reason=resolution.reason or "updated")
    return FactDeleted(**common, target=target, valid_to=max(cand.valid_at or ctx.turn.occurred_at, old.valid_from),
                       reason=resolution.reason or "retracted")
