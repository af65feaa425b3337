"""The offline reflection model: deterministic, no network — for the demo, the tests and
deployments without a model. It says what a cluster of facts shares by listing them: no
inference, so nothing it writes goes beyond its sources (a model's sentence is checked for that
by formation, ``streams.worker.formation.reflections``)."""
from __future__ import annotations

from typing import Sequence

from memstream.llm.protocols import Reflection
from memstream.schemas.facts import FactContent

MAX_LISTED = 6  # a longer cluster is cited whole but summed up by its first few


class OfflineReflector:
    model_id = "offline-reflect-v1"
    prompt_version = "offline-reflect-v1"

    async def reflect(self, facts: Sequence[FactContent]) -> Reflection:
        said = list(dict.fromkeys(_clause(f.text) for f in facts))
        listed = said[:MAX_LISTED] + ([f"{len(said) - MAX_LISTED} more"] if len(said) > MAX_LISTED else [])
        text = "Keeps coming back to one theme: " + "; ".join(listed) + "."
        return Reflection(text, tuple(range(len(facts))))


def _clause(text: str) -> str:
    text = text.strip().rstrip(".!")
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text  # "Likes x" -> "likes x"; "I" stays
