"""The default embedder runs offline and is deterministic per text, whatever its batch."""
import numpy as np
import pytest

from memstream.embedding import default_embedder


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


def test_vectors_are_unit_length_384_float32(embedder):
    v = embedder.embed(["I live in Lisbon", ""])
    assert v.shape == (2, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v[:1], axis=1), 1.0, atol=1e-5)


def test_a_text_embeds_identically_alone_or_in_any_batch(embedder):
    alone = embedder.embed(["my dog is called Rex"])[0]
    batched = embedder.embed(["a much longer sentence about something else entirely, to pad", "my dog is called Rex"])[1]
    assert np.array_equal(alone, batched)


def test_paraphrases_are_closer_than_unrelated_sentences(embedder):
    a, b, c = embedder.embed(["I live in Lisbon", "My home is in Lisbon, Portugal", "Quarterly revenue fell 3%"])
    assert a @ b > 0.6 > a @ c


def test_long_inputs_are_truncated_not_rejected(embedder):
    assert embedder.embed(["word " * 5000]).shape == (1, 384)


def test_the_int8_compute_variant_stays_close_to_the_shipped_model_under_its_own_id(embedder):
    shipped = default_embedder(variant="weights")
    texts = ["What did Caroline research for her adoption plans?", "I moved to Berlin last month"]
    assert embedder.model_id != shipped.model_id  # vectors of the two are never compared
    cos = np.sum(embedder.embed(texts) * shipped.embed(texts), axis=1)
    assert (cos > 0.99).all()


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="variant"):
        default_embedder(variant="fp16")
