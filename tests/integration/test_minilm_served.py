"""The in-process embedder's model, MiniLM, served by a real llama.cpp server on
``/v1/embeddings``: the GGUF written from the pinned package's upstream weights is the pinned
file (its digest is checked at start), it embeds as the in-process model does, and a text longer
than its 256-token window is sent as passages that fit, or cut to what the refusal names."""
from __future__ import annotations

import numpy as np
import pytest

from memstream.embedding import MiniLMOnnx
from memstream.embedding.base import embed_with_passages
from memstream.embedding.remote import OpenAIEmbedder, windows
from memstream.stack import model_server

from .conftest import HOME

PORT = model_server.EMBED_PORT + 1  # beside the SmolLM2 embedding server the service tests keep up

TEXTS = ["I moved to Lisbon last spring with my dog Rex.", "What is the capital of France?", "hello",
         "My sister Ana is allergic to peanuts, so we never cook with them at home.",
         "Élodie's café on the Rue Saint-Denis opened in 1998; she still bakes the croissants herself!"]
# About 4,000 characters and 800 tokens, every window of it a different text: past the 256-token window.
LONG = " ".join(f"the river bend number {n} where we camped" for n in range(100))


@pytest.fixture(scope="module")
def minilm():
    proc = model_server.start("minilm", HOME / "models", PORT, log_path=HOME / "model-server.log", parallel=2)
    try:
        yield f"http://127.0.0.1:{PORT}/v1"
    finally:
        model_server.stop(proc)


class Recorded:
    """The real client, keeping what each request sent (to count the requests a text costs)."""

    def __init__(self, url: str):
        import openai

        self._real = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        self.requests: list[list[str]] = []
        self.embeddings = self

    def create(self, *, input, **kw):
        self.requests.append(list(input))
        return self._real.embeddings.create(input=input, **kw)


def test_minilm_on_llama_cpp_embeds_as_the_in_process_model(minilm):
    served = OpenAIEmbedder(minilm, None, "minilm")
    got = served.embed(TEXTS)
    assert served.model_id == "openai:minilm:384"
    # The upstream float weights against the ONNX export (int8 weights, float compute): the same
    # model but for its quantisation. Against the default int8-compute variant, as close as that
    # variant is to the export: what they differ by is the CPU's int8 arithmetic, not the server.
    weights, dynamic = MiniLMOnnx(variant="weights").embed(TEXTS), MiniLMOnnx().embed(TEXTS)
    assert np.all((got * weights).sum(axis=1) > 0.995)
    assert np.all((got * dynamic).sum(axis=1) >= (weights * dynamic).sum(axis=1) - 0.005)


def test_a_long_text_is_cut_to_the_window_the_refusal_names_in_one_more_request(minilm):
    client = Recorded(minilm)
    served = OpenAIEmbedder(minilm, None, "minilm", client=client)
    first = len(client.requests)  # the embedder asks one text's dimension when it is made
    long = served.embed([LONG])
    sent = [len(r[0]) for r in client.requests[first:]]
    assert long.shape == (1, 384) and len(sent) == 2 and sent[0] == len(LONG) and 900 < sent[1] < 1300


def test_with_a_window_in_characters_a_long_text_is_sent_as_passages_that_fit_and_each_is_embedded(minilm):
    client = Recorded(minilm)
    served = OpenAIEmbedder(minilm, None, "minilm", window_chars=800, client=client)
    first = len(client.requests)
    [(vector, passages)] = embed_with_passages(served, [LONG], limit=32)
    spans = windows(LONG, 800, 32)
    assert len(client.requests) == first + 1 and [len(t) for t in client.requests[-1]] == [e - s for s, e in spans]
    assert [(s, e) for s, e, _ in passages] == spans[1:]
    alone = np.concatenate([served.embed([LONG[s:e]]) for s, e in spans])  # each in a request of its own
    assert np.allclose(np.stack([vector, *(v for _, _, v in passages)]), alone, atol=1e-5)


def test_a_batch_refused_for_one_long_text_is_asked_text_by_text_and_embeds_each_as_alone(minilm):
    client = Recorded(minilm)
    served = OpenAIEmbedder(minilm, None, "minilm", client=client)
    first = len(client.requests)
    batch = served.embed([*TEXTS, LONG])
    sizes = [len(r) for r in client.requests[first:]]
    assert sizes == [len(TEXTS) + 1, *[1] * len(TEXTS), 1, 1]  # refused; each alone; the long one refused, then cut
    alone = np.concatenate([served.embed([t]) for t in [*TEXTS, LONG]])
    assert np.allclose(batch, alone, atol=1e-5)
