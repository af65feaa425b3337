"""Retrying one model call: throttling and transient service errors, with exponential backoff
and full jitter (callers throttled together must not come back together). The retry waits in
the caller's own task: other users' calls go on meanwhile."""
from __future__ import annotations

import logging
from typing import Awaitable, Callable, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from memstream.llm.protocols import Throttled

log = logging.getLogger("memstream.llm")

T = TypeVar("T")


async def retrying(call: Callable[[], Awaitable[T]], *, retry_if: Callable[[BaseException], bool] | None = None,
                   attempts: int = 6, backoff: float = 0.5, cap: float = 20.0, what: str = "model call") -> T:
    """``call()``, again after a backoff while it raises what ``retry_if`` accepts (default:
    ``Throttled``), at most ``attempts`` times; then its error."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(retry_if or (lambda e: isinstance(e, Throttled))),
        wait=wait_random_exponential(multiplier=backoff, max=cap), stop=stop_after_attempt(attempts),
        before_sleep=lambda rs: log.warning("%s: %s; retrying", what, rs.outcome.exception()),
        reraise=True,
    ):
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity reraises")
