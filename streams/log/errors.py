"""The stream side's errors, and the one seam where other libraries' errors become ours."""
from __future__ import annotations

import asyncio
import logging

import asyncpg
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from memstream.projections.redaction import refusal
from memstream.schemas.errors import MemstreamError, Retryable

log = logging.getLogger("memstream.streams")

# Postgres conditions that pass: the connection, the server restarting or too busy, a lock
# conflict resolved by retrying the transaction, a statement cancelled by a timeout.
_PASSING_POSTGRES = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
                     asyncpg.TooManyConnectionsError, asyncpg.SerializationError, asyncpg.DeadlockDetectedError,
                     asyncpg.QueryCanceledError, asyncpg.AdminShutdownError)


class BrokerUnavailable(Retryable, ConnectionError):
    """Kafka could not be reached (or did not acknowledge) within the configured timeout."""


class KeyStoreUnavailable(Retryable, ConnectionError):
    """The key store (Postgres) could not be reached to seal or open a user's records."""


class Transient(Retryable):
    """Another library's passing error (its original is the ``__cause__``)."""


def as_retryable(exc: BaseException) -> BaseException:
    """``exc`` as memstream sees it: ours as they are; another library's passing condition (a
    Postgres connection or lock conflict, a Kafka error Kafka itself marks retriable, a socket
    error or timeout) as ``Transient``; anything else unchanged (the worker stops on it)."""
    if isinstance(exc, MemstreamError):
        return exc
    if (isinstance(exc, _PASSING_POSTGRES) or (isinstance(exc, KafkaError) and exc.retriable)
            or isinstance(exc, (ConnectionError, OSError, asyncio.TimeoutError))):
        # Not str(exc): a database error's DETAIL quotes rows, and this text is logged.
        return Transient(refusal(exc) if isinstance(exc, asyncpg.PostgresError) else f"{type(exc).__name__}: {exc}")
    return exc


async def retried(what: str, attempt_once):
    """``attempt_once()``, again after each ``Retryable`` error (with backoff and full jitter: what
    failed together does not come back together), until it succeeds; any other error is raised
    as it is (``as_retryable`` decides which is which)."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(Retryable), wait=wait_random_exponential(multiplier=0.2, max=10),
        before_sleep=lambda rs: log.warning("%s: retrying: %r", what, rs.outcome.exception()),
        reraise=True,
    ):
        with attempt:
            return await as_retryable_call(attempt_once)


async def as_retryable_call(attempt_once):
    """``await attempt_once()``, its error raised as ``as_retryable`` sees it."""
    try:
        return await attempt_once()
    except Exception as exc:
        if (ours := as_retryable(exc)) is exc:
            raise
        raise ours from exc
