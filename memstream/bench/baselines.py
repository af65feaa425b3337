"""Plain retrievers scored beside memstream in the same run, over the same units.

A unit is one utterance (one episode), named by its ``dia_id``; every function here returns
unit ids best first, so ``locomo.score`` takes their output exactly as it takes memstream's.
They answer "how much does memstream add over a keyword index, a vector index or both fused",
so they are kept textbook-plain: Okapi BM25, best-chunk cosine and reciprocal rank fusion.
Pure and numpy-only.
"""
from __future__ import annotations

import logging
import math
import re
from collections import Counter
from typing import Iterable, Mapping, Sequence

import numpy as np

log = logging.getLogger("memstream.eval")

_WORD = re.compile(r"\w+")
# The common English function words: they match nearly every unit, so they only add noise and
# postings to scan.
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves
""".split())


def tokens(text: str) -> list[str]:
    """Lower-cased Unicode word runs without stopwords."""
    return [t for t in _WORD.findall(text.lower()) if t not in STOPWORDS]


class BM25:
    """Okapi BM25 over ``docs`` (id -> text).

    Each term's postings (doc indices, and the term's finished BM25 weight in each doc) are
    computed once at build time, so a query is one numpy scatter-add per query term: fast
    enough for tens of thousands of long units and hundreds of questions."""

    def __init__(self, docs: Mapping[str, str], k1: float = 1.2, b: float = 0.75):
        self.ids = list(docs)
        self.k1, self.b = k1, b
        n_docs = len(self.ids)
        vocab: dict[str, int] = {}
        term_ids: list[int] = []
        doc_idx: list[int] = []
        tfs: list[int] = []
        lengths = np.zeros(n_docs, dtype=np.float64)
        for i, text in enumerate(docs.values()):
            # Counting all words first and dropping stopwords from the counts is cheaper than
            # filtering every word occurrence.
            counts = Counter(_WORD.findall(text.lower()))
            length = 0
            for term, tf in counts.items():
                if term in STOPWORDS:
                    continue
                term_ids.append(vocab.setdefault(term, len(vocab)))
                doc_idx.append(i)
                tfs.append(tf)
                length += tf
            lengths[i] = length
        self.vocab = vocab
        terms = np.asarray(term_ids, dtype=np.int64)
        order = np.argsort(terms, kind="stable")  # stable: each term's postings in doc order
        docs_sorted = np.asarray(doc_idx, dtype=np.int64)[order]
        tf_sorted = np.asarray(tfs, dtype=np.float64)[order]
        df = np.bincount(terms, minlength=len(vocab))
        self.offsets = np.concatenate(([0], np.cumsum(df))).astype(np.int64)
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        avgdl = float(lengths.mean()) if n_docs and lengths.sum() > 0 else 1.0
        norm = k1 * (1.0 - b + b * lengths[docs_sorted] / avgdl)
        self.postings = docs_sorted
        self.weights = idf[terms[order]] * tf_sorted * (k1 + 1.0) / (tf_sorted + norm)

    def __len__(self) -> int:
        return len(self.ids)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every doc, in insertion order. A repeated query word counts once,
        so the wording of a question does not weigh one term over another."""
        out = np.zeros(len(self.ids), dtype=np.float64)
        for term in dict.fromkeys(tokens(query)):
            t = self.vocab.get(term)
            if t is None:
                continue
            lo, hi = self.offsets[t], self.offsets[t + 1]
            # A term occurs at most once in each doc's postings, so a plain fancy-index add is exact.
            out[self.postings[lo:hi]] += self.weights[lo:hi]
        return out

    def search(self, query: str, n: int) -> list[str]:
        """The ``n`` best doc ids, best first; ties in insertion order; docs scoring 0 left out."""
        if n < 1:
            return []
        return [self.ids[i] for i in _top(self.scores(query), n, positive_only=True)]


def _top(scores: np.ndarray, n: int, *, positive_only: bool = False) -> list[int]:
    """Indices of the ``n`` highest scores, best first, ties by lower index."""
    candidates = np.flatnonzero(scores > 0) if positive_only else np.arange(len(scores))
    values = scores[candidates]
    if len(candidates) > n:
        # Partition first so only the leaders are sorted; keep everything tied with the n-th.
        cutoff = np.partition(values, len(values) - n)[len(values) - n]
        keep = values >= cutoff
        candidates, values = candidates[keep], values[keep]
    order = np.lexsort((candidates, -values))[:n]
    return candidates[order].tolist()


def dense_search(ids: Sequence[str], vectors: np.ndarray, query: np.ndarray, n: int) -> list[str]:
    """The ``n`` best distinct ids by cosine. ``vectors`` holds unit rows, possibly several per id
    (chunks of one long unit): a unit scores as its best chunk. Ties go to the id seen first.
    The query's norm only scales every score alike, so it need not be normalised."""
    vectors = np.asarray(vectors)
    if vectors.ndim != 2 or len(ids) != vectors.shape[0]:
        raise ValueError(f"need one id per vector row: {len(ids)} ids, vectors of shape {vectors.shape}")
    if n < 1 or not len(ids):
        return []
    row_scores = vectors @ np.asarray(query, dtype=vectors.dtype).reshape(-1)
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(i, len(index)) for i in ids), dtype=np.int64, count=len(ids))
    best = np.full(len(index), -np.inf)
    np.maximum.at(best, codes, row_scores.astype(np.float64))
    unique = list(index)
    return [unique[i] for i in _top(best, n)]


def rrf(rankings: Sequence[Sequence[str]], n: int, k: int = 60) -> list[str]:
    """Reciprocal rank fusion: an id scores sum(1 / (k + rank)) over the rankings it is in (its
    best rank where a ranking repeats it). Ties follow the first ranking's order, then the id."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, d in enumerate(dict.fromkeys(ranking), start=1):
            fused[d] = fused.get(d, 0.0) + 1.0 / (k + rank)
    first = {d: i for i, d in enumerate(dict.fromkeys(rankings[0]))} if rankings else {}
    return sorted(fused, key=lambda d: (-fused[d], first.get(d, math.inf), d))[:max(n, 0)]


def recall_ceiling(evidence_sizes: Iterable[int], k: int) -> float:
    """The best mean Recall@k any retriever could reach: a question citing more than ``k`` units
    can have at most k of them found. Questions without evidence are not scored, so not counted."""
    if k < 1:
        raise ValueError("k must be >= 1")
    caps = [min(1.0, k / size) for size in evidence_sizes if size > 0]
    return round(sum(caps) / len(caps), 3) if caps else 0.0
