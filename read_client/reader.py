"""``MemoryReader``: the synchronous read path. No LLM, no Faust, no writes."""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, TypeVar

import asyncpg
import redis.asyncio as aioredis

from memstream.embedding import Embedder, default_embedder
from memstream.projections import db, session_cache
from memstream.projections.episodes import query as episodes_q
from memstream.projections.facts import query as facts_q
from memstream.read_client.fusion import EPISODE_WEIGHTS, FACT_WEIGHTS, Weights, fact_importance, fact_type, fuse, rerank
from memstream.schemas import LogPosition
from memstream.schemas.read_models import FactVersion, MemoryContext, RankedEpisode, RankedFact, Turn

log = logging.getLogger("memstream.read")

T = TypeVar("T")
ANN_CANDIDATES = 20  # the first stage of the funnel: ANN / keyword top-k before the rerank


class MemoryReader:
    """Assembles ``MemoryContext`` for ``(user_id, conversation_id, message)``.

    Contract:
    * ``read`` never raises because a store or channel failed: the failure is logged with its
      traceback on ``memstream.read``, that section comes back empty and its name is listed in
      ``MemoryContext.degraded``. Invalid arguments raise ``ValueError`` at once.
    * ``after=LogPosition`` (as returned by ``TurnLog.append``) makes the read wait, up to
      ``wait_timeout`` seconds, until the episodes projection has applied that position, so a
      host reads its own writes. On timeout the read proceeds with ``caught_up=False``.
    * One query embedding per read, shared by every vector channel; channels run concurrently.
    """

    def __init__(self, *, pool: asyncpg.Pool, redis: aioredis.Redis | None, embedder: Embedder,
                 schema: str, tier0_turns: int = 20, episode_weights: Weights = EPISODE_WEIGHTS,
                 fact_weights: Weights = FACT_WEIGHTS):
        self._pool, self._redis, self._embedder = pool, redis, embedder
        self._schema, self._tier0 = schema, tier0_turns
        self._episode_weights, self._fact_weights = episode_weights, fact_weights
        self._epoch: int | None = None

    @classmethod
    async def connect(cls, settings, dsn: str, *, embedder: Embedder | None = None) -> MemoryReader:
        pool = await db.create_pool(dsn, settings.postgres_schema, min_size=2, max_size=8)
        redis = aioredis.from_url(settings.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
        return cls(pool=pool, redis=redis, embedder=embedder or default_embedder(settings.embed_threads),
                   schema=settings.postgres_schema, tier0_turns=settings.tier0_turns)

    async def close(self) -> None:
        await self._pool.close()
        if self._redis is not None:
            await self._redis.aclose()

    async def read(self, user_id: str, conversation_id: str, message: str, *,
                   after: LogPosition | None = None, k: int = 5, k_facts: int = 10, wait_timeout: float = 5.0,
                   now: datetime | None = None) -> MemoryContext:
        if not user_id or not conversation_id:
            raise ValueError("user_id and conversation_id are required")
        if k < 1:
            raise ValueError("k must be >= 1")
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        ctx = MemoryContext(user_id=user_id, conversation_id=conversation_id, message=message)
        if after is not None:
            ctx.caught_up = await self._wait_for(after, wait_timeout)
            timings["wait"] = (time.perf_counter() - t0) * 1000
        now = now or datetime.now(timezone.utc)

        async def embedded():
            t = time.perf_counter()
            vec = (await asyncio.to_thread(self._embedder.embed, [message]))[0]
            timings["embed"] = (time.perf_counter() - t) * 1000
            return vec

        embedding = asyncio.ensure_future(embedded())
        degraded: list[str] = []
        recent, vector, keyword, fact_vec, fact_kw = await asyncio.gather(
            self._channel("recent_turns", degraded, timings, self._recent_turns, user_id, conversation_id),
            self._channel("episodes_vector", degraded, timings, self._nearest, episodes_q, user_id, embedding),
            self._channel("episodes_keyword", degraded, timings, self._keyword, episodes_q, user_id, message),
            self._channel("facts_vector", degraded, timings, self._nearest, facts_q, user_id, embedding),
            self._channel("facts_keyword", degraded, timings, self._keyword, facts_q, user_id, message),
        )
        ctx.recent_turns = recent or []
        ranked = rerank(fuse({"vector": vector or [], "keyword": keyword or []}, "episode_id"),
                        now, self._episode_weights, n_channels=2)
        ctx.episodes = [
            RankedEpisode(**{c: s.cand.row[c] for c in ("episode_id", "conversation_id", "occurred_at",
                                                         "user_message", "assistant_message")},
                          score=round(s.score, 6), relevance=round(s.relevance, 6), recency=round(s.recency, 6),
                          channels=s.cand.channels)
            for s in ranked[:k]
        ]
        facts = rerank(fuse({"vector": fact_vec or [], "keyword": fact_kw or []}, "fact_id"), now,
                       self._fact_weights, n_channels=2, time_key="last_observed_at",
                       importance=fact_importance, type_weight=fact_type)
        ctx.facts = [
            RankedFact(**{c: s.cand.row[c] for c in ("fact_id", "text", "category", "attribute", "value", "confidence",
                                                     "explicit", "observation_count", "valid_from", "recorded_at")},
                       score=round(s.score, 6), relevance=round(s.relevance, 6), recency=round(s.recency, 6),
                       importance=round(s.importance, 6), type_weight=s.type, channels=s.cand.channels)
            for s in facts[:k_facts]
        ]
        ctx.degraded = degraded
        timings["total"] = (time.perf_counter() - t0) * 1000
        ctx.timings_ms = {name: round(ms, 3) for name, ms in timings.items()}
        log.debug("read %s/%s: %d recent turns, %d facts, %d episodes, degraded=%s, %.1f ms", user_id,
                  conversation_id, len(ctx.recent_turns), len(ctx.facts), len(ctx.episodes), degraded, timings["total"])
        return ctx

    async def _channel(self, name: str, degraded: list[str], timings: dict[str, float],
                       fn: Callable[..., Awaitable[T]], *args: Any) -> T | None:
        t = time.perf_counter()
        try:
            return await fn(*args)
        except Exception:
            log.exception("read channel %s failed; its section is empty", name)
            degraded.append(name)
            return None
        finally:
            timings[name] = (time.perf_counter() - t) * 1000

    async def _wait_for(self, after: LogPosition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        delay = 0.002
        while True:
            try:
                applied = await episodes_q.applied_through(self._pool, "episodes", after.topic, after.partition)
                if applied > after.offset:
                    return True
            except Exception:
                log.exception("could not read projection positions while waiting for %s", after)
            if time.monotonic() >= deadline:
                log.warning("read-your-writes wait for %s timed out after %.1fs", after, timeout)
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _recent_turns(self, user_id: str, conversation_id: str) -> list[Turn]:
        if self._redis is not None:
            try:
                if self._epoch is None:
                    self._epoch = await episodes_q.epoch(self._pool)
                cached = await session_cache.recent_turns(self._redis, self._schema, self._epoch,
                                                          user_id, conversation_id, self._tier0)
                if cached:
                    return [Turn(**t) for t in cached]
            except Exception:
                log.exception("tier 0 cache unavailable; reading recent turns from Postgres")
        rows = await episodes_q.recent(self._pool, user_id, conversation_id, self._tier0)
        return [Turn(**{k: r[k] for k in Turn.model_fields}) for r in rows]

    async def _nearest(self, q, user_id: str, embedding: asyncio.Future) -> list[asyncpg.Record]:
        vec = await embedding
        async with self._pool.acquire() as conn:
            return await q.nearest(conn, user_id, vec, ANN_CANDIDATES, self._embedder.model_id)

    async def _keyword(self, q, user_id: str, message: str) -> list[asyncpg.Record]:
        async with self._pool.acquire() as conn:
            return await q.keyword(conn, user_id, message, ANN_CANDIDATES)

    async def current_facts(self, user_id: str) -> list[asyncpg.Record]:
        """Every fact currently believed about the user (for memory views and tools)."""
        return list(await facts_q.current(self._pool, user_id))

    async def fact_history(self, user_id: str, fact_id) -> list[FactVersion]:
        """Every version of the fact's lineage, oldest first: what was believed, when and why."""
        rows = await facts_q.history(self._pool, user_id, fact_id)
        return [FactVersion(**{k: r[k] for k in FactVersion.model_fields}) for r in rows]
