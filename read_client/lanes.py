"""One read's channels and lanes: each channel degrades alone; a lane runs its channels one
after another on one connection."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, TypeVar

import asyncpg
from opentelemetry.trace import Status, StatusCode

from memstream.read_client.metrics import tracer

log = logging.getLogger("memstream.read")

T = TypeVar("T")


class Channels:
    """What one read's channels returned (``got``), which failed (``degraded``, each logged with
    its traceback) and how long each took (``timings``, ms)."""

    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool
        self.got: dict[str, Any] = {}
        self.degraded: list[str] = []
        self.timings: dict[str, float] = {}

    async def channel(self, name: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T | None:
        t = time.perf_counter()
        with tracer.start_as_current_span(f"memstream.read.{name}") as span:
            try:
                return await fn(*args)
            except Exception as exc:
                log.exception("read channel %s failed; its section is empty", name)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, "degraded"))
                self.degraded.append(name)
                return None
            finally:
                self.timings[name] = (time.perf_counter() - t) * 1000

    async def lane(self, steps: list[tuple], after: asyncio.Future | None = None, pool: asyncpg.Pool | None = None,
                   ready: dict[str, asyncio.Event] | None = None) -> None:
        """Runs ``(name, fn, *args)`` channels in order on one connection of ``pool`` (default: the
        custom-plan one); ``fn(conn, *args)``. With ``after``, takes the connection only once that
        future is done (whatever its outcome). ``ready[name]`` is set once that channel has its
        result in ``got`` or the lane has ended without it."""
        if after is not None:
            await asyncio.wait([after])
        try:
            async with (pool or self._pool).acquire() as conn:
                for name, fn, *args in steps:
                    self.got[name] = await self.channel(name, fn, conn, *args)
                    if ready and name in ready:
                        ready[name].set()
        except Exception:
            log.exception("no Postgres connection for channels %s; their sections are empty", [n for n, *_ in steps])
            self.degraded.extend(n for n, *_ in steps if n not in self.got)
        finally:
            for event in (ready or {}).values():
                event.set()

    async def into(self, name: str, value: Awaitable[Any]) -> None:
        self.got[name] = await value
