"""Token budgets per section, counted with the embedder's WordPiece tokenizer (offline)."""
from __future__ import annotations

import hashlib
import re
from typing import Callable, Sequence, TypeVar

from tokenizers import Tokenizer

from memstream.read_client.excerpts import MIN_EXCERPT_TOKENS, excerpt, query_words, shares
from memstream.read_settings import Budgets  # noqa: F401 (re-exported)

T = TypeVar("T")

# BERT's normalizer drops control characters other than tab, newline and carriage return.
_CONTROLS = {c: None for c in (*range(32), 127) if chr(c) not in "\t\n\r"}
# BERT's pre-tokenizer on lower-cased ASCII: runs of letters and digits, and every other
# printable character (all ASCII punctuation to BERT) on its own.
_ASCII_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")
_WORD_CACHE = 65536
_TEXT_CACHE = 8192


class TokenCounter:
    """Counts WordPiece tokens exactly as ``Tokenizer.encode(text, add_special_tokens=False)``.

    A full ``encode`` is costly (it builds the ``Encoding``), and a heavy read counts dozens of new
    texts. WordPiece works word by word after BERT's normaliser and pre-tokeniser, so an
    ASCII text's count is the sum of its words' counts, each word counted once; other texts take
    the full ``encode``."""

    def __init__(self, path: str | None = None):
        from memstream.embedding import TOKENIZER_PATH

        self._tok = Tokenizer.from_file(str(path or TOKENIZER_PATH))
        self._tok.no_truncation()
        self._tok.no_padding()
        self._model = self._tok.model
        self._words: dict[str, int] = {}
        self._texts: dict[bytes, int] = {}

    def count(self, text: str) -> int:
        # A user's facts and episodes come back read after read: count each text once. Held by
        # its digest, not its text: a reader keeps no one's sentences (only single words, above).
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        n = self._texts.get(key)
        if n is None:
            if len(self._texts) >= _TEXT_CACHE:
                self._texts.clear()
            n = self._texts[key] = self._count(text)
        return n

    def _count(self, text: str) -> int:
        if not text.isascii():
            return self.encoded(text)
        n, words = 0, self._words
        for word in _ASCII_WORD.findall(text.translate(_CONTROLS).lower()):
            c = words.get(word)
            if c is None:
                if len(words) >= _WORD_CACHE:
                    words.clear()
                c = words[word] = len(self._model.tokenize(word))
            n += c
        return n

    def encoded(self, text: str) -> int:
        """The reference count: the tokenizer's whole pipeline."""
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


def pack_episodes(episodes: Sequence, spans: dict, message: str, budget: int, counter: TokenCounter,
                  line: Callable[[object], str]) -> tuple[list, int]:
    """``episodes`` (ranked ``RankedEpisode``s) within ``budget`` tokens of ``line``s: each kept
    whole if it fits its fair share (``excerpts.shares``), else cut to its best passage
    (``spans``: the matched passage's characters by episode id, where the vector search found
    one). An episode whose share would be under ``MIN_EXCERPT_TOKENS`` is left out, leaving its
    share to the others. Returns the kept episodes in rank order and the tokens they use."""
    items = list(episodes)
    sizes = [counter.count(line(e)) for e in items]
    while items:
        cap = shares(sizes, budget)
        if cap >= MIN_EXCERPT_TOKENS or all(s <= cap for s in sizes):
            break
        drop = max(range(len(items)), key=lambda i: (sizes[i], i))  # the longest, latest on ties
        del items[drop], sizes[drop]
    words = query_words(message)
    kept, used = [], 0
    for e, size in zip(items, sizes):
        if size > cap:
            e = _cut_to(e, spans.get(e.episode_id), words, cap, counter, line)
            if e is None:
                continue
            size = counter.count(line(e))
        kept.append(e)
        used += size
    return kept, used


def _cut_to(e, span, words: set[str], cap: int, counter: TokenCounter, line):
    """``e`` as its best passage whose line fits ``cap`` tokens, or None if none does."""
    text = f"{e.user_message}\n{e.assistant_message}"
    split = len(e.user_message)
    room = cap - counter.count(line(e.model_copy(update={"user_message": "", "assistant_message": "x"})))
    while room > 0:
        a, b = excerpt(text, span, words, room, counter.count)
        user, assistant = text[a:min(b, split)], text[max(a, split + 1):b]
        cut = e.model_copy(update={"user_message": user, "assistant_message": assistant, "excerpt": (a, b)})
        over = counter.count(line(cut)) - cap
        if over <= 0:
            return cut
        room -= over
    return None
