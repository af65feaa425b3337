"""Rank fusion and the deterministic rerank. Pure functions: no I/O, no clock."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

RRF_K = 60  # the usual reciprocal-rank-fusion constant (Cormack et al., 2009)


@dataclass(frozen=True)
class Weights:
    relevance: float = 0.8
    recency: float = 0.2
    recency_half_life_days: float = 30.0


@dataclass
class Candidate:
    key: Any
    row: Mapping[str, Any]
    rrf: float = 0.0
    channels: list[str] = field(default_factory=list)


def fuse(channels: Mapping[str, Sequence[Mapping[str, Any]]], key: str) -> list[Candidate]:
    """Reciprocal rank fusion: each channel's ranked list contributes 1/(RRF_K + rank)."""
    merged: dict[Any, Candidate] = {}
    for name, rows in channels.items():
        for rank, row in enumerate(rows, start=1):
            cand = merged.setdefault(row[key], Candidate(row[key], row))
            cand.rrf += 1.0 / (RRF_K + rank)
            cand.channels.append(name)
    return list(merged.values())


def recency_decay(occurred_at: datetime, now: datetime, half_life_days: float) -> float:
    age_days = max((now - occurred_at).total_seconds(), 0.0) / 86400.0
    return math.pow(0.5, age_days / half_life_days)


def rerank(cands: list[Candidate], now: datetime, w: Weights, n_channels: int) -> list[tuple[Candidate, float, float, float]]:
    """``score = w_rel * relevance + w_rec * recency``; relevance is the fused rank score scaled
    to [0, 1] by the best possible (first in every channel). Ties break on newer, then id, so
    the order is total and stable."""
    best = n_channels / (RRF_K + 1)
    scored = []
    for c in cands:
        rel = c.rrf / best if best else 0.0
        rec = recency_decay(c.row["occurred_at"], now, w.recency_half_life_days)
        scored.append((c, w.relevance * rel + w.recency * rec, rel, rec))
    scored.sort(key=lambda s: (-s[1], -s[0].row["occurred_at"].timestamp(), str(s[0].key)))
    return scored
