from datetime import datetime, timedelta, timezone

import pytest

from memstream.read_client.fusion import (EPISODE_WEIGHTS, KEYWORD_SHARE, Candidate, Weights, asks, fuse, recency_decay, rerank,
                                         with_neighbours)

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


def row(key, days_ago=0, distance=0.2, rank=1.0):
    return {"episode_id": key, "occurred_at": NOW - timedelta(days=days_ago), "distance": distance, "rank": rank}


def test_an_item_found_by_both_channels_outranks_one_found_by_either():
    cands = fuse({"vector": [row("a", distance=0.1), row("b", distance=0.3)],
                  "keyword": [row("b", rank=2.0), row("c", rank=2.0)]}, "episode_id")
    ranked = [s.cand.key for s in rerank(cands, NOW, Weights())]
    assert ranked[0] == "b"
    assert {c.key: c.channels for c in cands}["b"] == ["vector", "keyword"]


def test_fused_relevance_is_the_convex_combination_of_scaled_channel_scores():
    cands = {c.key: c.fused for c in fuse({"vector": [row("a", distance=0.2), row("b", distance=0.4), row("c", distance=0.6)],
                                           "keyword": [row("b", rank=4.0), row("d", rank=1.0)]}, "episode_id")}
    v = 1 - KEYWORD_SHARE
    assert cands["a"] == v * 1.0 and cands["c"] == 0.0  # vector similarity min-max scaled within the read
    assert abs(cands["b"] - (v * 0.5 + KEYWORD_SHARE * 1.0)) < 1e-12  # keyword BM25 over its best row
    assert abs(cands["d"] - KEYWORD_SHARE * 0.25) < 1e-12
    assert all(0.0 <= x <= 1.0 for x in cands.values())


def test_a_single_row_or_equal_similarities_count_as_the_best_match():
    assert [c.fused for c in fuse({"vector": [row("a")], "keyword": [row("b", rank=1.0)]}, "episode_id")] == \
        [1 - KEYWORD_SHARE, KEYWORD_SHARE]


def test_a_channel_that_found_nothing_leaves_its_share_to_the_other():
    # No keyword match: the vector matches keep their whole scale, so relevance still outweighs
    # recency in the rerank (at 0.3 a month-old best match lost to a fresh mediocre one).
    cands = {c.key: c.fused for c in fuse({"vector": [row("a", distance=0.2), row("b", distance=0.4),
                                                      row("c", distance=0.6)], "keyword": []}, "episode_id")}
    assert cands == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.0})
    old, new = Candidate("old", {"occurred_at": NOW - timedelta(days=60)}, cands["a"]), \
        Candidate("new", {"occurred_at": NOW}, cands["b"])
    assert [s.cand.key for s in rerank([new, old], NOW, EPISODE_WEIGHTS)] == ["old", "new"]
    assert {c.key: c.fused for c in fuse({"keyword": [row("k", rank=2.0)]}, "episode_id")} == {"k": 1.0}


def test_recency_halves_every_half_life_and_never_exceeds_one():
    assert recency_decay(NOW, NOW, 30) == 1.0
    assert abs(recency_decay(NOW - timedelta(days=30), NOW, 30) - 0.5) < 1e-12
    assert recency_decay(NOW + timedelta(days=1), NOW, 30) == 1.0  # clock skew is not a bonus


def test_equal_relevance_prefers_the_newer_episode_and_ties_break_on_id():
    cands = fuse({"vector": [row("old", 90)]}, "episode_id") + fuse({"vector": [row("new", 1)]}, "episode_id")
    assert [s.cand.key for s in rerank(cands, NOW, Weights())] == ["new", "old"]
    same = fuse({"vector": [row("b", 5), row("a", 5)]}, "episode_id")
    assert [s.cand.key for s in rerank(same, NOW, Weights())] == ["a", "b"]


def fact(key, category="preference", confidence=0.8, seen=1, days_ago=0):
    return {"fact_id": key, "category": category, "confidence": confidence, "observation_count": seen,
            "last_observed_at": NOW - timedelta(days=days_ago), "distance": 0.3}


