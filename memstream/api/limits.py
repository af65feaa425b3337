"""Per-tenant limits of the HTTP API: one tenant's load never stalls another's.

Three limits, each per tenant (an operator key has none), each answered with 429 and a
``Retry-After`` at once, never by queueing (a queue would hold the caller's connection, and
the shared pools behind it, for as long as the limit is hit):
* requests per second, a token bucket of ``rate`` with a burst of ``burst``;
* requests in flight at once that use the reader's shared pool (reads, waits, browsing — users,
  overview, graph, memories, history — and a correct or forget, its look-up and append; an
  export, one at a time): a read that waits for a position never reached holds a connection for its timeout, and
  a heavy user's overview scans their whole partition, so a tenant gets ``concurrent`` of them,
  not the pool;
* forgets per minute (of a memory or a user): each costs every projection a transaction.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from memstream.config import TenantLimits


class Limited(Exception):
    """Over a limit: 429, retry after ``retry_after`` seconds."""

    def __init__(self, what: str, retry_after: float):
        super().__init__(what)
        self.what, self.retry_after = what, retry_after


@dataclass
class _Bucket:
    rate: float  # tokens per second
    size: float
    tokens: float = -1.0
    at: float = field(default_factory=time.monotonic)

    def take(self, what: str) -> None:
        now = time.monotonic()
        self.tokens = self.size if self.tokens < 0 else min(self.size, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            raise Limited(what, (1 - self.tokens) / self.rate)
        self.tokens -= 1


class Limits:
    """The limits of every tenant, in one process (a server's: several servers each hold their own)."""

    def __init__(self, settings: TenantLimits):
        self._s = settings
        self._requests: dict[str, _Bucket] = {}
        self._forgets: dict[str, _Bucket] = {}
        self._in_flight: dict[str, int] = {}

    def request(self, tenant: str | None) -> None:
        """One request of ``tenant`` (None: an operator, unlimited)."""
        if tenant is not None:
            self._requests.setdefault(tenant, _Bucket(self._s.rate, self._s.burst)).take(
                f"more than {self._s.rate:g} requests per second")

    def forget(self, tenant: str | None) -> None:
        if tenant is not None:
            self._forgets.setdefault(tenant, _Bucket(self._s.forgets_per_minute / 60, self._s.forgets_per_minute)).take(
                f"more than {self._s.forgets_per_minute} forgets per minute")

    @contextlib.contextmanager
    def reading(self, tenant: str | None):
        """One request of ``tenant`` reading the stores, in flight for the block."""
        if tenant is None:
            yield
            return
        if self._in_flight.get(tenant, 0) >= self._s.concurrent:
            raise Limited(f"more than {self._s.concurrent} requests reading the stores at once", 1.0)
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        try:
            yield
        finally:
            self._in_flight[tenant] -= 1
            if not self._in_flight[tenant]:
                del self._in_flight[tenant]
