"""Interleaved A/B of whole reads: two checkouts of memstream, read by read.

This machine's speed drifts by tens of percent over minutes, so two `memstream bench read` runs
minutes apart cannot show a 10% change. Here one reader process per checkout is started on the
same corpus, and the two take turns, read by read (the order flips every read), on the same
questions; each prints its latencies.

    git worktree add /tmp/before <rev>
    .venv/bin/memstream bench read --rows 1000000 --keep --json      # or reuse a kept corpus
    .venv/bin/python scripts/ab_read.py --before /tmp/before --schema benchr_<id> [--user heavy] [--reads 300] [--names]

Needs the editable install (`make install`): each child points memstream's import mapping at
its checkout. Both checkouts must read the same schema version (a newer migration is harmless
to older code).
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]


def child(root: str, schema: str, names: bool, uncached_tokens: bool) -> None:
    import __editable___memstream_0_1_0_finder as finder  # the editable install's import mapping

    finder.MAPPING.update({k: v.replace(str(HERE), root) for k, v in finder.MAPPING.items()})
    import redis.asyncio as aioredis

    from memstream.bench.read import QUESTIONS
    from memstream.config import Settings
    from memstream.embedding import default_embedder
    from memstream.projections.db import create_pool
    from memstream.read_client import MemoryReader

    async def serve() -> None:
        s = Settings().model_copy(update={"postgres_schema": schema})
        pool = await create_pool(s.dsn(), schema, min_size=4, max_size=24)
        extra = {"keyword_mode": "names"} if names else {}
        if "text_pool" in inspect.signature(MemoryReader).parameters:  # checkouts from 2026-11-30 on
            extra["text_pool"] = await create_pool(s.dsn(), schema, min_size=24, max_size=24, generic_plans=True,
                                                   **({"prepare": MemoryReader.prepare_text_lane}
                                                      if hasattr(MemoryReader, "prepare_text_lane") else {}))
        reader = MemoryReader(pool=pool, redis=aioredis.from_url(s.redis_url), schema=schema,
                              embedder=default_embedder(s.read_embed_threads, s.embedding_variant), **extra)
        if uncached_tokens:  # every text counted as new, as for a real user's new turns
            reader._tokens.count = reader._tokens._count
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        while (line := await loop.run_in_executor(None, sys.stdin.readline)).strip():
            user, i = line.split()
            t = time.perf_counter()
            await reader.read(user, "c", QUESTIONS[int(i) % len(QUESTIONS)])
            print(f"{(time.perf_counter() - t) * 1000:.3f}", flush=True)
        await pool.close()

    asyncio.run(serve())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="checkout to compare with this one")
    ap.add_argument("--schema", required=True)
    ap.add_argument("--user", default="heavy")
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--names", action="store_true", help='keyword_mode="names"')
    ap.add_argument("--uncached-tokens", action="store_true",
                    help="count every text's tokens as new (the bench's repeated questions hit the cache)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.schema, a.names, a.uncached_tokens)
    procs = {name: subprocess.Popen(
        [sys.executable, __file__, "--child", root, "--before", a.before, "--schema", a.schema]
        + (["--names"] if a.names else []) + (["--uncached-tokens"] if a.uncached_tokens else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for name, root in (("before", str(Path(a.before).resolve())), ("now", str(HERE)))}
    for p in procs.values():
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("a reader did not start (run with the editable install, see the docstring)")
    lat: dict[str, list[float]] = {name: [] for name in procs}
    for i in range(a.warmup + a.reads):
        for name in (list(procs) if i % 2 == 0 else list(procs)[::-1]):
            p = procs[name]
            p.stdin.write(f"{a.user} {i}\n")
            p.stdin.flush()
            ms = float(p.stdout.readline())
            if i >= a.warmup:
                lat[name].append(ms)
    for p in procs.values():
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait()
    for name, v in lat.items():
        print(f"{name:7s} p50 {np.percentile(v, 50):6.2f}  p95 {np.percentile(v, 95):6.2f}  "
              f"p99 {np.percentile(v, 99):6.2f}  mean {np.mean(v):6.2f}  ({a.user}, {len(v)} reads)")


if __name__ == "__main__":
    main()
