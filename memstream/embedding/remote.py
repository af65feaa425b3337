"""Embedders behind a service: any OpenAI-compatible ``/v1/embeddings`` (OpenAI, Azure OpenAI,
Ollama, vLLM, llama.cpp's server with an embedding model) and AWS Bedrock's Titan Text
Embeddings v2.

Both satisfy ``Embedder``: synchronous (called from a thread), vectors L2-normalised here
whatever the service returns, and a ``model_id`` naming the model and its dimension, so vectors of
one are never compared with another's. A service's vectors are taken as a function of the text,
as the contract asks; formation records them, so a replay never asks again.

Throttling, a service error or a lost connection are retried with exponential backoff (the
embedder has no turn to give up: the batch waits, as for any store); anything else (a key, a
model name) is raised as it is.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Sequence

import numpy as np
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

log = logging.getLogger("memstream.embedding")

BATCH = 128  # texts per /v1/embeddings request
# What a service embeds of a text: its first characters, within the models' input limits (OpenAI's
# 8,191 tokens; Titan v2's 50,000 characters), as MiniLM embeds a long text's first window.
MAX_CHARS = 24_000


def _normalised(rows: Sequence[Sequence[float]], dim: int) -> np.ndarray:
    out = np.asarray(rows, dtype=np.float32).reshape(len(rows), dim)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1.0, norms)


def _retrying(passing, attempts: int, what: str) -> Retrying:
    return Retrying(retry=retry_if_exception(passing), wait=wait_random_exponential(multiplier=0.5, max=20),
                    stop=stop_after_attempt(attempts), reraise=True,
                    before_sleep=lambda rs: log.warning("%s: %s; retrying", what, rs.outcome.exception()))


class OpenAIEmbedder:
    """``Embedder`` over an OpenAI-compatible ``/v1/embeddings``. ``dimensions`` is asked of models
    that shorten their vectors (OpenAI's text-embedding-3); without it, the model's own, learnt
    from one call when the embedder is made."""

    def __init__(self, base_url: str, api_key: str | None, model: str, *, dimensions: int | None = None,
                 timeout_s: float = 60.0, attempts: int = 8, client=None):
        import openai

        self._openai = openai
        self._client = client or openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0,
                                               timeout=timeout_s)
        self._model, self._dimensions, self._attempts = model, dimensions, attempts
        self.dim = dimensions or len(self._ask(["dimension"])[0])
        self.model_id = f"openai:{model}:{self.dim}"

    def _passing(self, exc: BaseException) -> bool:
        o = self._openai
        return isinstance(exc, (o.RateLimitError, o.APIConnectionError, o.InternalServerError)) and not _too_long(exc)

    def _ask(self, texts: list[str]) -> list[list[float]]:
        kw = {"dimensions": self._dimensions} if self._dimensions else {}
        for attempt in _retrying(self._passing, self._attempts, f"embeddings {self._model}"):
            with attempt:
                response = self._client.embeddings.create(model=self._model, input=texts, encoding_format="float", **kw)
        return [d.embedding for d in sorted(response.data, key=lambda d: d.index)]

    def _fitted(self, text: str) -> list[float]:
        """One text, shortened by half until the service takes it (its window is its own)."""
        while True:
            try:
                return self._ask([text])[0]
            except self._openai.APIStatusError as exc:
                if not _too_long(exc) or len(text) < 2:
                    raise
                text = text[:len(text) // 2]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows: list[list[float]] = []
        for i in range(0, len(texts), BATCH):
            # An empty text is refused by some services: it embeds as a single space.
            rows += self._batched([t[:MAX_CHARS] if t.strip() else " " for t in texts[i:i + BATCH]])
        return _normalised(rows, self.dim)

    def _batched(self, batch: list[str]) -> list[list[float]]:
        """``batch`` embedded; one the service refuses as too long is asked again in halves, so a
        long text costs a few more calls, not one call for every text beside it."""
        try:
            return self._ask(batch)
        except self._openai.APIStatusError as exc:
            if not _too_long(exc):
                raise
            if len(batch) == 1:
                return [self._fitted(batch[0])]
            half = len(batch) // 2
            return self._batched(batch[:half]) + self._batched(batch[half:])


_TOO_LONG = re.compile(r"too (large|long|many tokens)|maximum (context|input)|context length|exceeds", re.IGNORECASE)


def _too_long(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) in (400, 413, 500) and bool(_TOO_LONG.search(str(exc)))


TITAN_V2 = "amazon.titan-embed-text-v2:0"
TITAN_DIMENSIONS = (256, 512, 1024)
_TITAN_RETRYABLE = frozenset({"ThrottlingException", "ServiceUnavailableException", "InternalServerException",
                              "ModelNotReadyException", "ModelTimeoutException"})


class TitanEmbedder:
    """``Embedder`` over Bedrock's Titan Text Embeddings v2 (``InvokeModel``, one text a call, the
    service normalising): 256, 512 or 1024 dimensions."""

    def __init__(self, client, *, model: str = TITAN_V2, dimensions: int = 1024, attempts: int = 8):
        if dimensions not in TITAN_DIMENSIONS:
            raise ValueError(f"Titan v2 makes {TITAN_DIMENSIONS} dimensions, not {dimensions}")
        self._client, self._model, self.dim, self._attempts = client, model, dimensions, attempts
        self.model_id = f"bedrock:{model}:{dimensions}"

    @staticmethod
    def _passing(exc: BaseException) -> bool:
        from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError

        return ((isinstance(exc, ClientError) and exc.response["Error"]["Code"] in _TITAN_RETRYABLE)
                or isinstance(exc, BotoConnectionError))

    def _one(self, text: str) -> list[float]:
        body = json.dumps({"inputText": text[:MAX_CHARS] if text.strip() else " ", "dimensions": self.dim,
                           "normalize": True})
        for attempt in _retrying(self._passing, self._attempts, f"embeddings {self._model}"):
            with attempt:
                response = self._client.invoke_model(modelId=self._model, body=body, accept="application/json",
                                                     contentType="application/json")
        return json.loads(response["body"].read())["embedding"]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalised([self._one(t) for t in texts], self.dim)
