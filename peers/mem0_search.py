"""Mem0 2.2.1's ``Memory.search``, timed on memstream's Postgres + pgvector with memstream's embedder.

Runs from the peers venv (``make bench-peers``), never from memstream's. Loads one heavy user
(10k memories) plus filler users into a fresh mem0 pgvector collection through mem0's own
``vector_store.insert`` (so the table and its HNSW index are exactly what mem0 creates), then
times ``memory.search(q, top_k=10, filters={"user_id": "heavy"})`` including the query embedding,
in three modes set per connection (libpq ``options``, nothing is changed on the database):

- ``shipped``: ``hnsw.iterative_scan = off`` (pgvector's default, what mem0 gets as shipped);
- ``iterative``: ``hnsw.iterative_scan = relaxed_order``;
- ``exact``: index scans off, so the vector query is an exact scan (the reference for recall).

What mem0 2.2.1 search runs (mem0/memory/main.py ``_search_vector_store``): lemmatize the query
(spaCy, optional extra ``mem0ai[nlp]``: not installed, so the raw query is used), extract query
entities (spaCy too: none without it), embed the query, then
``SELECT id, vector <=> $1::vector AS distance, payload FROM <collection>
WHERE payload->>'user_id' = $2 ORDER BY distance LIMIT max(4*top_k, 60)`` (HNSW, cosine),
then a keyword query (``ts_rank_cd`` over ``to_tsvector('simple', payload->>'text_lemmatized')``,
same filter, GIN index), then additive scoring with a semantic threshold of 0.1 and the top
``top_k``. No LLM and no reranker is called on search (``rerank=False``, no reranker configured).

Texts and vectors come from memstream's read benchmark corpus (noisy copies of real MiniLM
embeddings of fact templates), so both systems see the same kind of data.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from importlib.metadata import version
from typing import Callable

import numpy as np
import psycopg
from psycopg.conninfo import make_conninfo

from common import HEAVY, K, interleaved, pcts, users_plan
from memstream.bench.read import QUESTIONS, T0, Corpus
from memstream.config import Settings
from memstream.embedding import default_embedder

os.environ.setdefault("MEM0_TELEMETRY", "False")  # read when mem0 is imported: no posthog calls
_HOME = tempfile.mkdtemp(prefix="mem0-bench-")  # mem0's ~/.mem0 and its SQLite history
os.environ.setdefault("MEM0_DIR", _HOME)

from mem0 import Memory  # noqa: E402
from mem0.configs.embeddings.base import BaseEmbedderConfig  # noqa: E402
from mem0.embeddings.base import EmbeddingBase  # noqa: E402
from mem0.utils.lemmatization import lemmatize_for_bm25  # noqa: E402

log = logging.getLogger("bench.peers.mem0")
SETTINGS = Settings.from_env()

MODES = {
    "shipped": "-c hnsw.iterative_scan=off",
    "iterative": "-c hnsw.iterative_scan=relaxed_order",
    "exact": "-c enable_indexscan=off",
}
NOWHERE = "http://127.0.0.1:9/v1"  # the OpenAI clients mem0 builds point here: a call would fail at once


class MemstreamEmbedding(EmbeddingBase):
    """mem0 embedder backed by memstream's offline int8 MiniLM; records the last call's time."""

    def __init__(self, embedder):
        super().__init__(BaseEmbedderConfig(embedding_dims=embedder.dim))
        self._embedder = embedder
        self.last_ms = 0.0

    def embed(self, text, memory_action=None):
        t = time.perf_counter()
        vec = self._embedder.embed([text])[0].tolist()
        self.last_ms = (time.perf_counter() - t) * 1000
        return vec

    def embed_batch(self, texts, memory_action="add"):
        return self._embedder.embed(list(texts)).tolist()


class NoLLM:
    """Stands in for mem0's LLM: search must never call it."""

    def generate_response(self, *args, **kwargs):
        raise RuntimeError("mem0 called its LLM during the benchmark")


def make_memory(dsn: str, collection: str, options: str, embedding: MemstreamEmbedding) -> Memory:
    memory = Memory.from_config({
        "vector_store": {"provider": "pgvector", "config": {
            "connection_string": make_conninfo(dsn, options=options), "collection_name": collection,
            "embedding_model_dims": embedding.config.embedding_dims}},
        "embedder": {"provider": "openai", "config": {"api_key": "unused", "openai_base_url": NOWHERE,
                                                      "embedding_dims": embedding.config.embedding_dims}},
        "llm": {"provider": "openai", "config": {"api_key": "unused", "openai_base_url": NOWHERE}},
        "history_db_path": os.path.join(_HOME, f"history-{uuid.uuid4().hex[:6]}.db"),
    })
    memory.embedding_model = embedding
    memory.llm = NoLLM()
    return memory


