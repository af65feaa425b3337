"""Shared by the peer benchmarks: the user split and the percentile summary."""
from __future__ import annotations

import numpy as np

HEAVY = "heavy"
K = 10  # results asked for per search


def users_plan(rows: int, heavy: int, users: int) -> list[tuple[str, int]]:
    """(user, rows): the heavy user first, the rest of ``rows`` spread over ``users - 1`` fillers."""
    fillers = max(1, users - 1)
    per, extra = divmod(max(0, rows - heavy), fillers)
    return [(HEAVY, heavy)] + [(f"user-{i:05d}", per + (i < extra)) for i in range(fillers)]


def pcts(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    out = {q: round(float(np.percentile(a, p)), 2) for q, p in (("p50", 50), ("p95", 95), ("p99", 99))}
    return out | {"n": len(values)}


def interleaved(plan: list[tuple[str, int]], n_texts: int, seed: int = 11) -> tuple[list[str], np.ndarray]:
    """Every row's owner and corpus text index, users interleaved in a fixed random order (rows
    arrive over time from all users, so the heavy user is not one contiguous block)."""
    rng = np.random.default_rng(seed)
    owners = np.repeat(np.arange(len(plan)), [n for _, n in plan])
    rng.shuffle(owners)
    return [plan[o][0] for o in owners], rng.integers(0, n_texts, len(owners))
