"""What a fact says, declared once for every holder of it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FactContent:
    """What a fact says, the same wherever it is held: the extractor's candidate, the facts
    projection's row, the read model. ``text`` reads as a sentence ("Lives in Lisbon");
    ``category`` is its kind (identity, location, work, preference, constraint, relationship,
    plan, other); ``attribute`` names the slot it fills (``home``, ``employer``, ``likes``...)
    and ``value`` its value — two facts with one single-valued attribute contradict each other
    (``schemas.vocabulary``); ``confidence`` is in [0, 1]; ``explicit`` is True when the user
    said it outright, False when it was inferred.

    The decisions on the log carry the same names in their msgspec Structs (``FactDecision``,
    ``FactAdded``...): a Struct cannot share a base with other classes, and their shape is the
    wire format."""

    text: str
    category: str
    attribute: str
    value: str
    confidence: float
    explicit: bool
