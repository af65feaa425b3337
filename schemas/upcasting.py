"""Upcasters: pure functions that lift an old record shape one version up.

Register one function per ``(type, from_version)``; ``upcast`` chains them until the record
reaches the version this build writes: a v2 is a new function and a new golden fixture, not a
migration of the log.
"""
from __future__ import annotations

from typing import Any, Callable

Raw = dict[str, Any]
Upcaster = Callable[[Raw], Raw]

_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(type_: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` as the step from ``from_version`` to ``from_version + 1`` of ``type_``."""

    def register(fn: Upcaster) -> Upcaster:
        _UPCASTERS[(type_, from_version)] = fn
        return fn

    return register


def upcast(raw: Raw, target_version: int) -> Raw:
    """Apply registered steps to ``raw`` until it reaches ``target_version``."""
    version = int(raw.get("schema_version", 1))
    while version < target_version:
        step = _UPCASTERS.get((raw["type"], version))
        if step is None:
            raise LookupError(f"no upcaster for {raw['type']} v{version}")
        raw = {**step(raw), "schema_version": version + 1}
        version += 1
    return raw


@upcaster("FactForgotten", 1)
def _fact_forgotten_kept_its_turns(raw: Raw) -> Raw:
    """A v1 forget of a fact left the turns it was read from: decided again (a reform), it still does."""
    return {**raw, "keep_episodes": True}


@upcaster("UserForgotten", 1)
def _user_forgotten_reason_is_a_kind(raw: Raw) -> Raw:
    """A v1 user forget's reason was free text: only whether one was given survives the upcast
    (the text itself stays in the old record on the log, which cannot be rewritten)."""
    return {**raw, "reason": "other" if raw.get("reason") else "unspecified"}
