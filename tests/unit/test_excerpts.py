"""Excerpts and the shared-out episodes budget (pure), and the embedder's passages."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

import msgspec
import numpy as np
import pytest

from memstream.embedding import embed_with_passages
from memstream.embedding.minilm import STRIDE, WINDOW
from memstream.read_client.budget import TokenCounter, pack_episodes
from memstream.read_client.excerpts import MIN_EXCERPT_TOKENS, excerpt, query_words, shares
from memstream.read_client.render import episode_line
from memstream.schemas import EpisodeRecorded, InvalidEvent, LogPosition, Passage, decode_decision, encode
from memstream.schemas.read_models import RankedEpisode

WHEN = datetime(2024, 5, 1, tzinfo=timezone.utc)
FILLER = " ".join(f"Step {i}: stir the flour and sugar for {i} minutes." for i in range(80))


def words(text: str) -> int:
    return len(text.split())


def test_shares_keep_short_items_whole_and_split_the_rest_evenly():
    assert shares([10, 20], 100) == 20  # everything fits: nothing is cut
    assert shares([5, 10, 200, 300], 100) == 42  # 5 + 10 whole, 85 shared by two
    assert shares([300, 300, 300], 90) == 30
    assert sum(min(s, shares([7, 90, 3, 400], 120)) for s in [7, 90, 3, 400]) <= 120


def test_an_excerpt_is_the_run_of_sentences_holding_most_of_the_words_within_the_limit():
    text = "Hello there. I went to Kyoto in May!\nThe temple was great. Then we ate ramen in Osaka.\nHome."
    a, b = excerpt(text, None, {"ramen", "osaka"}, 10, words)
    assert text[a:b] == "The temple was great. Then we ate ramen in Osaka."
    a, b = excerpt(text, (13, 60), {"nothing"}, 4, words)  # within the matched passage
    assert 13 <= a < b <= 60 and words(text[a:b]) <= 4


def test_a_sentence_longer_than_the_limit_is_cut_at_a_word():
    text = "one two three four five six seven eight nine ten"
    a, b = excerpt(text, None, {"seven"}, 4, words)
    assert text[a:b] == "one two three four"


def test_query_words_leave_out_the_commonest():
    assert query_words("What did I tell you about the Kyoto trip?") == {"kyoto", "trip"}


def _ranked(text: str, minutes: int, score: float) -> RankedEpisode:
    return RankedEpisode(episode_id=uuid.uuid4(), conversation_id="c", occurred_at=WHEN.replace(minute=minutes),
                         user_message=text, assistant_message="", score=score, relevance=score, recency=0.0,
                         channels=["vector"])


def test_k_long_episodes_share_the_budget_as_excerpts_and_short_ones_stay_whole():
    counter = TokenCounter()
    long = [_ranked(f"{FILLER} The kayak is blue. {FILLER}", i, 1.0 - i / 10) for i in range(4)]
    short = _ranked("The kayak is red.", 9, 0.5)
    kept, used = pack_episodes([*long, short], {}, "what colour is the kayak?", 600, counter, episode_line)
    assert len(kept) == 5 and used <= 600
    assert used == sum(counter.count(episode_line(e)) for e in kept)
    assert kept[-1] == short and short.excerpt is None
    for e, whole in zip(kept[:4], long):
        a, b = e.excerpt
        assert whole.user_message[a:b] == e.user_message and "kayak" in e.user_message


def test_an_episode_whose_share_is_too_small_is_left_out_rather_than_cut_to_nothing():
    counter = TokenCounter()
    many = [_ranked(FILLER, i, 1.0 - i / 100) for i in range(10)]
    kept, used = pack_episodes(many, {}, "flour", 10 * MIN_EXCERPT_TOKENS - 1, counter, episode_line)
    assert 0 < len(kept) < 10 and used <= 10 * MIN_EXCERPT_TOKENS - 1


def test_passages_cover_a_long_text_in_overlapping_windows_and_a_short_one_whole():
    from memstream.embedding import default_embedder

    embedder = default_embedder()
    assert embedder.passages("A short turn.", 32) == [(0, 13)]
    spans = embedder.passages(FILLER, 32)
    counter = TokenCounter()
    assert len(spans) > 1 and spans[0][0] == 0 and spans[-1][1] == len(FILLER)
    assert all(counter.encoded(FILLER[a:b]) <= WINDOW for a, b in spans)
    assert all(b2 > a2 and a2 < b1 for (a1, b1), (a2, b2) in zip(spans, spans[1:]))  # overlapping
    assert len(embedder.passages(FILLER * 50, 4)) == 4
    (vector, passages), = embed_with_passages(embedder, [FILLER], 32)
    assert [(a, b) for a, b, _ in passages] == spans[1:]  # the first window is the text's own vector
    assert np.array_equal(vector, embedder.embed([FILLER])[0])
    assert STRIDE < WINDOW


def _episode(passages) -> EpisodeRecorded:
    v = np.ones(4, dtype="<f4").tobytes()
    return EpisodeRecorded(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), source=LogPosition("t", 0, 1),
                           recorded_at=WHEN, user_id="u", conversation_id="c", occurred_at=WHEN,
                           user_message="abcdef", assistant_message="gh", embedding=v, embedding_model="m",
                           passages=[Passage(start=a, end=b, embedding=v) for a, b in passages])


def test_an_episode_s_passages_round_trip_and_bad_spans_are_refused():
    d = _episode([(0, 5), (3, 9)])
    assert decode_decision(encode(d)) == d
    for bad in ([(0, 10)], [(4, 4)]):
        with pytest.raises(InvalidEvent):
            decode_decision(encode(msgspec.structs.replace(d, passages=[])).replace(
                b'"passages":[]', msgspec.json.encode({"passages": [
                    {"start": a, "end": b, "embedding": d.embedding} for a, b in bad]})[1:-1]))


def test_text_without_spaces_is_cut_by_characters_and_sentences_not_to_nothing():
    counter = TokenCounter()
    chinese = [_ranked("我们今天去了公园。然后吃了午饭！" * 400, i, 1.0 - i / 10) for i in range(5)]
    kept, used = pack_episodes(chinese, {}, "公园", 600, counter, episode_line)
    assert len(kept) == 5 and used <= 600
    assert all(counter.count(episode_line(e)) >= MIN_EXCERPT_TOKENS for e in kept)
    a, b = excerpt("一二三四五六七八九十" * 50, None, set(), 5, counter.count)
    assert 1 < b - a and counter.count(("一二三四五六七八九十" * 50)[a:b]) <= 5


@pytest.mark.parametrize("dim", [384, 576, 1024, 1536, 2000])
def test_a_turn_as_long_as_an_event_may_be_with_every_passage_it_may_carry_fits_a_decision(dim):
    from memstream.schemas.events import MAX_DECISION_BYTES, MAX_MESSAGE_CHARS, passages_within

    v = np.full(dim, dim ** -0.5, "<f4").tobytes()  # base64's length is the bytes' length's alone
    n = passages_within(dim)
    d = EpisodeRecorded(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), source=LogPosition("t", 0, 1),
                        recorded_at=WHEN, user_id="u" * 256, conversation_id="c" * 256, occurred_at=WHEN,
                        user_message="é" * MAX_MESSAGE_CHARS, assistant_message="ü" * MAX_MESSAGE_CHARS,
                        embedding=v, embedding_model="m" * 256,
                        passages=[Passage(start=100_000 + i, end=199_000 + i, embedding=v) for i in range(n - 1)])
    assert (n == 32) == (dim == 384) and len(encode(d)) <= MAX_DECISION_BYTES
