"""What a host can see of its reads: per-part latency histograms and degraded channels in a
Prometheus registry the host passes (``MemoryReader.connect(..., metrics=ReadMetrics(registry))``),
and OpenTelemetry spans (API only: a no-op until the host installs an SDK)."""
from __future__ import annotations

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Histogram

tracer = trace.get_tracer("memstream.read")

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class ReadMetrics:
    """``memstream_read_seconds{part}``: each channel, the query embedding, the wait for
    ``after=``, and the whole read (``total``); ``memstream_read_degraded_total{channel}``."""

    def __init__(self, registry: CollectorRegistry):
        self.seconds = Histogram("memstream_read_seconds", "Time of one part of a read", ["part"],
                                 buckets=_SECONDS, registry=registry)
        self.degraded = Counter("memstream_read_degraded", "Read channels that failed (their section empty)",
                                ["channel"], registry=registry)

    def observe(self, timings_ms: dict[str, float], degraded: list[str]) -> None:
        for part, ms in timings_ms.items():
            self.seconds.labels(part).observe(ms / 1000)
        for channel in degraded:
            self.degraded.labels(channel).inc()
