"""Token budgets per section, counted with the embedder's WordPiece tokenizer (offline)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence, TypeVar

from tokenizers import Tokenizer

T = TypeVar("T")


@dataclass(frozen=True)
class Budgets:
    """Independent token budgets; due reminders are a time filter, not budget-packed."""

    facts: int = 300
    episodes: int = 600
    edges: int = 200


class TokenCounter:
    def __init__(self, path: str | None = None):
        from memstream.embedding import minilm

        self._tok = Tokenizer.from_file(str(path or minilm._TOKENIZER))
        self._tok.no_truncation()
        self._tok.no_padding()
        # A user's facts and episodes come back read after read: count each text once.
        self.count = lru_cache(maxsize=8192)(self._count)

    def _count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


def pack(items: Sequence[T], text: Callable[[T], str], budget: int, counter: TokenCounter) -> tuple[list[T], int]:
    """Keep items in rank order while they fit; an item too large is skipped, smaller later ones
    may still fit. Returns the kept items and the tokens they use."""
    kept, used = [], 0
    for item in items:
        n = counter.count(text(item))
        if used + n <= budget:
            kept.append(item)
            used += n
    return kept, used
