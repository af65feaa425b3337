"""Whole-machine `perf` profile of one reader's heavy reads: where a read's CPU goes, Postgres included.

`perf record -a` runs only around the timed reads (after warm-up), so the profile holds the
reader, its Postgres backends, Redis and Kafka as they share the cores during reads, and nothing
else. Needs `perf` (Debian: linux-perf) and a kept `memstream bench read` corpus:

    .venv/bin/memstream bench read --rows 1000000 --keep --json
    .venv/bin/python scripts/perf_read.py --schema benchr_<id> [--reads 1500] [--call-graph]
    perf report -i perf-read.data --sort comm,dso            # by process and library
    perf report -i perf-read.data --comm postgres --sort sym  # Postgres' hot symbols
    perf report -i perf-read.data --comm postgres --children --sort sym   # with --call-graph

Reads ask the 12 benchmark questions in the user's newest conversation, its last turns in Tier 0,
as `memstream bench read` reads a conversation in progress.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import time

from memstream.bench.read import QUESTIONS, ongoing_conversation
from memstream.config import Settings
from memstream.read_client import MemoryReader


async def profile(a: argparse.Namespace) -> None:
    s = Settings().model_copy(update={"postgres_schema": a.schema})
    reader = await MemoryReader.connect(s, s.dsn())
    try:
        conversation = await ongoing_conversation(reader._pool, reader._redis, a.schema, a.user, s.tier0_turns)
        for i in range(a.warmup):
            await reader.read(a.user, conversation, QUESTIONS[i % len(QUESTIONS)])
        cmd = ["perf", "record", "-a", "-F", str(a.freq), "-o", a.out]
        if a.call_graph:  # Postgres is built without frame pointers: unwind from stack copies
            cmd += ["--call-graph", "dwarf,16384"]
        perf = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        await asyncio.sleep(0.5)  # perf attached before the first timed read
        t = time.perf_counter()
        for i in range(a.reads):
            await reader.read(a.user, conversation, QUESTIONS[i % len(QUESTIONS)])
        per_read = (time.perf_counter() - t) / a.reads * 1000
        perf.send_signal(signal.SIGINT)
        perf.wait()
        print(f"{a.reads} reads of {a.user!r}, {per_read:.2f} ms each (wall, under perf); profile in {a.out}")
    finally:
        await reader.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schema", required=True, help="a kept bench read corpus (benchr_<id>)")
    ap.add_argument("--user", default="heavy")
    ap.add_argument("--reads", type=int, default=1500)
    ap.add_argument("--warmup", type=int, default=400)
    ap.add_argument("--freq", type=int, default=4999, help="samples per second per CPU")
    ap.add_argument("--call-graph", action="store_true", help="DWARF call graphs (large files: use ~300 reads)")
    ap.add_argument("--out", default="perf-read.data")
    asyncio.run(profile(ap.parse_args()))


if __name__ == "__main__":
    main()
