"""The read path's tunables — rerank weights and token budgets — with their measured defaults.

Plain dataclasses with no imports beyond the standard library, so ``memstream.config`` can hold
them (``Settings.read_*``) without loading the read client."""
from __future__ import annotations

from dataclasses import dataclass

# A read's channels end by then, after any read-your-writes wait: twice the statement timeout.
READ_DEADLINE_S = 2.0
MAX_K = 100  # of each kind a read or search returns: more is not a context

# Share of the keyword channel in the fused relevance of facts (BENCHMARKS.md, "Defaults").
KEYWORD_SHARE = 0.7


@dataclass(frozen=True)
class Weights:
    """``score = relevance·w_rel + recency·w_rec + importance·w_imp + type·w_type``."""

    relevance: float = 0.8
    recency: float = 0.2
    importance: float = 0.0
    type: float = 0.0
    recency_half_life_days: float = 30.0
    keyword_share: float = KEYWORD_SHARE  # of the fused relevance (``fuse``)
    neighbour_share: float = 0.0  # of an anchor's relevance its adjacent turns inherit (``with_neighbours``); 0: off
    reply_share: float = 0.0  # ... the turn after an anchor that asks a question
    anchors: int = 5  # best candidates whose adjacent turns are fetched
    candidates: int = 20  # rows each of the vector and keyword channels returns to the fusion
    # The vector channel's score: cosine similarity as it is (True), or min-max scaled over the
    # channel's rows (False: its weakest row scores 0 however near it is).
    raw_similarity: bool = False


# Episodes: relevance, and recency only when the message asks about now or lately (the reader
# decides per message). Adjacent turns inherit 0.6 of their anchor's relevance, the reply to a
# question all of it. Every value here was chosen on the two dev sets, LoCoMo and BEAM 500K, and
# is shown on both in BENCHMARKS.md ("Defaults and the measurements behind them").
EPISODE_WEIGHTS = Weights(relevance=0.8, recency=0.2, neighbour_share=0.6, reply_share=1.0, candidates=40,
                          raw_similarity=True)
FACT_WEIGHTS = Weights(relevance=0.6, recency=0.1, importance=0.2, type=0.1, recency_half_life_days=90.0)


@dataclass(frozen=True)
class Budgets:
    """Independent token budgets; due reminders are a time filter, not budget-packed."""

    facts: int = 300
    episodes: int = 600
    edges: int = 200

    def __post_init__(self) -> None:
        for name in ("facts", "episodes", "edges"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"the {name} budget must be a whole number of tokens >= 0, not {value!r}")
