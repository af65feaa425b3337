"""``memstream bench read``: read-path latency on a large corpus, and whether filtered ANN
returns the full k.

The corpus is written straight into the projection tables with COPY: pushing a million turns
through formation (~100 turns/s on this machine) would take hours and measure the write path,
not the read path. Rows are shaped like the pipeline's: fact and episode texts from templates,
vectors that are noisy copies of real MiniLM embeddings of those texts (so neighbourhoods and
query embeddings behave like real ones), entities and bi-temporal edges, a Tier 1 profile.
The reads are the real thing: ``MemoryReader.read`` with a real query embedding every time.

Users: one heavy user (10k facts, 10k episodes, 2k edges), three growth users (1k, 10k and 100k
facts and episodes each), and filler users (150 facts, 150 episodes, 30 edges) up to the
requested total.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

import numpy as np
from pgvector import Vector

from memstream.config import Settings

log = logging.getLogger("memstream.bench")

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
MODEL = None  # filled from the embedder
PLACES = ["Lisbon", "Berlin", "Porto", "Oslo", "Kyoto", "Lima", "Austin", "Dublin", "Vienna", "Nairobi"]
ORGS = ["Acme Corp", "Globex", "Initech", "Hooli", "Umbrella", "Stark Industries", "Wayne Enterprises"]
THINGS = ["hiking", "jazz", "chess", "sailing", "baking", "cycling", "board games", "sushi", "opera", "gardening"]
PEOPLE = ["Ana", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kim", "Lu", "Mo", "Nia"]
FACT_TEMPLATES = [
    ("location", "home", "Lives in {p}"), ("work", "employer", "Works at {o}"), ("preference", "likes", "Likes {t}"),
    ("preference", "dislikes", "Dislikes {t}"), ("constraint", "allergy", "Allergic to {t}"),
    ("relationship", "friend", "Friend is {n}"), ("plan", "trip", "Plans a trip to {p}"),
    ("preference", "favourite_food", "Favourite food is {t}"), ("relationship", "pet", "Has a dog named {n}"),
]
EPISODE_TEMPLATES = [
    "We talked about my trip to {p} and what to pack for {t}.", "My friend {n} started a new job at {o}.",
    "I spent the weekend {t} near {p} with {n}.", "Can you help me plan a dinner with {n}? They love {t}.",
    "Work at {o} was stressful today, I need a break with some {t}.", "I'm thinking of moving to {p} next year.",
    "{n} recommended a great place for {t} in {p}.", "Remind me what I told you about {o} and the interview.",
]
QUESTIONS = [
    "Where do I live now?", "What did I say about my trip to Kyoto?", "Who is my friend that works at Globex?",
    "What food do I like?", "Am I allergic to anything?", "Any ideas for the weekend?",
    "What did Ana recommend last time?", "Where do I work these days?", "What are my plans for next year?",
    "Tell me about my dog", "What did we discuss about the interview?", "Which city was I thinking of moving to?",
]
TRIVIAL = ["thanks!", "ok", "cool", "got it, thanks", "lol"]
K = 20
VECTOR_TABLES = ("episodes", "memory_facts", "memory_edges")  # the migrations name their HNSW indexes <table>_embedding_hnsw


def _fill(r: random.Random, template: str) -> str:
    return template.format(p=r.choice(PLACES), o=r.choice(ORGS), t=r.choice(THINGS), n=r.choice(PEOPLE))


class Corpus:
    """Template texts with real embeddings; rows copy a text's vector with a little noise."""

    def __init__(self, embedder, seed: int = 7, variants: int = 300):
        r = random.Random(seed)
        self.fact_texts = sorted({(c, a, _fill(r, t)) for _ in range(variants) for c, a, t in [r.choice(FACT_TEMPLATES)]})
        self.episode_texts = sorted({_fill(r, r.choice(EPISODE_TEMPLATES)) for _ in range(variants)})
        vecs = embedder.embed([t for _, _, t in self.fact_texts] + self.episode_texts)
        self.fact_vecs, self.episode_vecs = vecs[:len(self.fact_texts)], vecs[len(self.fact_texts):]
        self.rng = np.random.default_rng(seed)

    def noisy(self, base: np.ndarray, idx: np.ndarray) -> np.ndarray:
        v = base[idx] + self.rng.normal(0, 0.02, size=(len(idx), base.shape[1])).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def _users(total: int, heavy: tuple[int, int, int], growth: Sequence[int]) -> list[tuple[str, int, int, int]]:
    """(user_id, facts, episodes, edges) up to ``total`` rows."""
    users = [("heavy", *heavy)] + [(f"grow-{n // 1000}k", n, n, 0) for n in growth]
    used = sum(f + e + g for _, f, e, g in users)
    i = 0
    while used < total:
        n = min(150, max(1, (total - used) // 2))
        g = n // 5  # every user has a graph, so the planner sees edges spread over users
        users.append((f"user-{i:05d}", n, n, g))
        used += 2 * n + g
        i += 1
    return users


async def _copy_user(conn, corpus: Corpus, model: str, user: str, n_facts: int, n_eps: int, n_edges: int, seed: int) -> None:
    r = np.random.default_rng(seed)
    if n_facts:
        idx = r.integers(0, len(corpus.fact_texts), n_facts)
        vecs = corpus.noisy(corpus.fact_vecs, idx)
        rows = []
        for j, (i, v) in enumerate(zip(idx, vecs)):
            cat, attr, text = corpus.fact_texts[i]
            fid = uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/f/{j}")
            at = T0 + timedelta(minutes=j)
            rows.append((fid, fid, 1, user, text, cat, attr, text.split()[-1], 0.9, True, "current", at, None, at,
                         None, None, None, 1, at, [fid], "{}", fid, "bench", "bench", "bench", Vector(v), model, [fid]))
        await conn.copy_records_to_table("memory_facts", records=rows, columns=[
            "fact_id", "lineage_id", "version", "user_id", "text", "category", "attribute", "value", "confidence",
            "explicit", "status", "valid_from", "valid_to", "recorded_at", "superseded_at", "superseded_by",
            "end_reason", "observation_count", "last_observed_at", "observed_by", "deferred", "source_event_id",
            "extractor", "resolver", "reason", "embedding", "embedding_model", "observed_in"])
    if n_eps:
        idx = r.integers(0, len(corpus.episode_texts), n_eps)
        vecs = corpus.noisy(corpus.episode_vecs, idx)
        rows = []
        for j, (i, v) in enumerate(zip(idx, vecs)):
            eid = uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/e/{j}")
            at = T0 + timedelta(minutes=j)
            rows.append((eid, eid, user, f"c{j // 20}", at, at, 0, j, corpus.episode_texts[i], "Noted!", None,
                         Vector(v), model))
        await conn.copy_records_to_table("episodes", records=rows, columns=[
            "episode_id", "source_event_id", "user_id", "conversation_id", "occurred_at", "recorded_at",
            "source_partition", "source_offset", "user_message", "assistant_message", "metadata", "embedding",
            "embedding_model"])
    if n_edges:
        names = [f"{p} {k}" for k in range(n_edges // 4 + 1) for p in PEOPLE][:n_edges // 4 + 1]
        ents = [(uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/n/{k}"), user, name, [], k == 0, T0, uuid.uuid4())
                for k, name in enumerate(["the user", *names])]
        await conn.copy_records_to_table("entities", records=ents, columns=[
            "entity_id", "user_id", "name", "aliases", "is_user", "recorded_at", "source_event_id"])
        relations = ["works_at", "lives_in", "managed_by", "friend_of"]
        texts = [f"{{s}} {rel.replace('_', ' ')} {{t}}" for rel in relations]
        base = np.asarray(corpus.fact_vecs[r.integers(0, len(corpus.fact_texts), len(relations))])
        rows = []
        for j in range(n_edges):
            src, tgt = ents[1 + j // 4], ents[1 + (j * 7) % (len(ents) - 1)]
            rel = relations[j % 4]
            v = corpus.noisy(base, np.asarray([j % 4]))[0]
            at = T0 + timedelta(days=j % 300)
            rows.append((uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/g/{j}"), user, src[0], rel, tgt[0], None, rel == "friend_of",
                         at, None, at, None, texts[j % 4].format(s=src[2], t=tgt[2]), 0.9, True, uuid.uuid4(), "bench",
                         "bench", None, Vector(v), model))
        await conn.copy_records_to_table("memory_edges", records=rows, columns=[
            "edge_id", "user_id", "source_entity_id", "relation", "target_entity_id", "target_value", "multi_valued",
            "valid_from", "valid_to", "recorded_at", "closed_at", "fact_sentence", "confidence", "explicit",
            "source_event_id", "extractor", "reason", "close_reason", "embedding", "embedding_model"])


def _pcts(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {"p50": round(float(np.percentile(a, 50)), 2), "p95": round(float(np.percentile(a, 95)), 2),
            "p99": round(float(np.percentile(a, 99)), 2), "n": len(values)}


async def ongoing_conversation(pool, redis, schema: str, user: str, keep: int) -> str:
    """The user's newest conversation, its last ``keep`` turns pushed to Tier 0 as the session-cache
    projection leaves them for a conversation in progress; reads then find them in Redis."""
    from memstream.projections import positions, session_cache
    from memstream.projections.episodes import query as episodes_q

    conversation = await pool.fetchval("SELECT conversation_id FROM episodes WHERE user_id = $1 "
                                       "ORDER BY occurred_at DESC, episode_id DESC LIMIT 1", user)
    # Its key rebuilt from the store, as the projection rebuilds one whose write failed.
    await session_cache.push_turns(redis, schema, await positions.epoch(pool, "episodes"), [], keep,
                                   lambda conversations, n: episodes_q.recent_of(pool, conversations, n),
                                   stale=[(user, conversation)])
    return conversation


async def _timed_reads(reader, user: str, messages: Sequence[str], n: int,
                       conversation: str = "bench") -> tuple[list[float], list[dict]]:
    totals, channels = [], []
    for i in range(n):
        t = time.perf_counter()
        ctx = await reader.read(user, conversation, messages[i % len(messages)])
        totals.append((time.perf_counter() - t) * 1000)
        channels.append(ctx.timings_ms)
        if ctx.degraded:
            raise RuntimeError(f"degraded read during the benchmark: {ctx.degraded}")
    return totals, channels


FAR = 0.05  # in mean cosine distance over the k rows; missing near-ties costs < 0.002


async def _full_k(pool, embedder, users: Sequence[str]) -> dict[str, dict]:
    """Filtered ANN (iterative scan) vs exact search for each user: rows returned and recall@K;
    how much farther the ANN rows are than the exact ones on average (``distance_gap_mean``), and
    in how many of the (question, table) searches by more than ``FAR`` (``far_searches``: the
    HNSW walk ended in another region of the graph, not among near-ties); and what the same
    index returns with iterative scans off (post-filtering, as Mem0 ships)."""
    from memstream.projections.episodes import query as episodes_q
    from memstream.projections.facts import query as facts_q

    out = {}
    qvecs = embedder.embed(QUESTIONS)
    for user in users:
        stats = {"asked": K, "returned_min": K, "recall_mean": 0.0, "post_filter_returned_mean": 0.0}
        recalls, post, gaps = [], [], []
        async with pool.acquire() as conn:
            rows_total = await conn.fetchval("SELECT count(*) FROM episodes WHERE user_id = $1", user)
            for v in qvecs:
                for q, table in ((episodes_q, "episodes"), (facts_q, "memory_facts")):
                    ann = await q.nearest(conn, user, v, K, embedder.model_id)
                    key = "episode_id" if table == "episodes" else "fact_id"
                    async with conn.transaction():
                        await conn.execute("SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off")
                        exact = await conn.fetch(f"SELECT {key}, embedding <=> $2 AS distance FROM {table} WHERE user_id = $1 "
                                                 f"{'AND status = $3' if table == 'memory_facts' else 'AND $3::text IS NULL'} "
                                                 f"ORDER BY embedding <=> $2 LIMIT {K}", user, v,
                                                 "current" if table == "memory_facts" else None)
                    async with conn.transaction():
                        await conn.execute("SET LOCAL hnsw.iterative_scan = off; SET LOCAL enable_seqscan = off; "
                                           "SET LOCAL enable_bitmapscan = off")
                        plain = await q.nearest(conn, user, v, K, embedder.model_id)
                    stats["returned_min"] = min(stats["returned_min"], len(ann))
                    truth = {r[key] for r in exact}
                    recalls.append(len(truth & {r[key] for r in ann}) / max(1, len(truth)))
                    if ann and exact:
                        gaps.append(float(np.mean([r["distance"] for r in ann]) - np.mean([r["distance"] for r in exact])))
                    post.append(len(plain))
            plan = await conn.fetch("EXPLAIN " + episodes_q._NEAREST[False, False].replace("$1", f"'{user}'").replace("$3", str(K))
                                    .replace("$4", f"'{embedder.model_id}'").replace("$2", f"'{Vector(qvecs[0]).to_text()}'"))
        stats.update(rows=rows_total, recall_mean=round(float(np.mean(recalls)), 4),
                     distance_gap_mean=round(float(np.mean(gaps)), 4) if gaps else 0.0,
                     far_searches=f"{sum(g > FAR for g in gaps)}/{len(gaps)}",
                     post_filter_returned_mean=round(float(np.mean(post)), 2),
                     plan="hnsw" if any("Order By: (embedding <=>" in r[0] for r in plan) else "btree/seq + sort")
        out[user] = stats
    return out


async def _load_corpus(pool, embedder, users, on_progress=None) -> dict:
    """COPY every user's rows with the HNSW indexes dropped, then build them once."""
    corpus = Corpus(embedder)
    t = time.perf_counter()
    async with pool.acquire() as conn:
        # Rebuilt below exactly as the migrations define them (build parameters included).
        # pg_indexes shows a partitioned index as "ON ONLY <table>": the partitions' indexes too.
        indexes = [(await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                                        "AND indexname = $1", f"{table}_embedding_hnsw")).replace(" ON ONLY ", " ON ", 1)
                   for table in VECTOR_TABLES]
        for table in VECTOR_TABLES:
            await conn.execute(f"DROP INDEX IF EXISTS {table}_embedding_hnsw")
        for i, (user, f, e, g) in enumerate(users):
            await _copy_user(conn, corpus, embedder.model_id, user, f, e, g, seed=i)
            if i % 200 == 0:
                log.info("loaded %d/%d users", i + 1, len(users))
            if on_progress:
                on_progress(i + 1, len(users))
        await conn.execute("INSERT INTO profiles VALUES ('heavy', '{\"name\": \"Hal\", \"home\": \"Oslo\"}', 2)")
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL maintenance_work_mem = '3GB'; SET LOCAL max_parallel_maintenance_workers = 1")
        for indexdef in indexes:
            await conn.execute(indexdef)
    async with pool.acquire() as conn:
        # The steady state of a store, not autovacuum racing the measurement over fresh pages
        # (a fresh 50k corpus read 20-40% slower until it had been vacuumed).
        await conn.execute(f"VACUUM ANALYZE {', '.join(VECTOR_TABLES)}, entities")
        await conn.execute("ANALYZE")
    index_s = time.perf_counter() - t
    log.info("corpus loaded in %.0fs, indexes in %.0fs", load_s, index_s)
    return {"load_s": round(load_s, 1), "index_build_s": round(index_s, 1)}


def corpus_plan(rows: int) -> tuple[list[int], list[tuple[str, int, int, int]]]:
    """The growth users' sizes and every user's (user_id, facts, episodes, edges) for ``rows``."""
    growth = [g for g in (1_000, 10_000, 100_000) if 2 * g < rows // 2]
    return growth, _users(rows, (10_000, 10_000, 2_000), growth)


async def load_corpus(pool, embedder, rows: int) -> dict:
    """The benchmark's corpus of ``rows`` written into ``pool``'s (migrated, empty) schema; for
    benchmarks that time memstream beside other systems (peers/)."""
    return await _load_corpus(pool, embedder, corpus_plan(rows)[1])


AGED_DAYS = 3 * 365
# The cold index is off by default; the aged corpus measures it at a year unless one is configured.
BENCH_COLD_AFTER_DAYS = 365.0


async def _episode_searches(pool, vectors, model: str, n: int, *, cold: bool) -> dict:
    """The heavy user's nearest-episodes statements timed alone, ``n`` times over ``vectors``:
    the hot index's, then (``cold``) the cold one's after it; as many candidates as a read asks."""
    from memstream.projections.episodes import query as episodes_q
    from memstream.read_settings import EPISODE_WEIGHTS

    times = []
    async with pool.acquire() as conn:
        for i in range(n + 20):
            t = time.perf_counter()
            args = ("heavy", vectors[i % len(vectors)], EPISODE_WEIGHTS.candidates, model)
            await conn.fetch(episodes_q._NEAREST[False, False], *args)
            if cold:
                await conn.fetch(episodes_q._NEAREST[False, True], *args)
            if i >= 20:  # the first 20 warm the plan and the buffers
                times.append((time.perf_counter() - t) * 1000)
    return _pcts(times)


async def _decayed(pool, reader, embedder, conversation: str, reads: int, cold_after_days: float) -> dict:
    """The heavy user aged: their facts' last observations and their episodes (but the ongoing
    conversation's) spread over three years, a decay sweep as of the end (the sweep's plan and
    requests, their ``FactArchived`` and ``EpisodesSwept`` decisions applied by the facts and
    episodes projections, as formation would decide them), and the same reads again (a sweep
    cannot be undone to alternate: the reads after it are warmed first, as the ones before were)."""
    from memstream.projections.episodes.store import EpisodeStore
    from memstream.projections.facts import store as facts_store
    from memstream.schemas import LogPosition
    from memstream.streams.worker.sweeping import archivals, moved, plan, requests

    end = T0 + timedelta(days=AGED_DAYS)
    spread = ("$1::timestamptz + (($2::float8 * row_number) / count) * interval '1 day'")
    async with pool.acquire() as conn:
        await conn.execute(
            f"UPDATE memory_facts SET last_observed_at = {spread}, last_said_at = {spread} "
            "FROM (SELECT fact_id AS id, row_number() OVER (ORDER BY fact_id) AS row_number, count(*) OVER () AS count "
            "FROM memory_facts WHERE user_id = 'heavy') o WHERE user_id = 'heavy' AND fact_id = o.id", T0, AGED_DAYS)
        await conn.execute(
            f"UPDATE episodes SET occurred_at = {spread}, recorded_at = {spread} "
            "FROM (SELECT episode_id AS id, row_number() OVER (ORDER BY occurred_at, episode_id) AS row_number, "
            "count(*) OVER () AS count FROM episodes WHERE user_id = 'heavy' AND conversation_id <> $3) o "
            "WHERE user_id = 'heavy' AND episode_id = o.id", T0, AGED_DAYS, conversation)
        await conn.execute("UPDATE episodes SET occurred_at = occurred_at + $2 * interval '1 day', "
                           "recorded_at = recorded_at + $2 * interval '1 day' WHERE user_id = 'heavy' AND "
                           "conversation_id = $1", conversation, AGED_DAYS)
        await conn.execute(f"VACUUM ANALYZE {', '.join(VECTOR_TABLES)}")  # as after the sweep: the same state but its rows
    await _timed_reads(reader, "heavy", QUESTIONS, 30, conversation)
    # Twice: how much the same reads drift with time alone, against which the change after is read.
    before = [await _timed_reads(reader, "heavy", QUESTIONS, reads // 2, conversation) for _ in range(2)]
    vectors = embedder.embed(QUESTIONS)
    one_index = await _episode_searches(pool, vectors, embedder.model_id, reads, cold=False)
    async with pool.acquire() as conn:
        found = await plan(conn, at=end, threshold=0.2, cold_after_days=cold_after_days, user_id="heavy")
        decided, moves = [], []
        for n, request in enumerate(requests(found)):
            rows = await facts_store.load(conn, [(request.user_id, f.fact_id) for f in request.facts])
            common = dict(source_event_id=request.event_id, recorded_at=end, source=LogPosition("bench", 0, n),
                          user_id=request.user_id)
            decided += archivals(request, rows, common)
            moves += moved(request, common)
        await facts_store.FactStore().apply_batch(conn, decided, {})
        await EpisodeStore().apply_batch(conn, moves, {})
        await conn.execute(f"VACUUM ANALYZE {', '.join(VECTOR_TABLES)}")
        held = await conn.fetchval("SELECT count(*) FROM memory_facts WHERE user_id = 'heavy' AND status = 'current'")
    after = [await _timed_reads(reader, "heavy", QUESTIONS, reads // 2, conversation)]
    await _timed_reads(reader, "heavy", QUESTIONS, 30, conversation)  # warm again after the vacuum
    after.append(await _timed_reads(reader, "heavy", QUESTIONS, reads // 2, conversation))
    hot_only = await _episode_searches(pool, vectors, embedder.model_id, reads, cold=False)
    hot_and_cold = await _episode_searches(pool, vectors, embedder.model_id, reads, cold=True)

    def p50(runs, channel: str) -> float:
        return round(float(np.median([ch.get(channel, 0) for _, chans in runs for ch in chans])), 2)

    return {"facts_weighed": found.facts_weighed, "archived": len(decided), "current_after": held,
            "episodes_cooled": sum(len(d.cooled) for d in moves), "cold_after_days": cold_after_days,
            # The episodes' vector statement alone (40 candidates, as a read asks): before the
            # sweep (one index), after it the hot index (what a read asks), and both in turn
            # (what a read would ask if the cold one were searched every time).
            "episode_search_ms": {"one_index": one_index, "hot": hot_only, "hot_then_cold": hot_and_cold},
            "before_ms": _pcts(before[0][0]), "before_again_ms": _pcts(before[1][0]),
            "after_ms": _pcts([t for run, _ in after[1:] for t in run]),
            "channel_p50_ms": {ch: {"before": p50(before, ch), "after": p50(after[1:], ch)}
                               for ch in ("facts_vector", "episodes_vector", "episodes_keyword", "facts_keyword",
                                          "edges", "embed")}}


async def run_read_bench(base: Settings, *, rows: int = 1_000_000, readers: int = 32, reads: int = 300,
                         keep: bool = False, reuse: str | None = None, on_progress=None, decay: bool = False) -> dict:
    """``reuse``: measure a corpus kept by an earlier ``keep=True`` run (same ``rows``) instead of
    loading one. ``decay``: then age the heavy user, sweep and read again (``_decayed``; it
    archives the corpus's facts: measure the rest on a corpus without it)."""
    from memstream.embedding import default_embedder
    from memstream.projections.db import create_pool, drop_schema, migrate
    from memstream.read_client import MemoryReader
    from memstream.stack.launcher import stack_from_settings
    import redis.asyncio as aioredis

    settings = base.model_copy(update={"postgres_schema": reuse or f"benchr_{uuid.uuid4().hex[:8]}"})
    stack_from_settings(settings).up()
    dsn = settings.dsn()
    await migrate(dsn, settings.postgres_schema)
    embedder = default_embedder(settings.read_embed_threads, settings.embedding_variant)
    pool = await create_pool(dsn, settings.postgres_schema, min_size=4, max_size=24)
    text_pool = await create_pool(dsn, settings.postgres_schema, min_size=24, max_size=24, generic_plans=True,
                                  prepare=MemoryReader.prepare_text_lane)
    report: dict[str, Any] = {"rows_requested": rows, "schema": settings.postgres_schema}
    try:
        growth, users = corpus_plan(rows)
        if reuse is None:
            report.update(await _load_corpus(pool, embedder, users, on_progress))
        async with pool.acquire() as conn:
            counts = {tb: await conn.fetchval(f"SELECT count(*) FROM {tb}") for tb in VECTOR_TABLES}
        report.update(rows=sum(counts.values()), tables=counts, users=len(users))

        redis = aioredis.from_url(settings.redis_url)
        reader = MemoryReader(pool=pool, redis=redis, embedder=embedder, schema=settings.postgres_schema,
                              text_pool=text_pool)
        # Reads ask in the user's conversation in progress, its recent turns in Tier 0 (one line
        # below times a new conversation: Redis has no turns, so Postgres is asked).
        ongoing = {u: await ongoing_conversation(pool, redis, settings.postgres_schema, u, settings.tier0_turns)
                   for u in ("heavy", *(f"grow-{g // 1000}k" for g in growth))}
        await _timed_reads(reader, "heavy", QUESTIONS, 30, ongoing["heavy"])  # warm caches: plans and buffers

        totals, channels = await _timed_reads(reader, "heavy", QUESTIONS, reads, ongoing["heavy"])
        report["heavy_user_one_reader_ms"] = _pcts(totals)
        report["heavy_user_channels_p50_ms"] = {c: round(float(np.median([ch.get(c, 0) for ch in channels])), 2)
                                                for c in channels[0]}
        totals, _ = await _timed_reads(reader, "heavy", QUESTIONS, reads, "bench")
        report["heavy_user_new_conversation_ms"] = _pcts(totals)
        names = MemoryReader(pool=pool, redis=redis, embedder=embedder, schema=settings.postgres_schema,
                             keyword_mode="names", text_pool=text_pool)
        totals, channels = await _timed_reads(names, "heavy", QUESTIONS, reads, ongoing["heavy"])
        report["heavy_user_one_reader_names_keyword_mode_ms"] = _pcts(totals)
        gated, _ = await _timed_reads(reader, "heavy", TRIVIAL, reads, ongoing["heavy"])
        report["heavy_user_gated_ms"] = _pcts(gated)

        fillers = [u for u, *_ in users if u.startswith("user-")] or ["heavy"]

        def concurrent_user(i: int, j: int) -> str:
            return "heavy" if j % 2 == 0 else fillers[(i * 31 + j) % len(fillers)]

        for user in {concurrent_user(i, j) for i in range(readers) for j in range(max(1, reads // 4))} - set(ongoing):
            ongoing[user] = await ongoing_conversation(pool, redis, settings.postgres_schema, user, settings.tier0_turns)

        async def one_reader(i: int) -> list[float]:
            out = []
            for j in range(max(1, reads // 4)):
                user = concurrent_user(i, j)
                t = time.perf_counter()
                await reader.read(user, ongoing[user], QUESTIONS[(i + j) % len(QUESTIONS)])
                out.append((time.perf_counter() - t) * 1000)
            return out

        t = time.perf_counter()
        lat = [x for xs in await asyncio.gather(*(one_reader(i) for i in range(readers))) for x in xs]
        wall = time.perf_counter() - t
        report[f"concurrent_{readers}_readers_ms"] = _pcts(lat)
        report[f"concurrent_{readers}_readers_reads_per_s"] = round(len(lat) / wall, 1)

        growth_report = {}
        for g in growth:
            user = f"grow-{g // 1000}k"
            # Warmed like the heavy user: the first reads of a user whose pages are not cached
            # yet (after a restart) cost 50-280 ms each and are reported on their own.
            cold, _ = await _timed_reads(reader, user, QUESTIONS, len(QUESTIONS), ongoing[user])
            totals, channels = await _timed_reads(reader, user, QUESTIONS, max(60, reads // 3), ongoing[user])
            growth_report[f"{g} facts + {g} episodes"] = {
                **_pcts(totals), "warm_up_max_ms": round(max(cold), 2),
                "episodes_vector_p50_ms": round(float(np.median([c["episodes_vector"] for c in channels])), 2),
                "facts_vector_p50_ms": round(float(np.median([c["facts_vector"] for c in channels])), 2)}
        report["growth_one_user"] = growth_report
        report["filtered_ann_full_k"] = await _full_k(pool, embedder, ["heavy", *[f"grow-{g // 1000}k" for g in growth],
                                                                       fillers[0]])
        if decay:  # last: it archives part of the corpus
            report["decay"] = await _decayed(pool, reader, embedder, ongoing["heavy"], reads,
                                             settings.episode_cold_after_days or BENCH_COLD_AFTER_DAYS)
        await redis.aclose()
    finally:
        await pool.close()
        await text_pool.close()
        if not keep and reuse is None:
            await drop_schema(dsn, settings.postgres_schema)
    return report
