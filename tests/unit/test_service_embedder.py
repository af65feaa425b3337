"""The OpenAI-compatible embedder's handling of length, as functions (against a real server:
tests/integration/test_minilm_served.py): a text's passages in characters (``windows``), and what
it asks again after a refusal for length (``shortened``): cut by the window the refusal names,
else by half."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from memstream.embedding.remote import shortened, windows

LLAMA_CPP = ("Error code: 400 - {'error': {'code': 400, 'message': 'input (1000 tokens) is too large to process. "
             "increase the physical batch size (current batch size: 256)', 'type': 'invalid_request_error'}}")
LLAMA_CPP_CONTEXT = "request (20462 tokens) exceeds the available context size (2048 tokens), try increasing it"
LLAMA_CPP_SLOT = ("Error code: 400 - {'error': {'code': 400, 'message': 'input (1682 tokens) is larger than the max "
                  "context size (1024 tokens). skipping', 'type': 'exceed_context_size_error'}}")
VLLM = ("Error code: 400 - {'object': 'error', 'message': \"This model's maximum context length is 512 tokens. However, "
        "you requested 600 tokens in the input for embedding generation.\", 'code': 400}")
OPENAI = "Error code: 400 - {'error': {'message': \"Invalid 'input[0]': maximum input length is 8192 tokens.\"}}"


@pytest.mark.parametrize("refusal, expected", [
    (LLAMA_CPP, int(4000 * 256 / 1000 * 0.9)),
    (LLAMA_CPP_CONTEXT, int(4000 * 2048 / 20462 * 0.9)),
    (LLAMA_CPP_SLOT, int(4000 * 1024 / 1682 * 0.9)),
    (VLLM, int(4000 * 512 / 600 * 0.9)),
])
def test_a_refusal_naming_the_window_and_the_tokens_asked_cuts_by_their_ratio(refusal, expected):
    assert shortened(4000, refusal) == expected


@pytest.mark.parametrize("refusal", ["input is too long", "input (300 tokens) is too large to process", OPENAI,
                                     "maximum context length is 8,192 tokens, however you requested 9,000 tokens"])
def test_a_refusal_that_does_not_name_both_halves_the_text(refusal):
    assert shortened(4000, refusal) == 2000


def test_a_cut_to_nothing_halves_instead():
    assert shortened(6, "input (1000 tokens) is too large (current batch size: 8)") == 3


@given(st.text(alphabet=st.sampled_from("ab \n\u00e9"), max_size=3000), st.integers(8, 400), st.integers(1, 40))
def test_passages_start_at_0_fit_the_window_overlap_and_cover_the_text_up_to_the_limit(text, window, limit):
    spans = windows(text, window, limit)
    assert spans[0][0] == 0 and 1 <= len(spans) <= limit
    assert all(0 < e - s <= window for s, e in spans) or text == ""
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert s0 < s1 <= e0 < e1  # each moves on, none leaves a gap
    assert spans[-1][1] == len(text) or len(spans) == limit


def test_a_passage_ends_and_the_next_begins_at_a_space_so_words_are_not_cut():
    words = " ".join(random.Random(3).choice(["river", "lantern", "kayak", "Lisbon"]) for _ in range(400))
    spans = windows(words, 200, 100)
    assert len(spans) > 10
    for s, e in spans:
        assert (s == 0 or words[s - 1] == " ") and (e == len(words) or words[e] == " ")


@pytest.mark.parametrize("refusal", [LLAMA_CPP, LLAMA_CPP_CONTEXT, LLAMA_CPP_SLOT, VLLM, OPENAI])
def test_each_services_refusal_for_length_is_read_as_one(refusal):
    import httpx
    import openai

    from memstream.embedding.remote import _too_long

    response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1/v1/embeddings"))
    assert _too_long(openai.BadRequestError(refusal, response=response, body=None))


def test_a_service_still_down_after_its_attempts_is_unavailable_which_the_pipeline_retries():
    from memstream.embedding.remote import EmbeddingUnavailable, OpenAIEmbedder
    from memstream.streams.log.errors import Transient, as_retryable

    down = OpenAIEmbedder("http://127.0.0.1:1/v1", None, "minilm", dimensions=384, attempts=2, timeout_s=1.0)
    with pytest.raises(EmbeddingUnavailable, match="APIConnectionError after 2 attempts") as raised:
        down.embed(["I live in Lisbon."])
    assert isinstance(as_retryable(raised.value), Transient)  # the batch waits: `retried` asks again, the worker goes on