def test_fact_score_adds_importance_and_type_to_relevance_and_recency():
    from memstream.read_client.fusion import FACT_WEIGHTS, fact_importance, fact_type

    cands = fuse({"vector": [fact("pref"), fact("allergy", category="constraint", confidence=0.95, seen=4)]}, "fact_id")
    scored = {s.cand.key: s for s in rerank(cands, NOW, FACT_WEIGHTS, time_key="last_observed_at",
                                            importance=fact_importance, type_weight=fact_type)}
    a, p = scored["allergy"], scored["pref"]
    assert a.type == 1.0 and p.type == 0.7 and a.importance > p.importance
    w = FACT_WEIGHTS
    assert abs(a.score - (w.relevance * a.relevance + w.recency * a.recency + w.importance * a.importance + w.type * a.type)) < 1e-12


def test_repeated_observations_raise_importance_but_saturate():
    from memstream.read_client.fusion import fact_importance

    values = [fact_importance(fact("x", seen=n)) for n in (1, 2, 7, 100)]
    assert values[0] < values[1] < values[2] == values[3]


def ep(key, user="", assistant=""):
    return {**row(key), "user_message": user, "assistant_message": assistant}


def test_adjacent_turns_inherit_a_share_of_their_anchors_relevance_or_keep_their_own():
    cands = [Candidate("q", ep("q", "I like jazz."), fused=0.9, channels=["keyword"]), Candidate("x", ep("x"), fused=0.8)]
    adjacent = [{**ep("reply"), "anchor": "q", "next": True}, {**ep("x"), "anchor": "q", "next": False},
                {**ep("y"), "anchor": "unknown", "next": True}]
    out = {c.key: c for c in with_neighbours(cands, adjacent, "episode_id", 0.5, 1.0)}
    assert set(out) == {"q", "x", "reply"}  # a neighbour of no candidate is ignored
    assert out["reply"].fused == 0.45 and out["reply"].channels == ["neighbour"]  # q asks nothing: share 0.5
    assert out["x"].fused == 0.8 and out["x"].channels == []  # its own relevance is higher


def test_the_turn_after_a_question_inherits_the_reply_share_the_turn_before_it_does_not():
    cands = [Candidate("q", ep("q", "Jon: What's your fave style? "), fused=0.8)]
    adjacent = [{**ep("after"), "anchor": "q", "next": True}, {**ep("before"), "anchor": "q", "next": False}]
    out = {c.key: c.fused for c in with_neighbours(cands, adjacent, "episode_id", 0.5, 1.0)}
    assert out == {"q": 0.8, "after": 0.8, "before": 0.4}
    assert asks(ep("a", "where?", "")) and asks(ep("a", "x", "Want more? ")) and not asks(ep("a", "where?", "Here."))
    assert asks(ep("a", "\u4f60\u4f4f\u5728\u54ea\u91cc\uff1f", ""))  # full-width question mark


def test_anchors_pass_on_their_own_relevance_whatever_the_order():
    def run(order):
        cands = [Candidate("a", ep("a"), fused=0.2), Candidate("b", ep("b"), fused=1.0)]
        rows = [{**ep("a"), "anchor": "b", "next": True}, {**ep("c"), "anchor": "a", "next": True}]
        return {c.key: c.fused for c in with_neighbours(cands, rows if order else rows[::-1], "episode_id", 0.5, 1.0)}
    assert run(True) == run(False) == {"a": 0.5, "b": 1.0, "c": 0.1}


def version_of(key, lineage, version, attribute, recorded_days_ago, fused):
    return Candidate(key, {"fact_id": key, "lineage_id": lineage, "version": version, "attribute": attribute,
                           "recorded_at": NOW - timedelta(days=recorded_days_ago)}, fused=fused)


def test_a_context_keeps_one_version_per_fact_and_one_fact_per_single_valued_attribute():
    from memstream.read_client.fusion import latest_per_slot
    from memstream.schemas.vocabulary import single_valued

    cands = [version_of("porto-v1", "home-1", 1, "home", 3, 0.9),  # a statement saw it before its supersession
             version_of("lisbon-v2", "home-1", 2, "home", 1, 0.4),
             version_of("oslo", "home-2", 1, "home", 0.5, 0.2),    # another lineage filling the same slot
             version_of("jazz", "likes-1", 1, "likes", 2, 0.7),     # many values at once
             version_of("rock", "likes-2", 1, "likes", 1, 0.6)]
    kept = latest_per_slot(cands, single_valued)
    assert [c.key for c in kept] == ["oslo", "jazz", "rock"]
    assert {c.key: c.fused for c in kept}["oslo"] == 0.9  # the message matched the slot: its best relevance stays
