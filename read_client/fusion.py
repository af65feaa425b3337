"""Rank fusion and the deterministic rerank. Pure functions: no I/O, no clock."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from memstream.read_settings import EPISODE_WEIGHTS, FACT_WEIGHTS, KEYWORD_SHARE, Weights  # noqa: F401 (re-exported)

TYPE_WEIGHTS = {"identity": 1.0, "constraint": 1.0, "relationship": 0.8, "location": 0.8, "work": 0.8,
                "preference": 0.7, "plan": 0.7}


@dataclass
class Candidate:
    key: Any
    row: Mapping[str, Any]
    fused: float = 0.0  # relevance in [0, 1]
    channels: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Scored:
    cand: Candidate
    score: float
    relevance: float
    recency: float
    importance: float = 0.0
    type: float = 0.0


def fuse(channels: Mapping[str, Sequence[Mapping[str, Any]]], key: str, *,
         keyword_share: float = KEYWORD_SHARE, raw_similarity: bool = False) -> list[Candidate]:
    """Convex fusion of the ``vector`` and ``keyword`` channels' own scores: keyword BM25
    (``rank``) divided by its best row, vector cosine similarity (``1 - distance``) as it is with
    ``raw_similarity``, else min-max scaled over its rows. A row a channel did not return scores 0
    there. Unlike rank fusion, a channel's weak matches stay weak (a vector top 20 always has 20
    rows); unscaled, a read whose best vector match is far scores it low too.
    A channel that returned no rows at all leaves its share to the other: otherwise a message whose
    words match nothing would give its best vector match a relevance of 0.3, and recency would
    outrank relevance."""
    share = {"keyword": keyword_share, "vector": 1.0 - keyword_share}
    found = [name for name, rows in channels.items() if rows]
    if len(found) == 1:
        share[found[0]] = 1.0
    merged: dict[Any, Candidate] = {}
    for name, rows in channels.items():
        if name == "keyword":
            best = max((float(r["rank"]) for r in rows), default=0.0)
            scores = [float(r["rank"]) / best if best > 0 else 0.0 for r in rows]
        elif name == "vector":
            sims = [1.0 - float(r["distance"]) for r in rows]
            lo, hi = (min(sims), max(sims)) if sims else (0.0, 0.0)
            scores = sims if raw_similarity else [(x - lo) / (hi - lo) if hi > lo else 1.0 for x in sims]
        else:
            raise ValueError(f"unknown channel {name!r}: 'vector' or 'keyword'")
        for row, score in zip(rows, scores):
            cand = merged.setdefault(row[key], Candidate(row[key], row))
            cand.fused += share[name] * score
            cand.channels.append(name)
    return list(merged.values())


def latest_per_slot(cands: list[Candidate], single_valued: Callable[[str], bool]) -> list[Candidate]:
    """Fact candidates with one version per lineage and one fact per single-valued attribute:
    the latest recorded, carrying the best relevance of those it replaces (the message matched
    that slot). A read's channels run on separate connections, so one statement can see a
    version that another, a moment later, sees superseded: without this a context could say
    the user lives in Porto and in Lisbon. Order otherwise kept."""
    def latest(group: list[Candidate]) -> Candidate:
        best = max(group, key=lambda c: (c.row["recorded_at"], c.row["version"], str(c.key)))
        best.fused = max(c.fused for c in group)
        return best

    def by(key: Callable[[Candidate], Any], cands: list[Candidate]) -> list[Candidate]:
        groups: dict[Any, list[Candidate]] = {}
        for n, c in enumerate(cands):
            groups.setdefault(key(c) if key(c) is not None else n, []).append(c)
        kept = {id(latest(g)) for g in groups.values()}
        return [c for c in cands if id(c) in kept]

    cands = by(lambda c: ("lineage", c.row["lineage_id"]), cands)
    return by(lambda c: ("slot", c.row["attribute"]) if single_valued(c.row["attribute"]) else None, cands)


def asks(episode: Mapping[str, Any]) -> bool:
    """The turn ends on a question: its last non-empty message ends with a question mark (ASCII or
    full-width, as in Chinese and Japanese)."""
    return (episode["assistant_message"] or episode["user_message"] or "").rstrip().endswith(("?", "\uff1f"))


def with_neighbours(cands: list[Candidate], neighbours: Sequence[Mapping[str, Any]], key: str,
                    share: float, reply_share: float) -> list[Candidate]:
    """Episodes adjacent to a candidate (rows naming it in ``anchor``; ``next`` for the turn
    after it) inherit ``share`` of its relevance, or ``reply_share`` for the turn after one that
    asks a question, unless their own is higher. In a dialogue the answer is the turn after the
    question that matched ("What's your fave style?" -> "Contemporary!")."""
    own = {c.key: c.fused for c in cands}  # what anchors pass on: their own relevance, in any order
    by_key = {c.key: c for c in cands}
    out = list(cands)
    for row in neighbours:
        if row["anchor"] not in own:
            continue
        reply = row["next"] and asks(by_key[row["anchor"]].row)
        rel = (reply_share if reply else share) * own[row["anchor"]]
        cand = by_key.get(row[key])
        if cand is None:
            cand = by_key[row[key]] = Candidate(row[key], row)
            out.append(cand)
        if rel > cand.fused:
            cand.fused = rel
            if "neighbour" not in cand.channels:
                cand.channels.append("neighbour")
    return out


def recency_decay(at: datetime, now: datetime, half_life_days: float) -> float:
    age_days = max((now - at).total_seconds(), 0.0) / 86400.0
    return math.pow(0.5, age_days / half_life_days)


def fact_importance(row: Mapping[str, Any]) -> float:
    """Confidence, plus a little for every repeated observation (saturating)."""
    seen = min(1.0, math.log2(1 + row["observation_count"]) / 3)
    return 0.7 * float(row["confidence"]) + 0.3 * seen


def fact_type(row: Mapping[str, Any]) -> float:
    return TYPE_WEIGHTS.get(row["category"], 0.5)


def rerank(cands: list[Candidate], now: datetime, w: Weights, *, time_key: str = "occurred_at",
           importance: Callable[[Mapping[str, Any]], float] | None = None,
           type_weight: Callable[[Mapping[str, Any]], float] | None = None) -> list[Scored]:
    """Relevance is the fused score. Ties break on newer, then key, so the order is total and stable."""
    out = []
    for c in cands:
        rel = c.fused
        rec = recency_decay(c.row[time_key], now, w.recency_half_life_days)
        imp = importance(c.row) if importance else 0.0
        typ = type_weight(c.row) if type_weight else 0.0
        score = w.relevance * rel + w.recency * rec + w.importance * imp + w.type * typ
        out.append(Scored(c, score, rel, rec, imp, typ))
    out.sort(key=lambda s: (-s.score, -s.cand.row[time_key].timestamp(), str(s.cand.key)))
    return out


HOP_DISCOUNT = 0.5  # an expanded edge scores at most half its best connected direct match


def rank_edges(rows: Sequence[Mapping[str, Any]], k: int) -> list[tuple[float, int, Mapping[str, Any]]]:
    """The best ``k`` of the direct matches (``hop`` 0, scored by similarity) and the one-hop
    expansion around their entities (``hop`` 1), as ``(score, hop, row)``. An expanded edge is
    reranked, not equally relevant: bounded by the best direct match it is connected to, plus a
    share of its own similarity."""
    direct, hops = [r for r in rows if r["hop"] == 0], [r for r in rows if r["hop"] == 1]
    scored = [(1.0 - float(r["distance"]), 0, r) for r in direct]
    best_via: dict[Any, float] = {}
    for r in direct:
        for e in (r["source_entity_id"], r["target_entity_id"]):
            if e is not None:
                best_via[e] = max(best_via.get(e, 0.0), 1.0 - float(r["distance"]))
    for r in hops:
        via = max(best_via.get(r["source_entity_id"], 0.0), best_via.get(r["target_entity_id"], 0.0))
        scored.append((HOP_DISCOUNT * via * (0.5 + 0.5 * max(0.0, 1.0 - float(r["distance"]))), 1, r))
    # Rounded as RankedEdge rounds it, so the order is the one its fields show.
    scored.sort(key=lambda t: (-round(t[0], 6), t[1], str(t[2]["edge_id"])))
    return scored[:k]
