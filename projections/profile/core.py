"""Tier 1, the pure core: a small, always-injected profile built from a user's current facts."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from memstream.projections import cache_keys
from memstream.schemas.vocabulary import SINGLE_VALUED
_LISTS = {"allergy": "allergies", "likes": "likes", "dislikes": "dislikes", "pet": "pets"}
_FAMILY = ("daughter", "son", "sister", "brother", "mother", "mom", "mum", "father", "dad", "friend",
           "grandmother", "grandfather")
LIST_LIMIT = 5


def build_profile(facts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``facts``: current fact rows (attribute, value, text, category, observation_count,
    recorded_at). Deterministic for a given set: lists are ordered by how often the fact was
    observed, then when it was first recorded, then value."""
    rows = sorted(facts, key=lambda f: (-f["observation_count"], f["recorded_at"], f["value"]))
    profile: dict[str, Any] = {}
    for f in rows:
        attr, value = f["attribute"], f["value"]
        if attr in SINGLE_VALUED:
            profile.setdefault(attr, value)
        elif attr in _LISTS:
            items = profile.setdefault(_LISTS[attr], [])
            if len(items) < LIST_LIMIT and value not in items:
                items.append(value)
        elif attr.startswith("favourite_"):
            profile.setdefault("favourites", {}).setdefault(attr.removeprefix("favourite_").replace("_", " "), value)
        elif attr in _FAMILY:
            names = profile.setdefault("family", {}).setdefault(attr, [])
            if value not in names:
                names.append(value)
        elif f["category"] == "plan":
            plans = profile.setdefault("plans", [])
            if len(plans) < LIST_LIMIT:
                plans.append(f["text"])
    return profile


def profile_key(schema: str, epoch: int, user_id: str) -> str:
    """The profile's Redis key; the epoch changes with a rebuild, so a stale cache is never read."""
    return cache_keys.key(schema, epoch, "t1", user_id)
