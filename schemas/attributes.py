"""What a fact's ``attribute`` means for every part that reads it: formation (an UPDATE
supersedes), the profile and the read path (one current value per single-valued slot)."""
from __future__ import annotations

# Attributes holding one value at a time: a new value supersedes the old one. Every
# ``favourite_*`` attribute does too (one favourite book at a time).
SINGLE_VALUED = frozenset({"name", "home", "origin", "employer", "role", "diet", "age", "partner"})


def single_valued(attribute: str) -> bool:
    return attribute in SINGLE_VALUED or attribute.startswith("favourite_")
