"""How a fact weakens with time (the decay policy): which facts decay at all, how fast, and what
holds them up. Pure: a sweep computes strengths with it at its own recorded time
(``streams.ops.sweep``), and formation asks it which facts a mention may bring back.

``strength = clamp(confidence * exp(-rate * idle_days) + 0.05 * (observations - 1) + 0.025 * uses, 0, 1)``
— seed 004's formula, with the fact's confidence as its salience and each further observation
holding it up as a use does, twice as much (the user said it; the host only used it).
``idle_days`` runs from the last time the fact was said or used. A fact below ``threshold`` is
archived.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from memstream.schemas.vocabulary import single_valued

POLICY = "decay-v1"

# Per day. Who the user is and what they must not be given never fade, nor does a slot with one
# current value (where they live, work, their role: the profile); preferences and relationships
# fade over years, plans and passing detail over months.
RATES = {"preference": 0.002, "relationship": 0.002, "location": 0.004, "work": 0.004, "plan": 0.01, "other": 0.01}
NEVER = frozenset({"identity", "constraint"})
OBSERVATION_WEIGHT = 0.05
USE_WEIGHT = 0.025


def rate(category: str, attribute: str) -> float:
    """Decay per day of a fact of ``category`` filling ``attribute``; 0: it never decays."""
    if category in NEVER or single_valued(attribute):
        return 0.0
    return RATES.get(category, RATES["other"])


def decays(category: str, attribute: str) -> bool:
    return rate(category, attribute) > 0


@dataclass(frozen=True)
class Weighed:
    strength: float
    idle_days: float
    rate: float


def strength(*, category: str, attribute: str, confidence: float, observations: int, uses: int,
             idle_days: float) -> Weighed:
    r = rate(category, attribute)
    if r == 0:
        return Weighed(1.0, max(0.0, idle_days), 0.0)
    idle = max(0.0, idle_days)
    s = confidence * math.exp(-r * idle) + OBSERVATION_WEIGHT * max(0, observations - 1) + USE_WEIGHT * uses
    return Weighed(min(1.0, max(0.0, s)), idle, r)
