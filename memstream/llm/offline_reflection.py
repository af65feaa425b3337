"""The offline reflection model: deterministic, no network — for the demo, the tests and
deployments without a model. It says what a cluster of memories shares by listing them: no
inference, so nothing it writes goes beyond its sources (a model's sentence is checked for that
by formation, ``streams.worker.formation.reflections``)."""
from __future__ import annotations

import re
from typing import Sequence

from memstream.llm.protocols import Reflection

MAX_LISTED = 6  # a longer cluster is cited whole but summed up by its first few ("and more": no count, which no source says)
MAX_WORDS = 12  # a memory is listed by its first sentence that says something, cut to this many words
MIN_WORDS = 4  # shorter sentences ("Wow!", "Thanks, Maria.") say nothing: the next one is listed

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


class OfflineReflector:
    model_id = "offline-reflect-v1"
    prompt_version = "offline-reflect-v2"

    async def reflect(self, memories: Sequence[str]) -> Reflection:
        said = list(dict.fromkeys(_clause(m) for m in memories))
        listed = said[:MAX_LISTED] + (["and more"] if len(said) > MAX_LISTED else [])
        text = "Keeps coming back to one theme: " + "; ".join(listed) + "."
        return Reflection(text, tuple(range(len(memories))))


def _clause(text: str) -> str:
    sentences = _SENTENCE_END.split(text.strip())
    text = next((s for s in sentences if len(s.split()) >= MIN_WORDS), sentences[0])
    words = text.split()
    text = " ".join(words[:MAX_WORDS]) + (" ..." if len(words) > MAX_WORDS else "")
    text = text.strip().rstrip(".!?")
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text  # "Likes x" -> "likes x"; "I" stays
