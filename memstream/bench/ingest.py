"""``memstream bench ingest``: the write path, measured on the local stack with one worker.

Two phases over fresh topics and a fresh schema:

* **paced** (the first ``latency_share`` of the turns, at ``rate`` turns/s, below the worker's
  capacity): append-acknowledgement latency and turn-to-episode-visible latency, i.e. from the
  call to ``TurnLog.append`` until the episodes projection's watermark covers the turn;
* **burst** (the rest, appended as fast as Kafka acknowledges): sustained episodes/s, from the
  first to the last episode becoming visible;

then a replay of every projection from the log just written into a scratch schema (records/s).
``MEMSTREAM_SEAL_RECORDS=false`` runs it all with plain records: sealing's cost is the ratio.

Visibility is observed by polling ``projection_positions`` every 5 ms, so e2e figures carry up
to 5 ms of observation granularity.
"""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from memstream.bench import discarded, prepared
from memstream.config import Settings
from memstream.schemas import TurnRecorded

POLL_S = 0.005


def _pcts(values_ms: list[float]) -> dict[str, float]:
    if not values_ms:
        return {}
    a = np.asarray(values_ms)
    return {"p50": round(float(np.percentile(a, 50)), 2), "p95": round(float(np.percentile(a, 95)), 2),
            "p99": round(float(np.percentile(a, 99)), 2), "max": round(float(a.max()), 2)}


def _turns(n: int, users: int, tag: str) -> list[TurnRecorded]:
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    topics = ["my job at the bakery", "the trip to Kyoto", "my knee injury", "Lily's birthday party",
              "learning Japanese", "moving to Berlin", "my dog Rex", "the marathon plan"]
    return [
        TurnRecorded.new(
            user_id=f"bench-{tag}-{i % users}", conversation_id=f"c{i % users}-{i // (users * 20)}",
            user_message=f"Turn {i}: let me tell you more about {topics[i % len(topics)]} and how it went today.",
            assistant_message="Thanks for sharing, tell me more!", occurred_at=base + timedelta(seconds=i))
        for i in range(n)
    ]


class Visibility:
    """Records when each (partition, offset) of the events topic became visible."""

    def __init__(self, pool, topic: str):
        self.pool, self.topic = pool, topic
        self.marks: dict[int, int] = {}
        self.history: list[tuple[float, dict[int, int]]] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            rows = await self.pool.fetch(
                "SELECT partition, next_offset FROM projection_positions WHERE projection = 'episodes' AND topic = $1",
                self.topic)
            now = time.perf_counter()
            marks = {r["partition"]: r["next_offset"] for r in rows}
            if marks != self.marks:
                self.marks = marks
                self.history.append((now, marks))
            await asyncio.sleep(POLL_S)

    def stop(self) -> None:
        self._stop.set()

    def visible_at(self, partition: int, offset: int) -> float | None:
        for t, marks in self.history:
            if marks.get(partition, 0) > offset:
                return t
        return None

    def covers(self, positions) -> bool:
        return all(self.marks.get(p.partition, 0) > p.offset for p in positions)


async def run_ingest_bench(base: Settings, *, turns: int, users: int, rate: float = 25.0,
                           latency_share: float = 0.2, on_progress=None) -> dict:
    from memstream.projections.db import create_pool
    from memstream.stack.worker_process import WorkerProcess
    from memstream.streams.log.producer import TurnLog
    from memstream.streams.ops.replay import PROJECTIONS, replay

    settings, tag, dsn = await prepared(base, "bench")
    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    all_turns = _turns(turns + 1, users, tag)
    warm, paced, burst = all_turns[0], all_turns[1:1 + int(turns * latency_share)], all_turns[1 + int(turns * latency_share):]
    vis = Visibility(pool, settings.events_topic)
    poller = asyncio.ensure_future(vis.run())
    worker = WorkerProcess(settings, Path(settings.home) / "logs" / f"bench-{tag}.log")
    try:
        async with TurnLog(settings) as log:
            pos = await log.append(warm)
            await _until(lambda: vis.covers([pos]), 120)  # worker up, model loaded, group joined

            acks, e2e, sent = [], [], []
            interval = 1.0 / rate
            t_start = time.perf_counter()

            async def one(i: int, turn: TurnRecorded) -> None:
                await asyncio.sleep(max(0.0, t_start + i * interval - time.perf_counter()))
                t = time.perf_counter()
                p = await log.append(turn)
                acks.append((time.perf_counter() - t) * 1000)
                sent.append((t, p))
                if on_progress:
                    on_progress(len(sent), turns)

            await asyncio.gather(*(one(i, t) for i, t in enumerate(paced)))
            await _until(lambda: vis.covers([p for _, p in sent]), 600)
            for t, p in sent:
                e2e.append((vis.visible_at(p.partition, p.offset) - t) * 1000)

            burst_acks: list[float] = []
            t_burst = time.perf_counter()
            positions = []
            for i in range(0, len(burst), 500):
                chunk = burst[i:i + 500]
                t = time.perf_counter()
                positions += await log.append_many(chunk)
                burst_acks.append((time.perf_counter() - t) * 1000 / len(chunk))
                if on_progress:
                    on_progress(len(sent) + len(positions), turns)
            append_s = time.perf_counter() - t_burst
            await _until(lambda: vis.covers(positions), 1800)
            seen = [vis.visible_at(p.partition, p.offset) for p in positions]
            drain_s = max(seen) - t_burst
    finally:
        vis.stop()
        await poller
        worker.stop()
        await pool.close()
    try:  # the log just written, rebuilt: what a replay of it costs (opening every sealed record)
        rebuilt = await replay(settings, dsn, settings.postgres_schema + "_replay", list(PROJECTIONS))
    finally:
        await discarded(settings, dsn, settings.postgres_schema + "_replay")
    return {
        "sealed": settings.seal_records,
        "turns": turns, "users": users, "worker": "memstream worker (formation + projections processes), embed_threads=%d" % settings.embed_threads,
        "paced_turns": len(paced), "paced_rate_per_s": rate,
        "append_ack_ms": _pcts(acks),
        "turn_to_episode_visible_ms": _pcts(e2e),
        "burst_turns": len(burst),
        "burst_append_turns_per_s": round(len(burst) / append_s, 1),
        "burst_append_ms_per_turn_in_batches_of_500": _pcts(burst_acks),
        "sustained_episodes_per_s": round(len(burst) / drain_s, 1),
        "burst_drain_s": round(drain_s, 2),
        "replay_records": rebuilt.records,
        "replay_records_per_s": round(rebuilt.records_per_s, 1),
    }


async def _until(cond, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not cond():
        if time.perf_counter() > deadline:
            raise TimeoutError("the worker did not keep up; see its log under .memstream/logs")
        await asyncio.sleep(0.01)
