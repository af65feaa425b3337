"""``MemoryReader``: the synchronous read path. No LLM, no Faust, no writes."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Sequence

import asyncpg
import redis.asyncio as aioredis

from memstream.embedding import Embedder, embedder_for
from memstream.projections import positions, redis_client, session_cache
from memstream.projections.cache_keys import EPOCH_FRESH_S
from memstream.projections.episodes import query as episodes_q
from memstream.projections.facts import query as facts_q
from memstream.projections.commands import query as commands_q
from memstream.projections.graph import query as graph_q
from memstream.projections.profile import query as profile_q
from memstream.read_client.as_of import EARLIEST, LATEST, believed, both_axes, channel_args, within
from memstream.read_client.browsing import Browsing
from memstream.read_client.memories import ranked_edge
from memstream.read_client.arguments import SEARCH_KINDS, check_position, check_read, check_search
from memstream.read_client.budget import Budgets, TokenCounter, pack, pack_episodes
from memstream.read_client.lanes import Bounded, Channels
from memstream.read_client.metrics import ReadMetrics, tracer
from memstream.read_client.pools import close_pools, connect_pools, prepare_text_lane
from memstream.read_client.retrieval_gate import needs_retrieval
from memstream.read_client.terms import asks_about_now, keyword_terms
from memstream.read_client.render import edge_line, episode_line, render_context
from memstream.read_client.fusion import (EPISODE_WEIGHTS, FACT_WEIGHTS, Weights, fact_importance, fact_type, fuse,
                                         latest_per_slot, rank_edges, rerank, with_neighbours)
from memstream.read_settings import READ_DEADLINE_S
from memstream.schemas import LogPosition
from memstream.schemas.vocabulary import single_valued
from memstream.schemas.errors import InvalidArgument, ReaderClosed
from memstream.schemas.read_models import (AsOf, MemoryContext, RankedEdge,
                                           RankedEpisode, RankedFact, Reminder, SearchResult, Turn)

log = logging.getLogger("memstream.read")

ANN_CANDIDATES = 20  # the first stage of the funnel: ANN / keyword top-k before the rerank
EDGE_CANDIDATES = 10  # directly matched edges
HOP_LIMIT = 20  # edges pulled in by one-hop expansion, at most
# What a turn, request or host record (a "command": reminders, identities) changes, each with its position on the events topic: ``after=`` waits for all.
READ_YOUR_WRITES = ("episodes", "facts", "graph", "commands")
FIRST_LOOK_S = 0.05  # a read-your-writes wait's first look at the positions, at least
PROBE_TIMEOUT_S = 2.0  # a readiness check's wait for each store


class MemoryReader(Browsing):
    """Assembles ``MemoryContext`` for ``(user_id, conversation_id, message)``.

    Contract:
    * ``read`` never raises because a store or channel failed: the failure is logged with its
      traceback on ``memstream.read``, that section comes back empty and its name is listed in
      ``MemoryContext.degraded``. Invalid arguments raise ``InvalidArgument`` (a ``ValueError``)
      at once, before any I/O; a read on a closed reader raises ``ReaderClosed`` (a ``RuntimeError``).
      A store that stops answering holds a read up ``deadline_s`` at most (after any wait below):
      the sections still waiting on it then come back degraded.
    * ``after=LogPosition`` (as returned by ``TurnLog.append``) makes the read wait, up to
      ``wait_timeout`` seconds, until every projection a turn, request or host record changes
      (episodes, facts, graph, commands) has applied what formation made of that position, so a host
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
                 budgets: Budgets = Budgets(), keyword_mode: str = "words", text_pool: asyncpg.Pool | None = None,
                 metrics: ReadMetrics | None = None, deadline_s: float = READ_DEADLINE_S):
        if keyword_mode not in ("words", "names"):
            raise InvalidArgument("keyword_mode is 'words' or 'names'")
        self._edge_candidates, self._budgets, self._keyword_mode = edge_candidates, budgets, keyword_mode
        self._tokens = TokenCounter()
        self._pool, self._redis, self._embedder = pool, redis, embedder
        self._text_pool = text_pool or pool
        # What a read asks of Postgres outside its lanes, under a deadline.
        self._bounded, self._text_bounded = Bounded(pool), Bounded(self._text_pool)
        self._schema, self._tier0 = schema, tier0_turns
        self._episode_weights, self._fact_weights = episode_weights, fact_weights
        self._closed = False
        self._metrics, self._deadline_s = metrics, deadline_s
        self._epochs: dict[str, tuple[int, float]] = {}  # projection -> (epoch, when asked)
        self._looking: dict[tuple[str, int], asyncio.Future] = {}  # read-your-writes look-ups in flight
        # One embedding at a time: onnxruntime already uses every core it is given, and
        # concurrent runs would oversubscribe them and starve the event loop.
        self._embed_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-embed")

    @classmethod
    async def connect(cls, settings, dsn: str | None = None, *, embedder: Embedder | None = None,
                      metrics: ReadMetrics | None = None) -> MemoryReader:
        """A reader on its own pools and Redis client, with the weights, budgets and keyword mode
        of ``settings.read_*``. ``dsn`` defaults to ``settings.dsn()``: ``postgres_dsn``, or the
        local stack's socket. Installs ``redact_logs`` (idempotent): a host's logs then carry no
        database DETAIL of a failing channel either."""
        from memstream.projections.redaction import redact_logs

        redact_logs()
        dsn = dsn or settings.dsn()
        embedder = embedder or embedder_for(settings, settings.read_embed_threads)  # may fail: before any pool
        pool, text_pool = await connect_pools(dsn, settings.postgres_schema, settings.read_deadline_s)
        try:  # a host that retries a failed connect must not leak ten connections a try (Redis's is lazy)
            return cls(pool=pool, redis=redis_client.connect(settings.redis_url, timeout_s=0.5), embedder=embedder,
                       schema=settings.postgres_schema, tier0_turns=settings.tier0_turns, text_pool=text_pool,
                       fact_weights=settings.read_fact_weights, episode_weights=settings.read_episode_weights,
                       budgets=settings.read_budgets, keyword_mode=settings.read_keyword_mode, metrics=metrics,
                       deadline_s=settings.read_deadline_s)
        except BaseException:
            await close_pools(pool, text_pool)
            raise

    prepare_text_lane = staticmethod(prepare_text_lane)

    async def probe(self) -> dict[str, bool | None]:
        """Whether Postgres and Redis answer now (Redis None: not configured), for a readiness
        check. Reads go on without Redis, so only Postgres decides whether a read can be served."""
        async def answers(check) -> bool:
            try:
                await asyncio.wait_for(check(), PROBE_TIMEOUT_S)
                return True
            except Exception:  # noqa: BLE001 - any failure is "not now"; the reason is logged
                log.warning("readiness probe failed", exc_info=True)
                return False

        postgres = answers(lambda: self._pool.fetchval("SELECT 1"))
        if self._redis is None:
            return {"postgres": await postgres, "redis": None}
        pg, rd = await asyncio.gather(postgres, answers(self._redis.ping))
        return {"postgres": pg, "redis": rd}

    async def close(self) -> None:
        self._closed = True
        self._embed_pool.shutdown(wait=False)
        await close_pools(self._pool, self._text_pool)
        if self._redis is not None:
            await self._redis.aclose()

    async def read(self, user_id: str, conversation_id: str, message: str, *,
                   after: LogPosition | None = None, k: int = 5, k_facts: int = 10, k_edges: int = 8,
                   wait_timeout: float = 5.0, now: datetime | None = None,
                   as_of: AsOf | datetime | None = None, identity_id: str | None = None,
                   budgets: Budgets | None = None, include_archived: bool = False) -> MemoryContext:
        """The memory context for ``message`` (the contract above); with ``include_archived``, the
        facts a decay sweep archived compete too (``RankedFact.archived``). ``as_of`` (an ``AsOf``, or a
        time for both axes) is one moment for every section: facts, the profile built from them,
        edges, episodes, reminders and identities as they were then, as believed then; the recent
        turns are left out (``MemoryContext.left_out``). Traced as span
        ``memstream.read`` (a child span per channel) and, with ``metrics``, recorded into the
        host's registry."""
        with tracer.start_as_current_span("memstream.read") as span:
            ctx = await self._read(user_id, conversation_id, message, after=after, k=k, k_facts=k_facts,
                                   k_edges=k_edges, wait_timeout=wait_timeout, now=now, as_of=as_of,
                                   identity_id=identity_id, budgets=budgets, include_archived=include_archived)
            span.set_attributes({"memstream.gated": ctx.gated, "memstream.caught_up": ctx.caught_up,
                                 "memstream.facts": len(ctx.facts), "memstream.episodes": len(ctx.episodes),
                                 "memstream.edges": len(ctx.edges), "memstream.degraded": list(ctx.degraded)})
        if self._metrics is not None:
            self._metrics.observe(ctx.timings_ms, ctx.degraded)
        return ctx

    async def _read(self, user_id: str, conversation_id: str, message: str, *,
                    after: LogPosition | None = None, k: int = 5, k_facts: int = 10, k_edges: int = 8,
                    wait_timeout: float = 5.0, now: datetime | None = None,
                    as_of: AsOf | datetime | None = None, identity_id: str | None = None,
                    budgets: Budgets | None = None, include_archived: bool = False) -> MemoryContext:
        if self._closed:
            # A usage error, not a failing store: otherwise every section came back degraded.
            raise ReaderClosed("this MemoryReader is closed")
        check_read(user_id, conversation_id, message, after=after, k=k, k_facts=k_facts, k_edges=k_edges,
                    wait_timeout=wait_timeout, now=now, as_of=as_of, identity_id=identity_id, budgets=budgets,
                   include_archived=include_archived)
        t0 = time.perf_counter()
        ctx = MemoryContext(user_id=user_id, conversation_id=conversation_id, message=message)
        if after is not None:
            ctx.caught_up = await self._wait_for(after, wait_timeout)
        ch = Channels(self._pool, self._deadline_s)  # the deadline counts from here, after the wait
        got, degraded, timings = ch.got, ch.degraded, ch.timings
        if after is not None:
            timings["wait"] = (time.perf_counter() - t0) * 1000
        now = now or datetime.now(timezone.utc)
        ctx.as_of = as_of = both_axes(as_of, now)

        ctx.gated = not needs_retrieval(message)
        embedding = None if ctx.gated else asyncio.ensure_future(self._embedded(message, timings))
        # The text lane runs its channels one after another on one connection while the query is
        # embedded (on two cores, more concurrent statements only queued for the same cores: each
        # ran several times slower), keyword first so that little of it is left when the vector channels
        # start; once the embedding is there, edges (the longest) run beside the two nearest
        # searches, one after the other (each order measured better, interleaved A/B), and
        # the adjacent turns of the best episodes follow those.
        # As of a moment, every section is that moment (``as_of.channel_args``); the recent turns, a cache of now, are left out.
        if as_of is None:
            text_lane = [("person_identity", commands_q.person_identity, user_id),
                         ("due_reminders", commands_q.due_reminders, user_id, now)]
        else:
            text_lane = [("person_identity", commands_q.person_identity_as_of, user_id, as_of.valid_time),
                         ("due_reminders", commands_q.due_reminders_as_of, user_id, as_of.valid_time)]
            ctx.left_out = ["recent_turns"]
        if identity_id is not None:
            text_lane.append(("expert_identity", commands_q.expert_identity, identity_id,
                              *([as_of.valid_time] if as_of else [])))
        if not ctx.gated:
            n = self._episode_weights.candidates
            facts_at, episodes_at = channel_args(as_of)
            kw = [("facts_keyword", self._keyword, facts_q, user_id, message, ANN_CANDIDATES, *facts_at),
                  ("episodes_keyword", self._keyword, episodes_q, user_id, message, n, *episodes_at)]
            text_lane = kw + text_lane
            fv = ("facts_vector", self._nearest, facts_q, user_id, embedding, ANN_CANDIDATES, *facts_at)
            ev = ("episodes_vector", self._nearest, episodes_q, user_id, embedding, n, *episodes_at)
            ed = ("edges", self._edges, user_id, embedding, as_of, k_edges)
            archived = [("facts_archived", self._nearest, facts_q.Archived, user_id, embedding)] if (
                include_archived and as_of is None) else []  # as of a moment, archived facts are in its versions
        keyword_ready = {"episodes_keyword": asyncio.Event()}
        try:
            await asyncio.gather(
                ch.lane(text_lane, pool=self._text_pool, ready=keyword_ready),
                *([ch.lane([ed, *archived], after=embedding),
                   ch.into("episodes", self._episodes_lane(ch, user_id, [fv, ev], embedding, keyword_ready))]
                  if not ctx.gated else []),
                *([ch.into("recent_turns", ch.channel("recent_turns", self._recent_turns, user_id, conversation_id))]
                  if as_of is None else []),
                ch.into("profile", ch.channel("profile", self._profile, user_id, as_of)))
        finally:
            _settle(embedding)
        ctx.profile, ctx.person_identity = got.get("profile") or {}, got.get("person_identity")
        ctx.expert_identity = got.get("expert_identity")
        ctx.due_reminders = [Reminder(**r) for r in got.get("due_reminders") or []]
        ctx.recent_turns = got.get("recent_turns") or []
        if got.get("facts_archived"):
            got["facts_vector"] = sorted([*(got.get("facts_vector") or []), *got["facts_archived"]],
                                         key=lambda r: (r["distance"], r["fact_id"]))
        ctx.facts = self._ranked_facts(got, now, k_facts)
        ranked = self._ranked_episodes(believed(got.get("episodes") or [], as_of), now, k, message)
        ctx.edges = got.get("edges") or []
        b = budgets or self._budgets
        ctx.facts, facts_used = pack(ctx.facts, lambda f: f.text, b.facts, self._tokens)
        episodes, episodes_used = pack_episodes(ranked, _passages(got.get("episodes") or []), message, b.episodes,
                                                self._tokens, episode_line)
        # In time order within the section: what happened first reads first (the ranking is in ``rank``).
        ctx.episodes = sorted(episodes, key=lambda e: (e.occurred_at, str(e.episode_id)))
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

    async def search(self, user_id: str, query: str, *, kinds: Sequence[str] = SEARCH_KINDS, k: int = 10,
                     as_of: AsOf | datetime | None = None, now: datetime | None = None,
                     since: datetime | None = None, until: datetime | None = None) -> SearchResult:
        """The ``k`` best memories of each of ``kinds`` (facts, episodes, edges) for ``query``,
        ranked as ``read`` ranks them (the same channels, fusion and rerank), without the rest of
        a context: no recent turns, profile, identities or reminders, no retrieval gate, no token
        budgets (episodes come whole). ``as_of`` is one moment for facts, episodes and edges, as in ``read``.
        ``since`` / ``until`` keep episodes that occurred in [since, until): with a larger ``k``
        (up to 100), more of one topic in one period, for questions a context's few episodes
        cannot answer (what happened in order, across sessions, in a summary). Degrades per
        channel as ``read`` does; bad arguments raise ``InvalidArgument`` before any I/O."""
        if self._closed:
            raise ReaderClosed("this MemoryReader is closed")
        check_search(user_id, query, kinds=kinds, k=k, as_of=as_of, now=now, since=since, until=until)
        period = None if since is None and until is None else (since or EARLIEST, until or LATEST)
        with tracer.start_as_current_span("memstream.search") as span:
            t0 = time.perf_counter()
            ch = Channels(self._pool, self._deadline_s)
            now = now or datetime.now(timezone.utc)
            as_of = both_axes(as_of, now)
            embedding = asyncio.ensure_future(self._embedded(query, ch.timings))
            n = max(k, ANN_CANDIDATES, self._episode_weights.candidates)  # the full k, however large
            facts_at, episodes_at = channel_args(as_of, period)
            at = {"facts": facts_at, "episodes": episodes_at}
            text = [(f"{kind}_keyword", self._keyword, q, user_id, query, n, *at[kind])
                    for kind, q in (("facts", facts_q), ("episodes", episodes_q)) if kind in kinds]
            vector = [(f"{kind}_vector", self._nearest, q, user_id, embedding, n, *at[kind])
                      for kind, q in (("facts", facts_q), ("episodes", episodes_q)) if kind in kinds]
            keyword_ready = {"episodes_keyword": asyncio.Event()}
            lanes = [ch.lane(text, pool=self._text_pool, ready=keyword_ready)]
            if "edges" in kinds:
                lanes.append(ch.lane([("edges", self._edges, user_id, embedding, as_of, k)], after=embedding))
            if "episodes" in kinds:
                lanes.append(ch.into("episodes", self._episodes_lane(ch, user_id, vector, embedding, keyword_ready)))
            else:
                lanes.append(ch.lane(vector, after=embedding))
            try:
                await asyncio.gather(*lanes)
            finally:
                _settle(embedding)
            got = ch.got
            result = SearchResult(user_id=user_id, query=query, as_of=as_of, degraded=ch.degraded,
                                  facts=self._ranked_facts(got, now, k) if "facts" in kinds else [],
                                  episodes=self._ranked_episodes(
                                      believed(within(got.get("episodes") or [], period), as_of), now, k, query),
                                  edges=(got.get("edges") or [])[:k])
            ch.timings["total"] = (time.perf_counter() - t0) * 1000
            result.timings_ms = {name: round(ms, 3) for name, ms in ch.timings.items()}
            span.set_attributes({"memstream.facts": len(result.facts), "memstream.episodes": len(result.episodes),
                                 "memstream.edges": len(result.edges), "memstream.degraded": list(result.degraded)})
        if self._metrics is not None:
            self._metrics.observe(result.timings_ms, result.degraded)
        return result

    async def _embedded(self, text: str, timings: dict[str, float]):
        t = time.perf_counter()
        vec = (await asyncio.get_running_loop().run_in_executor(self._embed_pool, self._embedder.embed, [text]))[0]
        timings["embed"] = (time.perf_counter() - t) * 1000
        return vec

    async def _episodes_lane(self, ch: Channels, user_id: str, steps: list[tuple], embedding: asyncio.Future,
                             keyword_ready: dict[str, asyncio.Event]) -> list:
        """The vector channels of ``steps``, then the episodes fused with the keyword channel and
        the adjacent turns of the best of them. Anchors need only this lane and the episodes
        keyword channel (the text lane's second), not edges: their adjacent turns are fetched
        while edges still runs (a heavy user's p95 measured lower, interleaved A/B)."""
        w, got = self._episode_weights, ch.got
        await ch.lane(steps, after=embedding)
        await keyword_ready["episodes_keyword"].wait()
        episodes = fuse({"vector": got.get("episodes_vector") or [], "keyword": got.get("episodes_keyword") or []},
                        "episode_id", keyword_share=w.keyword_share, raw_similarity=w.raw_similarity)
        if (w.neighbour_share > 0 or w.reply_share > 0) and episodes:
            anchors = sorted(episodes, key=lambda c: (-c.fused, str(c.key)))[:w.anchors]
            step = ("episode_neighbours", episodes_q.neighbours, user_id, [a.row for a in anchors])
            await ch.lane([step], pool=self._text_pool)
            episodes = with_neighbours(episodes, got.get("episode_neighbours") or [], "episode_id",
                                       w.neighbour_share, w.reply_share)
        return episodes

    def _ranked_facts(self, got: dict, now: datetime, k: int) -> list[RankedFact]:
        facts = rerank(latest_per_slot(fuse({"vector": got.get("facts_vector") or [], "keyword": got.get("facts_keyword") or []},
                                            "fact_id", keyword_share=self._fact_weights.keyword_share), single_valued), now,
                       self._fact_weights, time_key="last_observed_at",
                       importance=fact_importance, type_weight=fact_type)
        return [
            RankedFact(**{c: s.cand.row[c] for c in ("fact_id", "text", "category", "attribute", "value", "confidence",
                                                     "explicit", "observation_count", "valid_from", "recorded_at")},
                       score=round(s.score, 6), relevance=round(s.relevance, 6), recency=round(s.recency, 6),
                       importance=round(s.importance, 6), type_weight=s.type, channels=s.cand.channels,
                       archived=s.cand.row["status"] == "archived")
            for s in facts[:k]
        ]

    def _ranked_episodes(self, episodes: list, now: datetime, k: int, message: str) -> list[RankedEpisode]:
        # A turn's age counts only when the message asks about now or lately (``asks_about_now``).
        w = self._episode_weights if asks_about_now(message) else replace(self._episode_weights, recency=0.0)
        return [
            RankedEpisode(**{c: s.cand.row[c] for c in ("episode_id", "conversation_id", "occurred_at",
                                                         "user_message", "assistant_message")},
                          metadata=_json(s.cand.row["metadata"]),
                          score=round(s.score, 6), relevance=round(s.relevance, 6), recency=round(s.recency, 6),
                          channels=s.cand.channels, rank=n)
            for n, s in enumerate(rerank(episodes, now, w)[:k], start=1)
        ]

    async def _wait_for(self, after: LogPosition, timeout: float, quiet: bool = False) -> bool:
        """Whether ``after`` was applied within ``timeout``; if not, a warning (``quiet``: DEBUG)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        deadline = t0 + timeout
        delay, failed = 0.002, 0
        while True:
            try:
                # Each look bounded by the deadline (a server that stops answering, a pool with
                # no connection to give); the first has at least a moment, however short the wait.
                async with asyncio.timeout_at(max(deadline, t0 + FIRST_LOOK_S)):
                    if await self._applied_through(after.topic, after.partition) > after.offset:
                        return True
            except Exception:
                # Once with its traceback: a server down or restarting would otherwise log every 50 ms.
                if not failed and loop.time() < deadline:
                    log.exception("could not read projection positions while waiting for %s", after)
                failed += 1
            if loop.time() >= deadline:
                log.log(logging.DEBUG if quiet else logging.WARNING,
                        "read-your-writes wait for %s timed out after %.2fs (%d failed position reads)",
                        after, loop.time() - t0, failed)
                return False
            await asyncio.sleep(min(delay, deadline - loop.time()))
            delay = min(delay * 2, 0.05)

    async def _applied_through(self, topic: str, partition: int) -> int:
        """``positions.applied_through`` of the read projections, one look-up at a time per
        partition for every read waiting on it: a hundred waits ask Postgres as often as one does
        (each look shielded: a wait that gives up does not cancel the others' look)."""
        where = (topic, partition)
        look = self._looking.get(where)
        if look is None:
            look = self._looking[where] = asyncio.ensure_future(
                positions.applied_through(self._bounded, READ_YOUR_WRITES, topic, partition))
            look.add_done_callback(lambda done: self._looking.pop(where, None) if self._looking.get(where) is done
                                   else None)
        return await asyncio.shield(look)

    async def _recent_turns(self, user_id: str, conversation_id: str) -> list[Turn]:
        if self._redis is not None:
            try:
                epoch = await self._epoch_of("episodes", self._bounded)
                cached = await session_cache.recent_turns(self._redis, self._schema, epoch,
                                                          user_id, conversation_id, self._tier0)
                if cached:
                    return [Turn(**t) for t in cached]
            except Exception:
                log.exception("tier 0 cache unavailable; reading recent turns from Postgres")
        rows = await episodes_q.recent(self._text_bounded, user_id, conversation_id, self._tier0)
        return [Turn(**{k: r[k] for k in Turn.model_fields}) for r in rows]

    async def _profile(self, user_id: str, as_of: AsOf | None = None) -> dict:
        if as_of is not None:  # derived from the facts of then, as the projection derives today's
            return await profile_q.as_of(self._text_bounded, user_id, as_of.valid_time, as_of.recorded_time)
        epoch = await self._epoch_of("profile", self._text_bounded)
        try:
            return await profile_q.read(self._redis, self._text_bounded, self._schema, epoch, user_id)
        except Exception:
            log.exception("tier 1 cache unavailable; reading the profile from Postgres")
            return await profile_q.read(None, self._text_bounded, self._schema, epoch, user_id)

    async def _epoch_of(self, projection: str, pool) -> int:
        """The projection's epoch (part of its Redis keys), asked again after ``EPOCH_FRESH_S``:
        a rebuilt schema switched in (``streams.ops.switch``) has new epochs, and this reader
        must not serve the old build's caches for longer than that."""
        held = self._epochs.get(projection)
        if held is None or time.monotonic() - held[1] > EPOCH_FRESH_S:
            held = self._epochs[projection] = (await positions.epoch(pool, projection), time.monotonic())
        return held[0]

    async def _nearest(self, conn, q, user_id: str, embedding: asyncio.Future,
                       n: int = ANN_CANDIDATES, *period) -> list[asyncpg.Record]:
        vec = await embedding
        return await q.nearest(conn, user_id, vec, n, self._embedder.model_id, *period)

    async def _keyword(self, conn, q, user_id: str, message: str, n: int = ANN_CANDIDATES,
                       *period) -> list[asyncpg.Record]:
        text = message
        if self._keyword_mode == "names":
            text = " ".join(keyword_terms(message))
            if not text:
                return []  # nothing an embedding would blur: the vector channels cover it
        return await q.keyword(conn, user_id, text, n, *period)

    async def _edges(self, conn, user_id: str, embedding: asyncio.Future, as_of: AsOf | None, k: int) -> list[RankedEdge]:
        """Current edges by fact-sentence similarity plus a bounded one-hop expansion around the
        matched entities, reranked together; or, with ``as_of``, the graph as it was."""
        vec = await embedding
        if as_of is not None:
            rows = await graph_q.as_of(conn, user_id, as_of.valid_time, as_of.recorded_time, vec, k,
                                       self._embedder.model_id)
            return [ranked_edge(r, hop=0, score=1.0 - float(r["distance"])) for r in rows]
        rows = await graph_q.nearest_with_hops(conn, user_id, vec, self._edge_candidates, HOP_LIMIT,
                                               self._embedder.model_id)
        scored = rank_edges(rows, k)
        return [ranked_edge(r, hop=hop, score=score) for score, hop, r in scored]


    async def caught_up(self, after: LogPosition, timeout: float = 5.0) -> bool:
        """Whether every read projection has applied ``after`` (a position an append returned),
        waiting up to ``timeout`` seconds: for a caller that shows a change once it is visible."""
        check_position("after", after)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= 60:
            raise InvalidArgument(f"timeout must be 0..60 seconds, not {timeout!r}")
        return await self._wait_for(after, timeout, quiet=True)


def _passages(cands) -> dict:
    """The characters of the passage the vector search matched, by episode id, where it matched one."""
    return {c.key: (c.row["start_char"], c.row["end_char"]) for c in cands if c.row.get("start_char") is not None}


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def _settle(embedding: asyncio.Future | None) -> None:
    """A read's query embedding once the read is over: cancelled if still running (a read the
    host cancelled, or one past its deadline; the embedder runs one at a time, and an abandoned
    embedding would hold up the next read), its error retrieved if it failed (the channels that
    needed it logged it)."""
    if embedding is None:
        return
    if not embedding.done():
        embedding.cancel()
    elif not embedding.cancelled():
        embedding.exception()
