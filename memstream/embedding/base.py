"""The embedder contract."""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors.

    ``model_id`` names the model *and* its numerics (quantisation, pooling): every stored vector
    carries it, and vectors with different ids are never compared. ``embed`` is deterministic
    for a given text and ``model_id`` — the result must not depend on which other texts share
    the call — because replays and read-path queries must land on the same vectors. It is CPU
    bound and synchronous: call it from a thread in async code if the batch is large.
    """

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return an array of shape ``(len(texts), dim)``, float32, rows L2-normalised."""
        ...


class Passages(Protocol):
    """An embedder with a window (optional): ``passages(text, limit)`` returns the character
    spans ``(start, end)`` of ``text`` that each fit the model's window, in order, at most
    ``limit``, the first starting at 0; a single span when the text fits. ``embed`` of a text
    sees what the first span holds. Deterministic, like ``embed``. An embedder without it embeds
    every text whole (``embed_with_passages`` gives such texts no passages)."""

    def passages(self, text: str, limit: int) -> list[tuple[int, int]]: ...


def embed_with_passages(embedder: Embedder, texts: Sequence[str], limit: int
                        ) -> list[tuple[np.ndarray, list[tuple[int, int, np.ndarray]]]]:
    """Each text's vector (its first window's) and, for a text longer than the embedder's
    window, its later passages ``(start, end, vector)``, at most ``limit - 1``."""
    spans = [embedder.passages(t, limit) if hasattr(embedder, "passages") else [(0, len(t))] for t in texts]
    extra = [t[s:e] for t, ss in zip(texts, spans) if len(ss) > 1 for s, e in ss[1:]]
    vectors = embedder.embed([*texts, *extra])
    out, n = [], len(texts)
    for i, ss in enumerate(spans):
        if len(ss) == 1:
            out.append((vectors[i], []))
            continue
        out.append((vectors[i], [(s, e, vectors[n + j]) for j, (s, e) in enumerate(ss[1:])]))
        n += len(ss) - 1
    return out


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")