def load(memory: Memory, corpus: Corpus, plan: list[tuple[str, int]], batch: int = 1000) -> float:
    """Insert through mem0's own store, payloads shaped as ``Memory._create_memory`` writes them."""
    t = time.perf_counter()
    lemmas = {text: lemmatize_for_bm25(text) for _, _, text in corpus.fact_texts}
    owners, idx = interleaved(plan, len(corpus.fact_texts))
    vecs = corpus.noisy(corpus.fact_vecs, idx)
    for start in range(0, len(owners), batch):
        ids, payloads = [], []
        for j in range(start, min(len(owners), start + batch)):
            text = corpus.fact_texts[idx[j]][2]
            at = (T0 + timedelta(seconds=j)).isoformat()
            ids.append(str(uuid.uuid5(uuid.NAMESPACE_OID, f"mem0/{j}")))
            payloads.append({"user_id": owners[j], "data": text, "hash": hashlib.md5(text.encode()).hexdigest(),
                             "created_at": at, "updated_at": at, "text_lemmatized": lemmas[text]})
        memory.vector_store.insert(vectors=vecs[start:start + len(ids)].tolist(), payloads=payloads, ids=ids)
        if start % (10 * batch) == 0:
            log.info("loaded %d/%d rows", start + len(ids), len(owners))
    return time.perf_counter() - t


def search(memory: Memory, query: str) -> list[dict]:
    return memory.search(query, top_k=K, filters={"user_id": HEAVY})["results"]


Searcher = Callable[[str], tuple[int, float]]  # question -> (results returned, embedding ms)


def mem0_searcher(memory: Memory, embedding: MemstreamEmbedding) -> Searcher:
    def run(question: str) -> tuple[int, float]:
        return len(search(memory, question)), embedding.last_ms
    return run


def timed(searchers: dict[str, Searcher], calls: int, warmup: int) -> dict[str, dict]:
    """The modes take turns call by call (rotating who goes first), so they share the background
    load: this machine's speed drifts by a third within minutes, so only such ratios hold."""
    for run in searchers.values():
        for i in range(warmup):
            run(QUESTIONS[i % len(QUESTIONS)])
    modes = list(searchers)
    totals, embeds, returned = ({m: [] for m in modes} for _ in range(3))
    for i in range(calls):
        for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
            t = time.perf_counter()
            n, embed_ms = searchers[mode](QUESTIONS[i % len(QUESTIONS)])
            totals[mode].append((time.perf_counter() - t) * 1000)
            embeds[mode].append(embed_ms)
            returned[mode].append(n)
    return {m: {"search_ms": pcts(totals[m]), "embed_ms_p50": round(float(np.median(embeds[m])), 2),
                "returned_mean_of_10": round(float(np.mean(returned[m])), 2), "returned_min": int(min(returned[m]))}
            for m in modes}


class MemstreamReads:
    """memstream's full ``MemoryReader.read`` for the heavy user of its own benchmark corpus of the
    same size (``memstream.bench.read``: 10k facts + 10k episodes + 2k edges), in its own schema,
    on a private event loop so that its reads take turns with mem0's searches call by call."""

    def __init__(self, dsn: str, rows: int):
        from memstream.bench.read import load_corpus
        from memstream.projections.db import create_pool, drop_schema, migrate
        from memstream.read_client import MemoryReader

        self.dsn, self.schema = dsn, f"benchr_{uuid.uuid4().hex[:8]}"
        self.loop = asyncio.new_event_loop()
        run = self.loop.run_until_complete
        embedder = default_embedder(SETTINGS.read_embed_threads, SETTINGS.embedding_variant)
        run(migrate(dsn, self.schema))
        pool = run(create_pool(dsn, self.schema, min_size=2, max_size=8))
        try:
            self.load = run(load_corpus(pool, embedder, rows))
        except BaseException:
            run(pool.close())
            run(drop_schema(dsn, self.schema))
            raise
        run(pool.close())
        # Each mode as a host gets it: MemoryReader.connect with that keyword mode in its settings.
        self.readers = {}
        try:
            for mode, kw in (("memstream", "words"), ("memstream_names", "names")):
                settings = SETTINGS.model_copy(update={"postgres_schema": self.schema, "read_keyword_mode": kw})
                self.readers[mode] = run(MemoryReader.connect(settings, dsn, embedder=embedder))
        except BaseException:
            self.close()
            raise

    def searcher(self, mode: str) -> Searcher:
        if mode == "memstream_search":  # equal work: the best facts for the query, as mem0's search
            def search_facts(question: str) -> tuple[int, float]:
                found = self.loop.run_until_complete(self.readers["memstream"].search(HEAVY, question, kinds=("facts",), k=K))
                if found.degraded:
                    raise RuntimeError(f"degraded memstream search: {found.degraded}")
                return len(found.facts), found.timings_ms["embed"]
            return search_facts

        def run(question: str) -> tuple[int, float]:
            ctx = self.loop.run_until_complete(self.readers[mode].read(HEAVY, "bench", question))
            if ctx.degraded:
                raise RuntimeError(f"degraded memstream read: {ctx.degraded}")
            return len(ctx.facts), ctx.timings_ms["embed"]
        return run

    def close(self) -> None:
        from memstream.projections.db import drop_schema

        run = self.loop.run_until_complete
        for reader in self.readers.values():
            run(reader.close())
        run(drop_schema(self.dsn, self.schema))
        self.loop.close()


