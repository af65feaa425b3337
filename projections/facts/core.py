"""Facts, the pure core: fold fact decisions into versioned fact rows.

``apply(state, decision)`` returns the rows the decision creates or changes; ``state`` must hold
every row the decision targets (``targets(decision)``) and, for an update, every version of the
fact it supersedes (``lineages``), keyed by ``key`` — ``(user_id, fact_id)``: a decision looks up rows under
its own user only, so it can never touch another user's, even when a host gave two users' turns
one event id (and so the same fact ids). No clock, no I/O: system time is the decision's
``recorded_at`` (the source event's log timestamp). A version never ends before it began
(``valid_to >= valid_from``), whatever the decision says, and the versions of a fact never
overlap in world time; only the current version of a fact is changed (``EndedTarget`` for an
ended one; a forgotten one changes no more). Every decision is idempotent: re-applying a
FactAdded or FactUpdated whose version exists, a FactDeleted of a deleted fact, or a
FactReinforced / FactChangeDeferred already counted, changes nothing.

Formation uses the same ``apply`` on an in-memory overlay, so within one batch a turn sees the
decisions of the turns before it exactly as the projection will.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Iterable, Mapping

from memstream.schemas import (Decision, FactAdded, FactArchived, FactChangeDeferred, FactDecision, FactDeleted,
                               FactReinforced, FactRestored, FactUpdated, MemoryForgotten, ReflectionRecorded)
from memstream.schemas.errors import Refused
from memstream.schemas.facts import FactContent
from memstream.schemas.vocabulary import single_valued


class MissingTarget(Refused, LookupError):
    """A decision names a fact its user does not hold (another user's is not theirs): the
    decisions log is inconsistent."""


class EndedTarget(Refused, ValueError):
    """A decision changes a fact version that already ended (superseded or deleted): two
    decisions ended one version, so the decisions log is inconsistent. Applied, it would leave
    two current versions of one fact, or bring a deleted one back."""


Key = tuple[str, uuid.UUID]


@dataclass(frozen=True)
class FactRow(FactContent):
    """One version of a fact (what it says: ``FactContent``), with its lineage, both time axes,
    observations, safety-gate deferrals and provenance."""

    fact_id: uuid.UUID
    lineage_id: uuid.UUID
    version: int
    user_id: str
    status: str
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    superseded_at: datetime | None
    superseded_by: uuid.UUID | None
    end_reason: str | None
    observation_count: int
    last_observed_at: datetime
    observed_by: tuple[uuid.UUID, ...]
    deferred: Mapping[str, int]
    source_event_id: uuid.UUID
    extractor: str
    resolver: str
    reason: str
    embedding: bytes
    embedding_model: str
    notes: tuple[str, ...] = ()  # e.g. that one of its sources was forgotten
    observed_in: tuple[uuid.UUID, ...] = ()  # the turns (event ids) it was read from, first to last
    derived_from: tuple[uuid.UUID, ...] = ()  # a reflection's source facts: it ends when one of them does
    last_said_at: datetime | None = None  # the last observation's said time (``said``): decay's idle time runs from it
    derived_from_turns: tuple[uuid.UUID, ...] = ()  # a reflection's source turns: forgotten with any of them

    @property
    def current(self) -> bool:
        return self.status == "current"


COLUMNS = tuple(FactRow.__dataclass_fields__)


def key(row: FactRow) -> Key:
    return row.user_id, row.fact_id


def fact_id(source_event_id: uuid.UUID, n: int) -> uuid.UUID:
    return uuid.uuid5(source_event_id, f"fact:{n}")


def targets(decision: Decision) -> list[uuid.UUID]:
    """Fact ids whose rows ``apply`` needs in ``state`` for this decision."""
    if isinstance(decision, FactUpdated):
        return [decision.fact_id, decision.supersedes]
    if isinstance(decision, ReflectionRecorded):
        return [decision.fact_id, *decision.replaces]
    if isinstance(decision, FactAdded):
        return [decision.fact_id]
    if isinstance(decision, (FactDeleted, FactReinforced, FactChangeDeferred, FactArchived, FactRestored)):
        return [decision.target]
    if isinstance(decision, MemoryForgotten) and decision.kind == "fact":
        return [decision.target]
    return []


# A turn's fact decisions are uuid5(event_id, "fact:<n>"): formation decides at most this many
# candidates of a turn, so forgetting the turn names every fact it made or observed.
MAX_CANDIDATES = 64


def turn_decisions(event_id: uuid.UUID) -> list[uuid.UUID]:
    """The ids a turn's fact decisions can have: how a fact's ``observed_by`` names the turns behind it."""
    return [fact_id(event_id, n) for n in range(MAX_CANDIDATES)]


def lineages(state: Mapping[Key, FactRow], decision: Decision) -> list[tuple[str, uuid.UUID]]:
    """``(user_id, lineage_id)`` whose every version ``apply`` needs in ``state`` as well, once
    ``targets`` are there: an update ends the older versions of its fact it overlaps."""
    old = state.get((decision.user_id, decision.supersedes)) if isinstance(decision, FactUpdated) else None
    return [(old.user_id, old.lineage_id)] if old is not None else []


def slots(decision: Decision) -> list[tuple[str, str]]:
    """``(user_id, attribute)`` whose every version ``apply`` needs in ``state`` as well: a new
    version of a single-valued slot ends the ended versions it overlaps (``_overlapped``)."""
    if isinstance(decision, (FactAdded, FactUpdated)) and single_valued(decision.attribute):
        return [(decision.user_id, decision.attribute)]
    return []


def sources(decision: Decision) -> list[tuple[str, uuid.UUID]]:
    """``(user_id, turn event id)`` whose facts ``apply`` needs in ``state`` as well (a forgotten
    turn: the facts it created or observed, and the reflections drawn from it)."""
    if isinstance(decision, MemoryForgotten) and decision.kind == "episode":
        return [(decision.user_id, decision.target)]
    return []


REFLECTION = "reflection"  # a reflection's category and attribute
HELD = ("current", "archived")  # believed: in the read path, or archived out of it
ENDED = ("superseded", "deleted", "forgotten")


def ends_facts(decision: Decision) -> bool:
    """Whether ``apply`` may end facts: then every reflection of the user drawn from a fact in
    ``state`` must be there as well (it ends with its source)."""
    return isinstance(decision, (FactUpdated, FactDeleted, MemoryForgotten))


def said(d: FactDecision) -> datetime:
    """When the user said what ``d`` observes, as decay counts it: the decision's ``said_at``,
    but never after it reached the log."""
    return d.recorded_at if d.said_at is None else min(d.said_at, d.recorded_at)


def _new(d: FactAdded | FactUpdated | ReflectionRecorded, lineage_id: uuid.UUID, version: int) -> FactRow:
    return FactRow(
        fact_id=d.fact_id, lineage_id=lineage_id, version=version, user_id=d.user_id, text=d.text, category=d.category,
        attribute=d.attribute, value=d.value, confidence=d.confidence, explicit=d.explicit,
        status="current", valid_from=d.valid_from, valid_to=None, recorded_at=d.recorded_at,
        superseded_at=None, superseded_by=None, end_reason=None, observation_count=1,
        last_observed_at=d.recorded_at, observed_by=(d.decision_id,), deferred={},
        observed_in=() if isinstance(d, ReflectionRecorded) else (d.source_event_id,), last_said_at=said(d),
        source_event_id=d.source_event_id, extractor=d.extractor, resolver=d.resolver,
        reason=d.reason, embedding=d.embedding, embedding_model=d.embedding_model,
        derived_from=tuple(d.sources) if isinstance(d, ReflectionRecorded) else (),
        derived_from_turns=tuple(d.turns) if isinstance(d, ReflectionRecorded) else (),
    )


def _target(state: Mapping[Key, FactRow], fid: uuid.UUID, d: Decision) -> FactRow:
    row = state.get((d.user_id, fid))
    if row is None:
        raise MissingTarget(f"{type(d).__name__} {d.decision_id} targets fact {fid}, unknown to its user")
    return row


def _live(state: Mapping[Key, FactRow], fid: uuid.UUID, d: Decision) -> FactRow | None:
    """The current (or archived) version ``d`` changes; None when it was forgotten (it stays so,
    whatever decision comes after: one made before the forget, delivered again)."""
    row = _target(state, fid, d)
    if row.status == "forgotten":
        return None
    if not row.current and row.status != "archived":  # archived: believed still, so it ends as a current one
        raise EndedTarget(f"{type(d).__name__} {d.decision_id} changes fact {fid}, already {row.status}")
    return row


def _forgotten(old: FactRow, d: MemoryForgotten, why: str) -> FactRow:
    return replace(old, status="forgotten", superseded_at=d.recorded_at,
                   valid_to=old.valid_to or max(d.recorded_at, old.valid_from),
                   end_reason=f"{why} by {d.actor}" + (f": {d.reason}" if d.reason else ""))


def _forget(state: Mapping[Key, FactRow], d: MemoryForgotten) -> list[FactRow]:
    if d.kind == "fact":
        old = _target(state, d.target, d)
        return [] if old.status == "forgotten" else [_forgotten(old, d, "forgotten")]
    if d.kind == "user":
        return [_forgotten(r, d, "forgotten with the user") for r in state.values()
                if r.user_id == d.user_id and r.status != "forgotten"]
    if d.kind != "episode":
        return []
    # The facts this turn created or observed: forgotten with it when it is their only evidence
    # (unless ``keep_derived``: the turn goes because another fact of it was forgotten), else they
    # keep a note that one source is gone.
    observed, note = set(turn_decisions(d.target)), f"a source turn ({d.target}) was forgotten by {d.actor}"
    out = []
    for r in state.values():
        if r.user_id == d.user_id and d.target in r.derived_from_turns and r.status != "forgotten":
            # A reflection drawn from the turn's words: it says what the user asked to be
            # forgotten, whatever else it rests on (``keep_derived`` too).
            out.append(_forgotten(r, d, f"a source turn ({d.target}) was forgotten"))
            continue
        if r.user_id != d.user_id or not (r.source_event_id == d.target or observed & set(r.observed_by)):
            continue
        if r.status == "forgotten" and d.keep_derived:
            continue
        if r.source_event_id == d.target and r.observation_count == 1 and not d.keep_derived:
            if r.status != "forgotten":
                out.append(_forgotten(r, d, "forgotten with its only source turn"))
        elif note not in r.notes:
            out.append(replace(r, notes=r.notes + (note,)))
    return out


def apply(state: Mapping[Key, FactRow], d: Decision) -> list[FactRow]:
    changed = _apply(state, d)
    return changed + _derived_ended(state, changed, d) if changed and ends_facts(d) else changed


def _derived_ended(state: Mapping[Key, FactRow], changed: list[FactRow], d: Decision) -> list[FactRow]:
    """The reflections drawn from a fact ``changed`` ends: forgotten with a forgotten source, even
    one that had ended before (what it says rests on what the user asked to be forgotten);
    superseded by any other end of a believed source (a changed source: the next reflection sweep
    may draw a new one)."""
    before = {key(r): state[key(r)].status for r in changed if key(r) in state}
    forgotten = {r.fact_id for r in changed if r.status == "forgotten" and before.get(key(r), "forgotten") != "forgotten"}
    ended = {r.fact_id: r for r in changed if r.status in ENDED and before.get(key(r)) in HELD}
    if not ended and not forgotten:
        return []
    out = []
    for r in state.values():
        if r.user_id != d.user_id or r.category != REFLECTION or r.status == "forgotten" or key(r) in before:
            continue
        if gone := [s for s in r.derived_from if s in forgotten]:
            out.append(replace(r, status="forgotten", superseded_at=d.recorded_at,
                               valid_to=r.valid_to or max(d.recorded_at, r.valid_from),
                               end_reason=f"a source fact ({gone[0]}) was forgotten"))
        elif r.status in HELD and (lost := [ended[s] for s in r.derived_from if s in ended]):
            out.append(replace(r, status="superseded", superseded_at=d.recorded_at,
                               valid_to=max(d.recorded_at, r.valid_from),
                               end_reason=f"a source fact ({lost[0].fact_id}) was {lost[0].status}"))
    return out


def _apply(state: Mapping[Key, FactRow], d: Decision) -> list[FactRow]:
    if isinstance(d, MemoryForgotten):
        return _forget(state, d)
    if not isinstance(d, FactDecision):
        return []
    if isinstance(d, (FactAdded, FactUpdated, ReflectionRecorded)) and (d.user_id, d.fact_id) in state:
        return []  # a redelivery changes nothing
    if isinstance(d, ReflectionRecorded):
        # The reflections it was drawn in place of (on some of the same facts, before the
        # cluster grew) end here, as an update ends the version it supersedes.
        replaced = [replace(old, status="superseded", superseded_at=d.recorded_at, superseded_by=d.fact_id,
                            valid_to=max(d.recorded_at, old.valid_from), end_reason="drawn again from more facts")
                    for t in d.replaces if (old := state.get((d.user_id, t))) is not None and old.status in HELD]
        return [*replaced, _new(d, d.fact_id, 1)]
    if isinstance(d, FactAdded):
        return [*_overlapped(state, d), _new(d, d.fact_id, 1)]
    if isinstance(d, FactUpdated):
        if (old := _live(state, d.supersedes, d)) is None:
            return []
        # An update dated before the old version began ("I moved to Lisbon last week", a minute
        # after "I live in Porto") ends the old one at its own start: an empty interval, never a
        # negative one. Older versions it overlaps ("since March", after Porto until June, then
        # Lisbon) end where it begins too: the latest word on a time holds, one version at a time.
        ended = replace(old, status="superseded", superseded_at=d.recorded_at, superseded_by=d.fact_id,
                        valid_to=old.valid_to or max(d.valid_from, old.valid_from), end_reason=d.reason)
        # A corrected reflection still rests on its sources: it ends with them.
        return [*_overlapped(state, d), ended,
                replace(_new(d, old.lineage_id, old.version + 1), derived_from=old.derived_from,
                        derived_from_turns=old.derived_from_turns)]
    if isinstance(d, FactDeleted):
        if _target(state, d.target, d).status == "deleted" or (old := _live(state, d.target, d)) is None:
            return []
        return [replace(old, status="deleted", superseded_at=d.recorded_at, valid_to=max(d.valid_to, old.valid_from),
                        end_reason=d.reason)]
    if isinstance(d, FactReinforced):
        if d.decision_id in _target(state, d.target, d).observed_by or (old := _live(state, d.target, d)) is None:
            return []
        return [replace(old, observation_count=old.observation_count + 1, last_observed_at=d.recorded_at,
                        last_said_at=_later(old.last_said_at, said(d)),
                        confidence=max(old.confidence, d.confidence), explicit=old.explicit or d.explicit,
                        observed_by=old.observed_by + (d.decision_id,),
                        observed_in=old.observed_in + ((d.source_event_id,) if d.source_event_id not in old.observed_in
                                                       else ()))]
    if isinstance(d, FactArchived):
        # Still believed (no end in either time axis): out of the hot index and the read path only.
        # Its id joins ``observed_by`` (as a deferral's does): delivered again after a restore, it
        # changes nothing.
        row = _target(state, d.target, d)
        if row.status == "archived" or d.decision_id in row.observed_by or (old := _live(state, d.target, d)) is None:
            return []
        return [replace(old, status="archived", observed_by=old.observed_by + (d.decision_id,),
                        notes=old.notes + (f"archived by decay sweep {d.sweep_id} at strength {d.strength:.2f}",))]
    if isinstance(d, FactRestored):
        old = _target(state, d.target, d)
        if old.status != "archived" or d.decision_id in old.observed_by:
            return []  # current again already (a redelivery), or ended or forgotten since
        return [replace(old, status="current", observation_count=old.observation_count + 1,
                        last_observed_at=d.recorded_at, last_said_at=_later(old.last_said_at, said(d)),
                        observed_by=old.observed_by + (d.decision_id,),
                        observed_in=old.observed_in + ((d.source_event_id,) if d.source_event_id not in old.observed_in
                                                       else ()))]
    if isinstance(d, FactChangeDeferred):
        if d.decision_id in _target(state, d.target, d).observed_by or (old := _live(state, d.target, d)) is None:
            return []
        key = deferral_key(d.operation, d.value)
        return [replace(old, deferred={**old.deferred, key: old.deferred.get(key, 0) + 1},
                        observed_by=old.observed_by + (d.decision_id,))]
    return []


def _overlapped(state: Mapping[Key, FactRow], d: FactAdded | FactUpdated) -> list[FactRow]:
    """The ended versions of ``d``'s single-valued slot (any lineage) that held past its start,
    ended where it begins: the latest word on a time holds, one value at a time — the rule the
    graph keeps for a single-valued relation's edges, so the two say the same of every time."""
    if not single_valued(d.attribute):
        return []
    return [replace(r, valid_to=max(d.valid_from, r.valid_from)) for r in state.values()
            if r.user_id == d.user_id and r.attribute == d.attribute and not r.current and r.valid_to is not None
            and r.valid_to > max(d.valid_from, r.valid_from)]


def deferral_key(operation: str, value: str) -> str:
    return f"{operation}:{value.casefold()}"


def fold(state: dict[Key, FactRow], decisions: Iterable[Decision]) -> dict[Key, FactRow]:
    """Apply ``decisions`` in order to ``state`` (mutated) and return the rows that changed."""
    changed: dict[Key, FactRow] = {}
    for d in decisions:
        for row in apply(state, d):
            state[key(row)] = changed[key(row)] = row
    return changed


def _later(a: datetime | None, b: datetime) -> datetime:
    """The later of two said times (turns may arrive out of their own order); None: not known."""
    return b if a is None else max(a, b)
