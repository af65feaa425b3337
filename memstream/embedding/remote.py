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


class EmbeddingUnavailable(ConnectionError):
    """The embedding service still failed past the embedder's attempts. A connection error, so
    whoever embeds retries it as any store's (the batch waits) instead of stopping on another
    library's error."""


def _asked(passing, attempts: int, what: str, call):
    """``call()``, again after each error ``passing`` lets by, ``attempts`` times at most; a
    passing error still there after them is ``EmbeddingUnavailable``."""
    try:
        for attempt in Retrying(retry=retry_if_exception(passing), wait=wait_random_exponential(multiplier=0.5, max=20),
                                stop=stop_after_attempt(attempts), reraise=True,
                                before_sleep=lambda rs: log.warning("%s: %s; retrying", what,
                                                                    type(rs.outcome.exception()).__name__)):
            with attempt:
                return call()
    except Exception as exc:
        if passing(exc):
            raise EmbeddingUnavailable(f"{what}: {type(exc).__name__} after {attempts} attempts") from exc
        raise


def windows(text: str, window: int, limit: int) -> list[tuple[int, int]]:
    """The character spans of ``text``'s passages of at most ``window`` characters, at most
    ``limit``, the first starting at 0: one span (the whole text) when it fits. A passage ends at
    a space in its last eighth when there is one, and the next starts an eighth of a window before
    it ended, so a phrase across a boundary is whole in one of them."""
    if len(text) <= window:
        return [(0, len(text))]
    spans: list[tuple[int, int]] = []
    start, slack = 0, window // 8
    while True:
        end = min(start + window, len(text))
        if end < len(text):
            end = _space_in(text, end - slack, end, last=True) or end
        spans.append((start, end))
        if end == len(text) or len(spans) == limit:
            return spans
        start = end - slack  # three quarters of a window or more past the last start: it ends
        start = (_space_in(text, start, end, last=False) or start - 1) + 1


def _space_in(text: str, lo: int, hi: int, *, last: bool) -> int | None:
    """The position of the last (or first) whitespace in ``text[lo:hi]``, if any and past 0."""
    for i in (range(hi - 1, lo - 1, -1) if last else range(lo, hi)):
        if i > 0 and text[i].isspace():
            return i
    return None


