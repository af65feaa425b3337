"""The in-process embedder's model, MiniLM, served by a real llama.cpp server on
``/v1/embeddings``: the GGUF written from the pinned package's upstream weights is the pinned
file (its digest is checked at start), and it embeds as the in-process model does."""
from __future__ import annotations

import numpy as np

from memstream.embedding import MiniLMOnnx
from memstream.embedding.remote import OpenAIEmbedder
from memstream.stack import model_server

from .conftest import HOME

PORT = model_server.EMBED_PORT + 1  # beside the SmolLM2 embedding server the service tests keep up

TEXTS = ["I moved to Lisbon last spring with my dog Rex.", "What is the capital of France?", "hello",
         "My sister Ana is allergic to peanuts, so we never cook with them at home.",
         "Élodie's café on the Rue Saint-Denis opened in 1998; she still bakes the croissants herself!"]


def test_minilm_on_llama_cpp_embeds_as_the_in_process_model():
    proc = model_server.start("minilm", HOME / "models", PORT, log_path=HOME / "model-server.log", parallel=2)
    try:
        served = OpenAIEmbedder(f"http://127.0.0.1:{PORT}/v1", None, "minilm")
        got = served.embed(TEXTS)
        long = served.embed(["the river " * 400])  # past the 256-token window: shortened by the client, not refused
    finally:
        model_server.stop(proc)
    assert served.model_id == "openai:minilm:384" and long.shape == (1, 384)
    # The upstream float weights against the ONNX export (int8 weights, float compute): the same
    # model but for its quantisation. Against the default int8-compute variant, as close as that
    # variant is to the export: what they differ by is the CPU's int8 arithmetic, not the server.
    weights, dynamic = MiniLMOnnx(variant="weights").embed(TEXTS), MiniLMOnnx().embed(TEXTS)
    assert np.all((got * weights).sum(axis=1) > 0.995)
    assert np.all((got * dynamic).sum(axis=1) >= (weights * dynamic).sum(axis=1) - 0.005)
