"""One read's channels and lanes: each channel degrades alone; a lane runs its channels one
after another on one connection."""
from __future__ import annotations

import asyncio
import contextlib
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
    its traceback) and how long each took (``timings``, ms). With ``deadline_s``, every channel
    and every wait for a connection ends that many seconds after the read began: a store that
    stops answering, or a pool with no connection to give, degrades its channels, never hangs
    the read (the server's statement timeout covers neither)."""

    def __init__(self, pool: asyncpg.Pool, deadline_s: float | None = None):
        self._pool = pool
        self._deadline = None if deadline_s is None else asyncio.get_running_loop().time() + deadline_s
        self.got: dict[str, Any] = {}
        self.degraded: list[str] = []
        self.timings: dict[str, float] = {}

    async def channel(self, name: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T | None:
        t = time.perf_counter()
        with tracer.start_as_current_span(f"memstream.read.{name}") as span:
            try:
                async with asyncio.timeout_at(self._deadline):
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
            await asyncio.wait([after], timeout=self._left())
        try:
            async with self._acquired(pool or self._pool) as conn:
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

    @contextlib.asynccontextmanager
    async def _acquired(self, pool: asyncpg.Pool):
        async with asyncio.timeout_at(self._deadline):
            conn = await pool.acquire()
        async with _dropped_if_cancelled(pool, conn, self._past_deadline):
            yield conn

    def _left(self) -> float | None:
        """Seconds to the deadline (None: no deadline)."""
        return None if self._deadline is None else max(self._deadline - asyncio.get_running_loop().time(), 0.0)

    def _past_deadline(self) -> bool:
        # A channel cut short by the deadline leaves its statement's cancel in flight on the connection.
        return self._left() == 0.0

    async def into(self, name: str, value: Awaitable[Any]) -> None:
        self.got[name] = await value


@contextlib.asynccontextmanager
async def _dropped_if_cancelled(pool: asyncpg.Pool, conn: asyncpg.Connection, cut_short: Callable[[], bool] = bool):
    """Gives ``conn`` back to ``pool``; if what used it was cancelled (or ``cut_short()``: by a
    deadline), terminated first: asyncpg would otherwise wait, on release, for the server to
    confirm the cancel — and a server that stopped answering never does."""
    try:
        yield
    except asyncio.CancelledError:
        conn.terminate()
        raise
    finally:
        if cut_short() and not conn.is_closed():
            conn.terminate()
        await pool.release(conn)


class Bounded:
    """``pool``'s ``fetch``/``fetchrow``/``fetchval``, each on a connection dropped if the call is
    cancelled (``_dropped_if_cancelled``): for statements a deadline may cut short."""

    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    async def _on_one(self, method: str, *args):
        conn = await self._pool.acquire()
        async with _dropped_if_cancelled(self._pool, conn):
            return await getattr(conn, method)(*args)

    async def fetch(self, *args):
        return await self._on_one("fetch", *args)

    async def fetchrow(self, *args):
        return await self._on_one("fetchrow", *args)

    async def fetchval(self, *args):
        return await self._on_one("fetchval", *args)