def first_calls(memory: Memory, n: int = 10) -> dict:
    """A fresh connection's first searches: psycopg 3 prepares a statement after 5 executions and
    Postgres plans it per execution 5 more times before it may keep the generic plan, so the vector
    query is planned per execution for the first 10 calls (for the heavy user: a sequential scan)."""
    ms, returned = [], []
    for i in range(n):
        t = time.perf_counter()
        returned.append(len(search(memory, QUESTIONS[i % len(QUESTIONS)])))
        ms.append((time.perf_counter() - t) * 1000)
    return {"calls": n, "search_ms_p50": round(float(np.median(ms)), 2),
            "returned_mean_of_10": round(float(np.mean(returned)), 2)}


def diagnose(memory: Memory, embedding: MemstreamEmbedding) -> dict:
    """Per question: rows the vector query returns (of max(4k, 60) asked), results, their texts."""
    rows, returned, ms, texts = [], [], [], {}
    for q in QUESTIONS:
        vec = embedding.embed(q)
        rows.append(len(memory.vector_store.search(query=q, vectors=vec, top_k=max(4 * K, 60), filters={"user_id": HEAVY})))
        t = time.perf_counter()
        results = search(memory, q)
        ms.append((time.perf_counter() - t) * 1000)
        returned.append(len(results))
        texts[q] = {r["memory"] for r in results}
    return {"vector_rows_mean": round(float(np.mean(rows)), 2), "vector_rows_asked": max(4 * K, 60),
            "returned_mean_of_10": round(float(np.mean(returned)), 2), "search_ms_p50": round(float(np.median(ms)), 2),
            "_texts": texts}


