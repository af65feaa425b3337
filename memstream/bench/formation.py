"""``memstream bench formation``: turns/s through formation (offline extractor) for one worker.

A backlog of fact-rich turns (moves, jobs, preferences, allergies, pets, plans — so formation
extracts, resolves, gates and supersedes) is appended to fresh topics before the worker starts;
the clock runs from the first turn formed to the last, read from formation's stored position.
The worker runs both roles, since formation waits on the facts projection (its barrier).
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

from memstream.bench import prepared
from memstream.config import Settings
from memstream.schemas import TurnRecorded

CITIES = ["Lisbon", "Berlin", "Porto", "Madrid", "Oslo", "Dublin", "Vienna", "Prague", "Rome", "Athens"]
COMPANIES = ["Acme Corp", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries"]
HOBBIES = ["hiking", "jazz", "chess", "climbing", "baking", "cycling", "board games", "sailing"]
TEMPLATES = [
    lambda r: f"I live in {r.choice(CITIES)}.",
    lambda r: f"I moved to {r.choice(CITIES)} last month.",
    lambda r: f"I work at {r.choice(COMPANIES)}.",
    lambda r: f"I just joined {r.choice(COMPANIES)}!",
    lambda r: f"I really enjoy {r.choice(HOBBIES)} on weekends.",
    lambda r: f"I can't stand {r.choice(['cilantro', 'olives', 'horror movies', 'traffic'])}.",
    lambda r: f"I'm allergic to {r.choice(['peanuts', 'shellfish', 'cats', 'pollen'])}.",
    lambda r: f"My dog {r.choice(['Rex', 'Luna', 'Bolt'])} loves the park.",
    lambda r: f"We're visiting {r.choice(CITIES)} in {r.choice(['April', 'June', 'October'])}.",
    lambda r: "Can you help me write an email to my landlord?",
]


def fact_turns(n: int, users: int, tag: str, seed: int = 7) -> list[TurnRecorded]:
    r = random.Random(seed)
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [TurnRecorded.new(user_id=f"form-{tag}-{i % users}", conversation_id=f"c{i % users}",
                             user_message=r.choice(TEMPLATES)(r), assistant_message="Noted, thanks!",
                             occurred_at=base + timedelta(minutes=i)) for i in range(n)]


async def run_formation_bench(base: Settings, *, turns: int, users: int, on_progress=None) -> dict:
    from memstream.projections.db import create_pool, drop_schema
    from memstream.stack.worker_process import WorkerProcess
    from memstream.streams.producer import TurnLog

    settings, tag, dsn = await prepared(base, "benchf")
    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    batch = fact_turns(turns, users, tag)
    async with TurnLog(settings) as log:
        for i in range(0, len(batch), 500):
            await log.append_many(batch[i:i + 500])

    async def formed() -> int:
        return await pool.fetchval("SELECT coalesce(sum(next_offset), 0)::bigint FROM projection_positions "
                                   "WHERE projection = 'formation' AND topic = $1", settings.events_topic)

    worker = WorkerProcess(settings, Path(settings.home) / "logs" / f"benchf-{tag}.log")
    try:
        t_first = None
        deadline = time.perf_counter() + 1800
        while (done := await formed()) < turns:
            if on_progress:
                on_progress(done, turns)
            if t_first is None and done > 0:
                t_first, n_first = time.perf_counter(), done
            if time.perf_counter() > deadline:
                raise TimeoutError(f"formation did not finish; see {worker.log_path}")
            await asyncio.sleep(0.02)
        seconds = time.perf_counter() - t_first
        formed_turns = turns - n_first
        await asyncio.sleep(2)  # let the facts projection apply the last decisions
        kinds = Counter({r["status"]: r["n"] for r in await pool.fetch(
            "SELECT status, count(*) AS n FROM memory_facts GROUP BY status")})
        reinforced = await pool.fetchval("SELECT coalesce(sum(observation_count - 1), 0)::bigint FROM memory_facts")
        deferred = await pool.fetchval("SELECT count(*) FROM memory_facts WHERE deferred <> '{}'::jsonb")
    finally:
        worker.stop()
        await pool.close()
        await drop_schema(dsn, settings.postgres_schema)
    return {
        "turns": turns, "users": users, "extractor": settings.extractor,
        "worker": "memstream worker (formation + projections processes), embed_threads=%d" % settings.embed_threads,
        "timed_turns": formed_turns, "seconds": round(seconds, 2),
        "formation_turns_per_s": round(formed_turns / seconds, 1),
        "fact_rows": dict(kinds), "reinforcements": reinforced, "facts_with_gate_deferrals": deferred,
    }
