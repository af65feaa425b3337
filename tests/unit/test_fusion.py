from datetime import datetime, timedelta, timezone

from memstream.read_client.fusion import RRF_K, Weights, fuse, recency_decay, rerank

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


def row(key, days_ago=0):
    return {"episode_id": key, "occurred_at": NOW - timedelta(days=days_ago)}


def test_an_item_found_by_both_channels_outranks_one_found_by_either():
    cands = fuse({"vector": [row("a"), row("b")], "keyword": [row("b"), row("c")]}, "episode_id")
    ranked = [s.cand.key for s in rerank(cands, NOW, Weights(), n_channels=2)]
    assert ranked[0] == "b"
    assert {c.key: c.channels for c in cands}["b"] == ["vector", "keyword"]


def test_rrf_scores_follow_the_reciprocal_rank_formula():
    cands = {c.key: c.rrf for c in fuse({"v": [row("a"), row("b")]}, "episode_id")}
    assert cands == {"a": 1 / (RRF_K + 1), "b": 1 / (RRF_K + 2)}


def test_recency_halves_every_half_life_and_never_exceeds_one():
    assert recency_decay(NOW, NOW, 30) == 1.0
    assert abs(recency_decay(NOW - timedelta(days=30), NOW, 30) - 0.5) < 1e-12
    assert recency_decay(NOW + timedelta(days=1), NOW, 30) == 1.0  # clock skew is not a bonus


def test_equal_relevance_prefers_the_newer_episode_and_ties_break_on_id():
    cands = fuse({"v": [row("old", 90)], "k": [row("new", 1)]}, "episode_id")
    assert [s.cand.key for s in rerank(cands, NOW, Weights(), 2)] == ["new", "old"]
    same = fuse({"v": [row("b", 5)], "k": [row("a", 5)]}, "episode_id")
    assert [s.cand.key for s in rerank(same, NOW, Weights(), 2)] == ["a", "b"]


def fact(key, category="preference", confidence=0.8, seen=1, days_ago=0):
    return {"fact_id": key, "category": category, "confidence": confidence, "observation_count": seen,
            "last_observed_at": NOW - timedelta(days=days_ago)}


def test_fact_score_adds_importance_and_type_to_relevance_and_recency():
    from memstream.read_client.fusion import FACT_WEIGHTS, fact_importance, fact_type

    cands = fuse({"vector": [fact("pref"), fact("allergy", category="constraint", confidence=0.95, seen=4)]}, "fact_id")
    scored = {s.cand.key: s for s in rerank(cands, NOW, FACT_WEIGHTS, 2, time_key="last_observed_at",
                                            importance=fact_importance, type_weight=fact_type)}
    a, p = scored["allergy"], scored["pref"]
    assert a.type == 1.0 and p.type == 0.7 and a.importance > p.importance
    w = FACT_WEIGHTS
    assert abs(a.score - (w.relevance * a.relevance + w.recency * a.recency + w.importance * a.importance + w.type * a.type)) < 1e-12


def test_repeated_observations_raise_importance_but_saturate():
    from memstream.read_client.fusion import fact_importance

    values = [fact_importance(fact("x", seen=n)) for n in (1, 2, 7, 100)]
    assert values[0] < values[1] < values[2] == values[3]