def explain(dsn: str, table: str, vec: list[float]) -> dict[str, list[str]]:
    """The plans of mem0's vector query for the heavy user: per-execution and generic."""
    sql = (f'SELECT id, vector <=> {{}}::vector AS distance, payload FROM "{table}" '
           "WHERE payload->>{} = {} ORDER BY distance LIMIT {}")
    out = {}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("EXPLAIN (COSTS OFF) " + sql.format(*["%s"] * 4), (vec, "user_id", HEAVY, max(4 * K, 60)))
        out["custom"] = [r[0].strip()[:100] for r in rows]  # the Sort Key line holds the whole vector
        rows = conn.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + sql.format("$1", "$2", "$3", "$4"))
        out["generic"] = [r[0].strip() for r in rows]
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default=SETTINGS.postgres_dsn or
                   f"postgresql://postgres:@/postgres?host={SETTINGS.home.resolve()}/postgres",
                   help="default: MEMSTREAM_POSTGRES_DSN, else the local stack's socket (memstream stack status)")
    p.add_argument("--rows", type=int, default=50_000, help="memories in the table, all users")
    p.add_argument("--heavy", type=int, default=10_000, help="memories of the heavy user")
    p.add_argument("--users", type=int, default=300, help="users, the heavy one included")
    p.add_argument("--calls", type=int, default=240, help="timed searches per mode")
    p.add_argument("--warmup", type=int, default=36)
    p.add_argument("--threads", type=int, default=SETTINGS.read_embed_threads,
                   help="embedder threads (default: memstream's read path setting)")
    p.add_argument("--no-memstream", dest="memstream", action="store_false",
                   help="skip memstream's read, otherwise timed in turn with mem0's searches on its own corpus")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("mem0").setLevel(logging.ERROR)  # one insert log line per batch otherwise

    embedding = MemstreamEmbedding(default_embedder(args.threads))
    collection = f"mem0_bench_{uuid.uuid4().hex[:8]}"
    report: dict = {"mem0ai": version("mem0ai"), "psycopg": version("psycopg"), "collection": collection,
                    "embedder": embedding._embedder.model_id, "embed_threads": args.threads, "top_k": K}
    loader = make_memory(args.dsn, collection, MODES["shipped"], embedding)
    try:
        plan = users_plan(args.rows, args.heavy, args.users)
        report["load_s"] = round(load(loader, Corpus(embedding._embedder), plan), 1)
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'VACUUM ANALYZE "{collection}"')  # as memstream's bench does: a settled table
            report["rows"] = conn.execute(f'SELECT count(*) FROM "{collection}"').fetchone()[0]
            report["heavy_rows"] = conn.execute(f"SELECT count(*) FROM \"{collection}\" WHERE payload->>'user_id' = %s",
                                                (HEAVY,)).fetchone()[0]
            conn.execute("LOAD 'vector'")
            report["server"] = {g: conn.execute(f"SHOW {g}").fetchone()[0]
                                for g in ("server_version", "hnsw.ef_search", "hnsw.max_scan_tuples", "plan_cache_mode")}
        report["users"] = len(plan)
        report["plans"] = explain(args.dsn, collection, embedding.embed(QUESTIONS[0]))
        memories = {mode: make_memory(args.dsn, collection, options, embedding) for mode, options in MODES.items()}
        memstream = None
        try:
            memstream = MemstreamReads(args.dsn, args.rows) if args.memstream else None
            # Only shipped and iterative are timed (taking turns); exact is the reference for what
            # comes back, and its sequential scans would evict the others' working set if interleaved.
            fresh = first_calls(memories["shipped"])
            searchers = {m: mem0_searcher(memories[m], embedding) for m in ("shipped", "iterative")}
            if memstream is not None:
                searchers.update({m: memstream.searcher(m) for m in (*memstream.readers, "memstream_search")})
            report.update(timed(searchers, args.calls, args.warmup))
            report["shipped"]["fresh_connection_first_calls"] = fresh
            if memstream is not None:
                report["memstream_load"] = memstream.load
                for m in memstream.readers:  # facts returned, of the 10 a read keeps before budgets
                    report[m]["facts_returned_mean_of_10"] = report[m].pop("returned_mean_of_10")
                    report[m].pop("returned_min")
                for m in ("memstream", "memstream_search"):
                    report[f"{m}_over_mem0_iterative"] = {
                        q: round(report[m]["search_ms"][q] / report["iterative"]["search_ms"][q], 2)
                        for q in ("p50", "p95")}
            report["exact"] = {}
            texts = {}
            for mode, memory in memories.items():
                diag = diagnose(memory, embedding)
                texts[mode] = diag.pop("_texts")
                report[mode].update({k: v for k, v in diag.items() if mode == "exact" or k.startswith("vector_rows")})
        finally:
            for memory in memories.values():
                memory.vector_store.connection_pool.close()
            if memstream is not None:
                memstream.close()
        # Which facts come back, compared by text: the corpus has many near-identical copies of each text.
        for mode in ("shipped", "iterative"):
            report[mode]["text_recall_vs_exact"] = round(float(np.mean(
                [len(texts[mode][q] & texts["exact"][q]) / max(1, len(texts["exact"][q])) for q in QUESTIONS])), 3)
    finally:
        loader.vector_store.delete_col()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{collection}_entities"')
        loader.vector_store.connection_pool.close()
        shutil.rmtree(_HOME, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for mode in ("shipped", "iterative"):
            r = report[mode]
            print(f"{mode:9s} p50 {r['search_ms']['p50']:7.2f}  p95 {r['search_ms']['p95']:7.2f}  "
                  f"p99 {r['search_ms']['p99']:7.2f} ms   returned {r['returned_mean_of_10']:5.2f}/10   "
                  f"vector rows {r['vector_rows_mean']:5.1f}/{r['vector_rows_asked']}   "
                  f"text recall vs exact {r['text_recall_vs_exact']:.2f}")
        for mode in ("memstream", "memstream_names"):
            if mode in report:
                r = report[mode]
                print(f"{mode:9s} p50 {r['search_ms']['p50']:7.2f}  p95 {r['search_ms']['p95']:7.2f}  "
                      f"p99 {r['search_ms']['p99']:7.2f} ms   (full read, taking turns with mem0's searches)")
        if "memstream_search" in report:
            r, ratio = report["memstream_search"], report["memstream_search_over_mem0_iterative"]
            print(f"memstream search(kinds=facts) p50 {r['search_ms']['p50']:7.2f}  p95 {r['search_ms']['p95']:7.2f} ms   "
                  f"returned {r['returned_mean_of_10']:5.2f}/10 (min {r['returned_min']})   "
                  f"over mem0 iterative: p50 {ratio['p50']}x  p95 {ratio['p95']}x   (equal work)")
        r = report["exact"]
        print(f"exact     p50 {r['search_ms_p50']:7.2f} ms (12 calls)   returned {r['returned_mean_of_10']:5.2f}/10")
        print(f"rows {report['rows']} ({report['heavy_rows']} heavy, {report['users']} users), load {report['load_s']} s")
    return report


if __name__ == "__main__":
    main()
