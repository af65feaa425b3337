"""Plain retrievers the evaluation runs beside memstream: BM25, best-chunk cosine, RRF, and the
Recall@k ceiling."""
from __future__ import annotations

import numpy as np
import pytest

from memstream.bench.baselines import BM25, dense_search, recall_ceiling, rrf, tokens


def test_tokens_are_lowercased_word_runs_without_stopwords():
    assert tokens("The Café's port, IS 3000!") == ["café", "s", "port", "3000"]


def test_bm25_ranks_the_doc_with_the_rare_term_first():
    docs = {
        "a": "we talked about the weather and the weather again",
        "b": "the weather today and a note on kubernetes",
        "c": "weather weather weather",
        "d": "nothing relevant here",
    }
    index = BM25(docs)
    assert index.search("kubernetes weather", 3)[0] == "b"
    assert index.search("kubernetes", 5) == ["b"]  # docs scoring 0 are left out
    assert set(index.search("weather", 10)) == {"a", "b", "c"}


def test_bm25_returns_nothing_for_an_all_stopword_or_unknown_query():
    index = BM25({"a": "the cat sat", "b": "on the mat"})
    assert index.search("the and of it", 5) == []
    assert index.search("zebra", 5) == []
    assert index.search("cat", 0) == []
    assert BM25({}).search("cat", 3) == []


def test_bm25_breaks_ties_by_insertion_order_and_prefers_shorter_docs():
    index = BM25({"z": "apple pie", "y": "apple pie", "x": "apple pie recipe with many more words added"})
    assert index.search("apple", 3) == ["z", "y", "x"]
    assert index.search("apple", 1) == ["z"]


def test_bm25_scores_match_the_okapi_formula_by_hand():
    docs = {"a": "cat cat dog", "b": "dog", "c": "bird"}
    index = BM25(docs, k1=1.2, b=0.75)
    n, df, avgdl = 3, 1, (3 + 1 + 1) / 3
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    expected = idf * 2 * 2.2 / (2 + 1.2 * (1 - 0.75 + 0.75 * 3 / avgdl))
    assert index.scores("cat cat")[0] == pytest.approx(expected)  # a repeated query word counts once


def test_dense_search_scores_a_unit_by_its_best_chunk_and_returns_distinct_ids():
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
    ids = ["long", "long", "short", "other", "tie"]
    query = np.array([0.0, 1.0])
    assert dense_search(ids, vectors, query, 3) == ["long", "tie", "short"]  # long's 2nd chunk; tie seen later
    assert dense_search(ids, vectors, query, 10) == ["long", "tie", "short", "other"]
    assert dense_search([], np.zeros((0, 2)), query, 3) == []
    with pytest.raises(ValueError):
        dense_search(["a"], vectors, query, 1)


def test_rrf_fuses_by_reciprocal_rank_with_ties_in_the_first_rankings_order():
    assert rrf([["a", "b"], ["b", "a"]], 2) == ["a", "b"]  # a tie: the first ranking's order
    assert rrf([["b", "a"], ["a", "b"]], 2) == ["b", "a"]
    assert rrf([["a", "b", "c"], ["c", "b", "a"]], 3) == ["a", "c", "b"]  # 1/61 + 1/63 beats 2/62
    assert rrf([["a", "b"], ["b", "d"]], 2) == ["b", "a"]
    assert rrf([["x"], ["q", "p"], ["p", "q"]], 4) == ["p", "q", "x"]  # p, q tie outside the first: by id
    assert rrf([["a", "a", "b"]], 5) == ["a", "b"]  # a repeat counts at its best rank only
    assert rrf([], 3) == []


def test_recall_ceiling_is_the_mean_of_k_over_evidence_size_capped_at_one():
    assert recall_ceiling([1, 5, 20], 10) == round((1 + 1 + 0.5) / 3, 3)
    assert recall_ceiling([3, 0], 1) == 0.333  # questions without evidence are not scored
    assert recall_ceiling([], 5) == 0.0
    with pytest.raises(ValueError):
        recall_ceiling([1], 0)
