"""``MemoryReader``: the synchronous read path. No LLM, no Faust, no writes."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, TypeVar

import asyncpg
import redis.asyncio as aioredis

from memstream.embedding import Embedder, default_embedder
from memstream.projections import db, positions, session_cache
from memstream.projections.episodes import query as episodes_q
from memstream.projections.facts import query as facts_q
from memstream.projections.commands import query as commands_q
from memstream.projections.graph import query as graph_q
from memstream.projections.profile import query as profile_q
from memstream.read_client.budget import Budgets, TokenCounter, pack
from memstream.read_client.retrieval_gate import needs_retrieval
from memstream.read_client.terms import keyword_terms
from memstream.read_client.render import edge_line, episode_line, render_context
from memstream.read_client.fusion import (EPISODE_WEIGHTS, FACT_WEIGHTS, Weights, fact_importance, fact_type, fuse,
                                         latest_per_slot, rerank, with_neighbours)
from memstream.schemas import LogPosition
from memstream.schemas.vocabulary import canonical, single_valued
from memstream.schemas.errors import not_utf8
from memstream.schemas.read_models import (AsOf, FactVersion, MemoryContext, RankedEdge, RankedEpisode, RankedFact,
                                           Reminder, Turn)

log = logging.getLogger("memstream.read")

T = TypeVar("T")
ANN_CANDIDATES = 20  # the first stage of the funnel: ANN / keyword top-k before the rerank
EDGE_CANDIDATES = 10  # directly matched edges
HOP_LIMIT = 20  # edges pulled in by one-hop expansion, at most
HOP_DISCOUNT = 0.5  # an expanded edge scores at most half its best connected direct match
# What a turn or command changes, each with its position on the events topic: ``after=`` waits for all.
READ_YOUR_WRITES = ("episodes", "facts", "graph", "commands")


class MemoryReader:
    """Assembles ``MemoryContext`` for ``(user_id, conversation_id, message)``.

    Contract:
    * ``read`` never raises because a store or channel failed: the failure is logged with its
      traceback on ``memstream.read``, that section comes back empty and its name is listed in
      ``MemoryContext.degraded``. Invalid arguments raise ``ValueError`` at once; a read on a
      closed reader raises ``RuntimeError``.
    * ``after=LogPosition`` (as returned by ``TurnLog.append``) makes the read wait, up to
      ``wait_timeout`` seconds, until every projection a turn or command changes (episodes,
      facts, graph, commands) has applied what formation made of that position, so a host
      reads its own writes. On timeout the read proceeds with ``caught_up=False``.
    * A context never holds two current values of one single-valued attribute, nor two
      versions of one fact, even when its channels' statements straddle a projection's commit.
    * One query embedding per read, shared by every vector channel.

    ``pool`` plans every statement for its parameters (the vector searches need it: HNSW for a
    big user, the user's rows sorted for a small one). ``text_pool``, if given, is a
    ``generic_plans`` pool for the statements whose plan fits every user (keyword, identities,
    reminders, adjacent turns; recent turns and the profile when their caches miss): planned once
    per connection instead of on every read.
    """

    def __init__(self, *, pool: asyncpg.Pool, redis: aioredis.Redis | None, embedder: Embedder,
                 schema: str, tier0_turns: int = 20, episode_weights: Weights = EPISODE_WEIGHTS,
                 fact_weights: Weights = FACT_WEIGHTS, edge_candidates: int = EDGE_CANDIDATES,
                 budgets: Budgets = Budgets(), keyword_mode: str = "words", text_pool: asyncpg.Pool | None = None):
        if keyword_mode not in ("words", "names"):
            raise ValueError("keyword_mode is 'words' or 'names'")
        self._edge_candidates, self._budgets, self._keyword_mode = edge_candidates, budgets, keyword_mode
        self._tokens = TokenCounter()
        self._pool, self._redis, self._embedder = pool, redis, embedder
        self._text_pool = text_pool or pool
        self._schema, self._tier0 = schema, tier0_turns
        self._episode_weights, self._fact_weights = episode_weights, fact_weights
        self._closed = False
        self._epoch: int | None = None
        self._profile_epoch: int | None = None
        # One embedding at a time: onnxruntime already uses every core it is given, and
        # concurrent runs would oversubscribe them and starve the event loop.
        self._embed_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-embed")

    @classmethod
    async def connect(cls, settings, dsn: str | None = None, *, embedder: Embedder | None = None) -> MemoryReader:
        """A reader on its own pools and Redis client, with the weights, budgets and keyword mode
        of ``settings.read_*``. ``dsn`` defaults to ``settings.dsn()``: ``postgres_dsn``, or the
        local stack's socket."""
        dsn = dsn or settings.dsn()
        # A read has a latency budget: a statement stuck behind a lock fails its channel, not the read.
        pool = await db.create_pool(dsn, settings.postgres_schema, min_size=2, max_size=8, statement_timeout_ms=1000)
        # Fixed size and planned at connect: a new connection's first keyword statements cost
        # ~50 ms of planning, which no read should wait for.
        try:
            text_pool = await db.create_pool(dsn, settings.postgres_schema, min_size=8, max_size=8,
                                             statement_timeout_ms=1000, generic_plans=True, prepare=cls.prepare_text_lane)
        except BaseException:
            await pool.close()
            raise
        redis = aioredis.from_url(settings.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
        return cls(pool=pool, redis=redis, embedder=embedder or default_embedder(settings.read_embed_threads, settings.embedding_variant),
                   schema=settings.postgres_schema, tier0_turns=settings.tier0_turns, text_pool=text_pool,
                   fact_weights=settings.read_fact_weights, episode_weights=settings.read_episode_weights,
                   budgets=settings.read_budgets, keyword_mode=settings.read_keyword_mode)

    @staticmethod
    async def prepare_text_lane(conn: asyncpg.Connection) -> None:
        """Runs the text lane's statements once on a new ``text_pool`` connection (``create_pool``'s
        ``prepare``): with generic plans each is planned at its first execution, the keyword ones
        over every partition (~50 ms), and a read should not be that first execution. Best
        effort: a statement that cannot be planned now (its table locked, say) is left to the
        first read that runs it, and the connection is used all the same."""
        statements = [("facts keyword", facts_q.keyword, "", "memory", 1),
                      ("episodes keyword", episodes_q.keyword, "", "memory", 1),
                      ("person identity", commands_q.person_identity, ""),
                      ("due reminders", commands_q.due_reminders, "", datetime.now(timezone.utc)),
                      ("expert identity", commands_q.expert_identity, ""),
                      ("adjacent turns", episodes_q.neighbours, "", []),
                      ("recent turns", episodes_q.recent, "", "", 1)]
        await conn.execute("SET lock_timeout = '50ms'")
        try:
            for name, fn, *args in statements:
                try:
                    await fn(conn, *args)
                except asyncpg.PostgresError as exc:
                    log.info("%s not planned ahead on a new connection: %s", name, exc)
        finally:
            await conn.execute("RESET lock_timeout")

    async def close(self) -> None:
        self._closed = True
        self._embed_pool.shutdown(wait=False)
        await self._pool.close()
        if self._text_pool is not self._pool:
            await self._text_pool.close()
        if self._redis is not None:
            await self._redis.aclose()

    async def read(self, user_id: str, conversation_id: str, message: str, *,
                   after: LogPosition | None = None, k: int = 5, k_facts: int = 10, k_edges: int = 8,
                   wait_timeout: float = 5.0, now: datetime | None = None,
                   as_of: AsOf | datetime | None = None, identity_id: str | None = None,
                   budgets: Budgets | None = None) -> MemoryContext:
        if self._closed:
            # A usage error, not a failing store: otherwise every section came back degraded.
            raise RuntimeError("this MemoryReader is closed")
        _check_args(user_id, conversation_id, message, after=after, k=k, k_facts=k_facts, k_edges=k_edges,
                    wait_timeout=wait_timeout, now=now, as_of=as_of, identity_id=identity_id, budgets=budgets)
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        ctx = MemoryContext(user_id=user_id, conversation_id=conversation_id, message=message)
        if after is not None:
            ctx.caught_up = await self._wait_for(after, wait_timeout)
            timings["wait"] = (time.perf_counter() - t0) * 1000
        now = now or datetime.now(timezone.utc)
        if isinstance(as_of, datetime):
            as_of = AsOf(valid_time=as_of, recorded_time=as_of)
        if as_of is not None:
            recorded = as_of.recorded_time or now
            as_of = AsOf(valid_time=as_of.valid_time or recorded, recorded_time=recorded)
            ctx.as_of = as_of

        async def embedded():
            t = time.perf_counter()
            vec = (await asyncio.get_running_loop().run_in_executor(self._embed_pool, self._embedder.embed, [message]))[0]
            timings["embed"] = (time.perf_counter() - t) * 1000
            return vec

        degraded: list[str] = []
        ctx.gated = not needs_retrieval(message)
        embedding = None if ctx.gated else asyncio.ensure_future(embedded())
        # The text lane runs its channels one after another on one connection while the query is
        # embedded (on two cores, more concurrent statements only queued for the same cores: each
        # ran 3-5x slower), keyword first so that little of it is left when the vector channels
        # start; once the embedding is there, edges (the longest) run beside the two nearest
        # searches, one after the other (each order: 0.3-0.6 ms better p50, interleaved A/B), and
        # the adjacent turns of the best episodes follow those.
        text_lane = [("person_identity", commands_q.person_identity, user_id),
                     ("due_reminders", commands_q.due_reminders, user_id, now)]
        if identity_id is not None:
            text_lane.append(("expert_identity", commands_q.expert_identity, identity_id))
        if not ctx.gated:
            kw = [("facts_keyword", self._keyword, facts_q, user_id, message),
                  ("episodes_keyword", self._keyword, episodes_q, user_id, message)]
            text_lane = kw + text_lane
            fv = ("facts_vector", self._nearest, facts_q, user_id, embedding)
            ev = ("episodes_vector", self._nearest, episodes_q, user_id, embedding)
            ed = ("edges", self._edges, user_id, embedding, as_of, k_edges)
        got: dict[str, Any] = {}
        w = self._episode_weights
        keyword_ready = {"episodes_keyword": asyncio.Event()}
        episodes: list = []

        async def episodes_lane(steps: list[tuple]) -> None:
            # Anchors need only this lane and the episodes keyword channel (the text lane's second),
            # not edges: their adjacent turns are fetched while edges still runs (heavy p95 -0.5 to
            # -0.9 ms, interleaved A/B).
            nonlocal episodes
            await self._lane(steps, got, degraded, timings, after=embedding)
            await keyword_ready["episodes_keyword"].wait()
            episodes = fuse({"vector": got.get("episodes_vector") or [], "keyword": got.get("episodes_keyword") or []},
                            "episode_id", keyword_share=w.keyword_share)
            if (w.neighbour_share > 0 or w.reply_share > 0) and episodes:
                anchors = sorted(episodes, key=lambda c: (-c.fused, str(c.key)))[:w.anchors]
                step = ("episode_neighbours", episodes_q.neighbours, user_id, [a.row for a in anchors])
                await self._lane([step], got, degraded, timings, pool=self._text_pool)
                episodes = with_neighbours(episodes, got.get("episode_neighbours") or [], "episode_id",
                                           w.neighbour_share, w.reply_share)

        await asyncio.gather(
            self._lane(text_lane, got, degraded, timings, pool=self._text_pool, ready=keyword_ready),
            *([self._lane([ed], got, degraded, timings, after=embedding), episodes_lane([fv, ev])]
              if not ctx.gated else []),
            self._into(got, "recent_turns", self._channel("recent_turns", degraded, timings, self._recent_turns,
                                                          user_id, conversation_id)),
            self._into(got, "profile", self._channel("profile", degraded, timings, self._profile, user_id)))
        if embedding is not None:
            embedding.exception()  # retrieved: a failed embedding is logged by the channels that needed it
        ctx.profile, ctx.person_identity = got.get("profile") or {}, got.get("person_identity")
        ctx.expert_identity = got.get("expert_identity")
        ctx.due_reminders = [Reminder(**r) for r in got.get("due_reminders") or []]
        ctx.recent_turns = got.get("recent_turns") or []
        facts = rerank(latest_per_slot(fuse({"vector": got.get("facts_vector") or [], "keyword": got.get("facts_keyword") or []},
                                            "fact_id", keyword_share=self._fact_weights.keyword_share), single_valued), now,
                       self._fact_weights, time_key="last_observed_at",
                       importance=fact_importance, type_weight=fact_type)
        ctx.facts = [
            RankedFact(**{c: s.cand.row[c] for c in ("fact_id", "text", "category", "attribute", "value", "confidence",
                                                     "explicit", "observation_count", "valid_from", "recorded_at")},
                       score=round(s.score, 6), relevance=round(s.relevance, 6), recency=round(s.recency, 6),
                       importance=round(s.importance, 6), type_weight=s.type, channels=s.cand.channels)
            for s in facts[:k_facts]
        ]
        ranked = rerank(episodes, now, w)
        ctx.episodes = [
            RankedEpisode(**{c: s.cand.row[c] for c in ("episode_id", "conversation_id", "occurred_at",
                                                         "user_message", "assistant_message")},
                          metadata=_json(s.cand.row["metadata"]),
                          score=round(s.score, 6), relevance=round(s.relevance, 6), recency=round(s.recency, 6),
                          channels=s.cand.channels)
            for s in ranked[:k]
        ]
        ctx.edges = got.get("edges") or []
        b = budgets or self._budgets
        ctx.facts, facts_used = pack(ctx.facts, lambda f: f.text, b.facts, self._tokens)
        ctx.episodes, episodes_used = pack(ctx.episodes, episode_line, b.episodes, self._tokens)
        ctx.edges, edges_used = pack(ctx.edges, edge_line, b.edges, self._tokens)
        ctx.tokens = {"facts": facts_used, "episodes": episodes_used, "edges": edges_used}
        ctx.degraded = degraded
        timings["total"] = (time.perf_counter() - t0) * 1000
        ctx.timings_ms = {name: round(ms, 3) for name, ms in timings.items()}
        log.debug("read %s/%s: gated=%s profile=%d recent=%d facts=%d episodes=%d edges=%d reminders=%d "
                  "identity=%s/%s degraded=%s %.1f ms", user_id, conversation_id, ctx.gated, len(ctx.profile),
                  len(ctx.recent_turns), len(ctx.facts), len(ctx.episodes), len(ctx.edges), len(ctx.due_reminders),
                  ctx.person_identity is not None, ctx.expert_identity is not None, degraded, timings["total"])
        if log.isEnabledFor(logging.DEBUG):
            log.debug("memory prompt for %s/%s:\n%s", user_id, conversation_id, render_context(ctx))
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

    async def _lane(self, steps: list[tuple], got: dict[str, Any], degraded: list[str], timings: dict[str, float],
                    after: asyncio.Future | None = None, pool: asyncpg.Pool | None = None,
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
                    got[name] = await self._channel(name, degraded, timings, fn, conn, *args)
                    if ready and name in ready:
                        ready[name].set()
        except Exception:
            log.exception("no Postgres connection for channels %s; their sections are empty", [n for n, *_ in steps])
            degraded.extend(n for n, *_ in steps if n not in got)
        finally:
            for event in (ready or {}).values():
                event.set()

    @staticmethod
    async def _into(got: dict[str, Any], name: str, value: Awaitable[Any]) -> None:
        got[name] = await value

    async def _wait_for(self, after: LogPosition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        delay, failed = 0.002, 0
        while True:
            try:
                if await positions.applied_through(self._pool, READ_YOUR_WRITES, after.topic, after.partition) > after.offset:
                    return True
            except Exception:
                # Once with its traceback: a server down or restarting would otherwise log every 50 ms.
                if not failed:
                    log.exception("could not read projection positions while waiting for %s", after)
                failed += 1
            if time.monotonic() >= deadline:
                log.warning("read-your-writes wait for %s timed out after %.1fs (%d failed position reads)",
                            after, timeout, failed)
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _recent_turns(self, user_id: str, conversation_id: str) -> list[Turn]:
        if self._redis is not None:
            try:
                if self._epoch is None:
                    self._epoch = await positions.epoch(self._pool, "episodes")
                cached = await session_cache.recent_turns(self._redis, self._schema, self._epoch,
                                                          user_id, conversation_id, self._tier0)
                if cached:
                    return [Turn(**t) for t in cached]
            except Exception:
                log.exception("tier 0 cache unavailable; reading recent turns from Postgres")
        rows = await episodes_q.recent(self._text_pool, user_id, conversation_id, self._tier0)
        return [Turn(**{k: r[k] for k in Turn.model_fields}) for r in rows]

    async def _profile(self, user_id: str) -> dict:
        if self._profile_epoch is None:
            self._profile_epoch = await positions.epoch(self._text_pool, "profile")
        try:
            return await profile_q.read(self._redis, self._text_pool, self._schema, self._profile_epoch, user_id)
        except Exception:
            log.exception("tier 1 cache unavailable; reading the profile from Postgres")
            return await profile_q.read(None, self._text_pool, self._schema, self._profile_epoch, user_id)

    async def _nearest(self, conn, q, user_id: str, embedding: asyncio.Future) -> list[asyncpg.Record]:
        vec = await embedding
        return await q.nearest(conn, user_id, vec, ANN_CANDIDATES, self._embedder.model_id)

    async def _keyword(self, conn, q, user_id: str, message: str) -> list[asyncpg.Record]:
        text = message
        if self._keyword_mode == "names":
            text = " ".join(keyword_terms(message))
            if not text:
                return []  # nothing an embedding would blur: the vector channels cover it
        return await q.keyword(conn, user_id, text, ANN_CANDIDATES)

    async def _edges(self, conn, user_id: str, embedding: asyncio.Future, as_of: AsOf | None, k: int) -> list[RankedEdge]:
        """Current edges by fact-sentence similarity plus a bounded one-hop expansion around the
        matched entities, reranked together; or, with ``as_of``, the graph as it was."""
        vec = await embedding
        if as_of is not None:
            rows = await graph_q.as_of(conn, user_id, as_of.valid_time, as_of.recorded_time, vec, k)
            return [_edge(r, hop=0, score=1.0 - float(r["distance"])) for r in rows]
        rows = await graph_q.nearest_with_hops(conn, user_id, vec, self._edge_candidates, HOP_LIMIT,
                                               self._embedder.model_id)
        direct, hops = [r for r in rows if r["hop"] == 0], [r for r in rows if r["hop"] == 1]
        scored = [(1.0 - float(r["distance"]), 0, r) for r in direct]
        best_via = {}
        for r in direct:
            for e in (r["source_entity_id"], r["target_entity_id"]):
                if e is not None:
                    best_via[e] = max(best_via.get(e, 0.0), 1.0 - float(r["distance"]))
        for r in hops:
            via = max(best_via.get(r["source_entity_id"], 0.0), best_via.get(r["target_entity_id"], 0.0))
            # Reranked, not equally relevant: bounded by the connecting match, plus its own similarity.
            scored.append((HOP_DISCOUNT * via * (0.5 + 0.5 * max(0.0, 1.0 - float(r["distance"]))), 1, r))
        # Rounded as RankedEdge rounds it, so the order is the one its fields show; only the k kept are built.
        scored.sort(key=lambda t: (-round(t[0], 6), t[1], str(t[2]["edge_id"])))
        return [_edge(r, hop=hop, score=score) for score, hop, r in scored[:k]]

    async def timeline(self, user_id: str, source_entity_id, relation: str) -> list[RankedEdge]:
        """Every edge of one (source, relation), in world-time order."""
        rows = await graph_q.timeline(self._pool, user_id, source_entity_id, canonical(relation))
        return [_edge(r, hop=0, score=0.0, similarity=0.0) for r in rows]

    async def current_facts(self, user_id: str) -> list[asyncpg.Record]:
        """Every fact currently believed about the user (for memory views and tools)."""
        return list(await facts_q.current(self._pool, user_id))

    async def fact_history(self, user_id: str, fact_id) -> list[FactVersion]:
        """Every version of the fact's lineage, oldest first: what was believed, when and why."""
        rows = await facts_q.history(self._pool, user_id, fact_id)
        return [FactVersion(**{k: r[k] for k in FactVersion.model_fields}) for r in rows]


def _check_args(user_id, conversation_id, message, *, after, k, k_facts, k_edges, wait_timeout, now, as_of,
                identity_id, budgets) -> None:
    """``read``'s arguments, refused before any I/O with what is wrong: a bad one would otherwise
    surface as degraded sections (a non-string id, a NUL character or a lone surrogate in the
    message), a silently wrong result (a negative k) or an exception from the middle of ranking
    (a naive ``now``)."""
    for name, value in (("user_id", user_id), ("conversation_id", conversation_id)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} is required: a non-empty string, not {value!r}")
    if not isinstance(message, str):
        raise ValueError(f"message must be a string, not {type(message).__name__}")
    for name, value in (("user_id", user_id), ("conversation_id", conversation_id), ("message", message),
                        ("identity_id", identity_id)):
        if isinstance(value, str):
            _storable(name, value)
    for name, value, least in (("k", k, 1), ("k_facts", k_facts, 0), ("k_edges", k_edges, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")
    if after is not None and not isinstance(after, LogPosition):
        raise ValueError(f"after must be the LogPosition an append returned, not {type(after).__name__}")
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)) or not wait_timeout >= 0:
        raise ValueError(f"wait_timeout must be a number of seconds >= 0, not {wait_timeout!r}")
    times = [("now", now)]
    if isinstance(as_of, AsOf):
        times += [("as_of.valid_time", as_of.valid_time), ("as_of.recorded_time", as_of.recorded_time)]
    elif as_of is not None:
        times.append(("as_of", as_of))
    for name, value in times:
        if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
            # A naive time would be read in some zone nobody chose: off by hours on both time axes.
            raise ValueError(f"{name} must be a timezone-aware datetime, not {value!r}")
    if identity_id is not None and (not isinstance(identity_id, str) or not identity_id):
        raise ValueError(f"identity_id must be a non-empty string or None, not {identity_id!r}")
    if budgets is not None and not isinstance(budgets, Budgets):
        raise ValueError(f"budgets must be a Budgets, not {type(budgets).__name__}")


def _storable(name: str, text: str) -> None:
    # What Postgres text and the tokenizer can take: the same rule as the producer's for turns.
    if "\x00" in text:
        raise ValueError(f"{name} must not contain NUL characters")
    if why := not_utf8(text):
        raise ValueError(f"{name} is not valid Unicode: {why}")


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def _edge(r, *, hop: int, score: float, similarity: float | None = None) -> RankedEdge:
    return RankedEdge(
        edge_id=r["edge_id"], fact_sentence=r["fact_sentence"], relation=r["relation"], source=r["source_name"],
        target=r["target_name"], valid_from=r["valid_from"], valid_to=r["valid_to"], recorded_at=r["recorded_at"],
        closed_at=r["closed_at"], hop=hop, score=round(score, 6),
        similarity=round(similarity if similarity is not None else 1.0 - float(r["distance"]), 6))