class OpenAIEmbedder:
    """``Embedder`` over an OpenAI-compatible ``/v1/embeddings``. ``dimensions`` is asked of models
    that shorten their vectors (OpenAI's text-embedding-3); without it, the model's own, learnt
    from one call when the embedder is made.

    ``window_chars``: how much of a text the model takes in one vector, in characters (a service
    has no tokenizer to ask). Given, a text is embedded as its first such passage and a longer
    one has later passages (``passages``); without it, a text is sent whole (its first
    ``MAX_CHARS``) and shortened only when the service refuses it."""

    def __init__(self, base_url: str, api_key: str | None, model: str, *, dimensions: int | None = None,
                 window_chars: int | None = None, timeout_s: float = 60.0, attempts: int = 8, client=None):
        import openai

        self._openai = openai
        self._client = client or openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0,
                                               timeout=timeout_s)
        self._model, self._dimensions, self._attempts = model, dimensions, attempts
        self._window = min(window_chars, MAX_CHARS) if window_chars else None
        self.dim = dimensions or len(self._ask(["dimension"])[0])
        self.model_id = f"openai:{model}:{self.dim}"

    def _passing(self, exc: BaseException) -> bool:
        o = self._openai
        return isinstance(exc, (o.RateLimitError, o.APIConnectionError, o.InternalServerError)) and not _too_long(exc)

    def _ask(self, texts: list[str]) -> list[list[float]]:
        kw = {"dimensions": self._dimensions} if self._dimensions else {}
        create = self._client.embeddings.create
        response = _asked(self._passing, self._attempts, f"embeddings {self._model}",
                          lambda: create(model=self._model, input=texts, encoding_format="float", **kw))
        return [d.embedding for d in sorted(response.data, key=lambda d: d.index)]

    def _fitted(self, text: str, refusal: Exception) -> list[float]:
        """One text the service refused as too long, shortened until it takes it (its window is
        its own): by what the refusal says of the window, or by half."""
        while len(text) > 1:
            text = text[:shortened(len(text), str(refusal))]
            try:
                return self._ask([text])[0]
            except self._openai.APIStatusError as exc:
                if not _too_long(exc):
                    raise
                refusal = exc
        raise refusal

    def passages(self, text: str, limit: int) -> list[tuple[int, int]]:
        return windows(text, self._window, limit) if self._window else [(0, len(text))]

    def _sent(self, text: str) -> str:
        if not text.strip():
            return " "  # an empty text is refused by some services
        return text[:self.passages(text, 1)[0][1]] if self._window else text[:MAX_CHARS]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows: list[list[float]] = []
        for i in range(0, len(texts), BATCH):
            rows += self._batched([self._sent(t) for t in texts[i:i + BATCH]])
        return _normalised(rows, self.dim)

    def _batched(self, batch: list[str]) -> list[list[float]]:
        """``batch`` embedded; when the service refuses it as too long, each text is asked alone
        (a refusal does not say which text it was, and a server has often embedded the texts
        before it: halving the batch would embed them again at every level), and the one refused
        is shortened (``_fitted``)."""
        try:
            return self._ask(batch)
        except self._openai.APIStatusError as exc:
            if not _too_long(exc):
                raise
            if len(batch) == 1:
                return [self._fitted(batch[0], exc)]
            return [v for text in batch for v in self._batched([text])]


_TOO_LONG = re.compile(r"too (large|long|many tokens)|maximum (context|input)|context length|exceeds|"
                       r"larger than the max context|exceed_context_size", re.IGNORECASE)


def _too_long(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) in (400, 413, 500) and bool(_TOO_LONG.search(str(exc)))


# Token counts in a refusal: "input (4801 tokens) ... (current batch size: 256)" and "input (1682
# tokens) is larger than the max context size (1024 tokens)" (llama.cpp), "maximum context length
# is 512 tokens. However, you requested 600 tokens" (vLLM). A count written "8,192" is not read.
_COUNTS = re.compile(r"(?<![\d,])(\d+) tokens|batch size: (\d+)|context size \((\d+)")
_MARGIN = 0.9  # tokens are not spread evenly over a text's characters


def shortened(length: int, refusal: str) -> int:
    """How much of a text of ``length`` characters to ask again after ``refusal``: cut by the
    window over the tokens asked when the refusal names both (one more call, not one per halving),
    otherwise by half. Depends only on the text and the service's answer, so a text embeds alike
    whenever it is asked."""
    counts = {int(n) for groups in _COUNTS.findall(refusal) for n in groups if n}
    if len(counts) >= 2:
        window, asked = min(counts), max(counts)
        cut = int(length * window / asked * _MARGIN)
        if 0 < cut < length:
            return cut
    return length // 2


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
        from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError, HTTPClientError

        # HTTPClientError: a connection closed or a read timed out mid-call (not ConnectionError's kin).
        return ((isinstance(exc, ClientError) and exc.response["Error"]["Code"] in _TITAN_RETRYABLE)
                or isinstance(exc, (BotoConnectionError, HTTPClientError)))

    def _one(self, text: str) -> list[float]:
        body = json.dumps({"inputText": text[:MAX_CHARS] if text.strip() else " ", "dimensions": self.dim,
                           "normalize": True})
        response = _asked(self._passing, self._attempts, f"embeddings {self._model}", lambda: self._client.invoke_model(
            modelId=self._model, body=body, accept="application/json", contentType="application/json"))
        return json.loads(response["body"].read())["embedding"]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalised([self._one(t) for t in texts], self.dim)
