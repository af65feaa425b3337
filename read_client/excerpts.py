"""Episodes that fit a section's budget: whole where they can be, else their best passage.

Pure functions: no I/O. A long turn (a pasted document, an assistant's long answer) would fill
the episodes budget alone, and the ``k`` episodes a host asked for would become one or two. The
budget is shared out instead (``shares``): every episode keeps its whole text if it fits an equal
share of what the shorter ones leave, and the rest get that share each, as the passage of their
text that best matches the message (``excerpt``): the passage the vector search matched, narrowed
to the share by the message's words, or, for an episode found by its words alone, the run of
sentences holding the most of them.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

# An excerpt shorter than this says too little to be worth its place: below it, an episode that
# cannot fit whole is left out (as before excerpts), and a later one may fit.
MIN_EXCERPT_TOKENS = 24
_WORD = re.compile(r"\w+")
# Sentence ends (Latin and CJK) and line breaks: the units an excerpt is cut along.
_PIECE = re.compile(r"[^\n.!?。！？；]*(?:[.!?。！？；]+|\n+|$)")
# Without a matched passage, an excerpt is looked for this many times its length around the
# message's first word in the text, not through a pasted book.
_REACH = 16
_CHARS_PER_TOKEN = 4


_COMMON = frozenset("""
a an the and or but if of to in on at by for with about from as into than then so is are was were be been am
do did does have has had i me my mine you your we our they them their he she his her it its this that these
those what which who whom whose when where why how can could would should will shall may might must not no
any some all there here just also very more most tell remember said say know please
""".split())


def query_words(message: str) -> set[str]:
    """The message's words an excerpt should hold: lower-cased, without the commonest ones."""
    return {w for w in (m.lower() for m in _WORD.findall(message)) if w not in _COMMON}


def shares(sizes: Sequence[int], budget: int) -> int:
    """The largest cap ``c`` such that ``sum(min(size, c)) <= budget``: items at most ``c`` stay
    whole, longer ones are cut to ``c`` (max-min fair: a short item never pays for a long one)."""
    if sum(sizes) <= budget:
        return max(sizes, default=0)
    left, n = budget, len(sizes)
    for i, size in enumerate(sorted(sizes)):
        if size * (n - i) > left:
            return left // (n - i)
        left -= size
    return budget


def pieces(text: str) -> list[tuple[int, int]]:
    """The character spans of ``text``'s sentences and lines, in order, covering it."""
    out = []
    for m in _PIECE.finditer(text):
        if m.end() > m.start():
            out.append((m.start(), m.end()))
    return out


def excerpt(text: str, span: tuple[int, int] | None, words: set[str], limit: int,
            count: Callable[[str], int]) -> tuple[int, int]:
    """The characters of ``text`` to show in ``limit`` tokens (by ``count``): within ``span``
    (the matched passage) if given, the run of whole sentences holding the most of ``words``
    (lower-case), earliest first on ties; a first sentence longer than ``limit`` is cut at a word
    boundary. Deterministic."""
    lo, hi = span if span is not None else _around(text, words, limit)
    parts = [(lo + a, lo + b) for a, b in pieces(text[lo:hi])] or [(lo, hi)]
    sizes = [count(text[a:b]) for a, b in parts]
    hits = [len(words.intersection(w.lower() for w in _WORD.findall(text[a:b]))) for a, b in parts]
    best, best_hits = None, -1
    j, used, got = 0, 0, 0
    for i in range(len(parts)):  # a window of whole pieces [i, j) within the limit, for each start
        if j < i:
            j, used, got = i, 0, 0
        while j < len(parts) and used + sizes[j] <= limit:
            used += sizes[j]
            got += hits[j]
            j += 1
        if j > i and got > best_hits:
            best, best_hits = (parts[i][0], parts[j - 1][1]), got
        if j > i:
            used -= sizes[i]
            got -= hits[i]
    top = max(range(len(parts)), key=lambda n: (hits[n], -n))
    if best is None or hits[top] > best_hits:  # the best piece does not fit whole: its start, cut
        start = parts[top][0]
        best = start, _cut(text, start, hi, limit, count)
    return _trimmed(text, *best)


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end - 1 and text[start].isspace():
        start += 1
    while end > start + 1 and text[end - 1].isspace():
        end -= 1
    return start, end


def _around(text: str, words: set[str], limit: int) -> tuple[int, int]:
    """Where to look for an excerpt of ``limit`` tokens: around the first of ``words`` in ``text``."""
    reach = _REACH * limit * _CHARS_PER_TOKEN
    if len(text) <= reach:
        return 0, len(text)
    first = next((m.start() for m in _WORD.finditer(text) if m.group(0).lower() in words), 0)
    start = max(0, min(first - reach // 4, len(text) - reach))
    return start, start + reach


def _cut(text: str, start: int, end: int, limit: int, count: Callable[[str], int]) -> int:
    """The end of the longest run of whole words from ``start`` within ``limit`` tokens; of
    characters, when not one whole word fits (a script written without spaces: one "word")."""
    ends = [m.end() for m in _WORD.finditer(text, start, end)]
    n = _most(len(ends), lambda i: count(text[start:ends[i - 1]]) <= limit)
    if n:
        return ends[n - 1]
    n = _most(end - start, lambda i: count(text[start:start + i]) <= limit)
    return start + max(n, 1)


def _most(n: int, fits: Callable[[int], bool]) -> int:
    """The largest ``i`` in 0..n with ``fits(i)`` (``fits`` true up to some point, then false)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
