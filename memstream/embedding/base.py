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


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")
