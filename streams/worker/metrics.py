"""The workers' Prometheus metrics (``memstream worker --metrics-port``): what each step applied
and dead-lettered, how long its batches took, how far behind it is, what formation decided, and
what embedding and the LLM cost. Each role serves its own registry on its own port."""
from __future__ import annotations

import logging
import time
from typing import Sequence

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from memstream.schemas import EpisodesSwept

log = logging.getLogger("memstream.metrics")
tracer = trace.get_tracer("memstream.worker")  # a span per step batch; a no-op without an SDK

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, usd_per_mtok: tuple[float, float] = (0.0, 0.0)):
        r = self.registry = registry or CollectorRegistry()
        self._usd_in, self._usd_out = usd_per_mtok
        self.records = Counter("memstream_records", "Records a step was handed (after its position gate)", ["step"],
                               registry=r)
        self.shredded = Counter("memstream_shredded_records", "Records sealed with a destroyed key, skipped",
                                ["topic"], registry=r)
        self.plain_records = Counter("memstream_plain_records", "Plain records of users read after the deployment "
                                     "began sealing: no forget reaches their copy on the log", ["topic"], registry=r)
        self.dead_letters = Counter("memstream_dead_letters", "Records dead-lettered", ["stage"], registry=r)
        self.batch = Histogram("memstream_batch_seconds", "Time a step took for one batch", ["step"],
                               buckets=_SECONDS, registry=r)
        # Every worker reports every partition (the same numbers, from Postgres): max, not sum, over workers.
        self.lag = Gauge("memstream_lag_records", "Records of a partition a step has not applied yet",
                         ["step", "topic", "partition"], registry=r)
        self.decisions = Counter("memstream_decisions", "Decisions formation produced", ["kind"], registry=r)
        self.episodes_moved = Counter("memstream_episodes_moved", "Episodes a decay sweep moved to the cold vector "
                                      "index or back to the hot one", ["to"], registry=r)
        self.embedding = Histogram("memstream_embedding_seconds", "Time to embed one batch of texts",
                                   buckets=_SECONDS, registry=r)
        self.llm_calls = Counter("memstream_llm_calls", "Calls to an extraction, resolution or relation client",
                                 ["stage", "model"], registry=r)
        self.llm_seconds = Histogram("memstream_llm_seconds", "Time of one LLM client call", ["stage", "model"],
                                     buckets=_SECONDS, registry=r)
        self.llm_tokens = Counter("memstream_llm_tokens", "Tokens the LLM read (input) and wrote (output)",
                                  ["stage", "model", "direction"], registry=r)
        self.llm_cost = Counter("memstream_llm_estimated_usd", "Estimated LLM cost at the configured prices",
                                ["stage", "model"], registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on %s:%d/metrics", host, port)

    def decided(self, decisions: Sequence) -> None:
        for d in decisions:
            self.decisions.labels(type(d).__name__).inc()
            if isinstance(d, EpisodesSwept):
                self.episodes_moved.labels("cold").inc(len(d.cooled))
                self.episodes_moved.labels("hot").inc(len(d.warmed))

    def called(self, stage: str, model: str, seconds: float, tokens: tuple[int, int]) -> None:
        self.llm_calls.labels(stage, model).inc()
        self.llm_seconds.labels(stage, model).observe(seconds)
        if any(tokens):
            self.llm_tokens.labels(stage, model, "input").inc(tokens[0])
            self.llm_tokens.labels(stage, model, "output").inc(tokens[1])
            self.llm_cost.labels(stage, model).inc((tokens[0] * self._usd_in + tokens[1] * self._usd_out) / 1e6)


class TimedEmbedder:
    """An embedder whose every ``embed`` is timed into ``metrics.embedding``."""

    def __init__(self, embedder, metrics: WorkerMetrics):
        self._embedder, self._metrics = embedder, metrics
        self.model_id = embedder.model_id

    def embed(self, texts):
        t = time.perf_counter()
        try:
            return self._embedder.embed(texts)
        finally:
            self._metrics.embedding.observe(time.perf_counter() - t)

    def __getattr__(self, name):
        return getattr(self._embedder, name)


class ObservedLlm:
    """An LLM client whose calls (each of ``methods``) are counted and timed into ``metrics``
    under ``stage``, with the tokens a client that counts them (``tokens``: cumulative input and
    output) used. Tokens are what the counter grew by since this wrapper last looked: calls run
    concurrently, so a call's own before and after would count its neighbours' tokens too."""

    def __init__(self, client, stage: str, methods: tuple[str, ...], metrics: WorkerMetrics):
        self._client, self._stage, self._metrics = client, stage, metrics
        self.model_id = client.model_id
        self._counted = getattr(client, "tokens", (0, 0))
        for method in methods:
            setattr(self, method, self._observed(getattr(client, method)))

    def _observed(self, call):
        async def observed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                now = getattr(self._client, "tokens", (0, 0))
                grew, self._counted = (now[0] - self._counted[0], now[1] - self._counted[1]), now
                self._metrics.called(self._stage, self.model_id, time.perf_counter() - t, grew)

        return observed

    def __getattr__(self, name):
        return getattr(self._client, name)
