"""The Redis client of workers and readers: a lost connection is retried once, on a new one.

After a Redis restart a pooled connection whose close the client has not noticed yet fails its
next command without the retry: a worker's Tier 0 write would be remembered as stale, a read
degraded (both seen in tests). The pool's own reconnect on checkout covers only the closes it
noticed.
A timeout is not retried: a hung Redis would hold a worker's batch, or a read, twice as long.
"""
from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as LostConnection


def connect(url: str, *, timeout_s: float, connect_timeout_s: float | None = None) -> aioredis.Redis:
    return aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s or timeout_s,
                             retry=Retry(NoBackoff(), 1, supported_errors=(LostConnection,)))
