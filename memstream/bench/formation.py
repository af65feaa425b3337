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

from memstream.bench import discarded, prepared
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


async def append_backlog(settings: Settings, turns: list[TurnRecorded]) -> None:
    """Append ``turns`` (a backlog, such as ``fact_turns``) to ``settings``' events topic."""
    from memstream.streams.log.producer import TurnLog

    async with TurnLog(settings) as log:
        for i in range(0, len(turns), 500):
            await log.append_many(turns[i:i + 500])


def calls_before(turns: list[TurnRecorded]) -> int:
    """LLM calls the formation of these turns made before one call per turn extracted both facts
    and relations and one resolved all of a turn's candidates: an extraction, a relation
    extraction and one resolution per candidate fact, for every turn (the offline rules find the
    same candidates a model would be asked about)."""
    from memstream.llm.offline import extract_facts

    return sum(2 + len(extract_facts(t)) for t in turns)


def _scrape(port: int) -> dict:
    """The worker's LLM counters (calls, input and output tokens) and each step's batches
    (count, seconds), from formation's metrics (``port``) and the projections' (``port + 1``)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {"calls": 0.0, "input": 0.0, "output": 0.0, "batches": {}}
    for at in (port, port + 1):
        text = urllib.request.urlopen(f"http://127.0.0.1:{at}/metrics", timeout=5).read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "memstream_llm_calls_total":
                    out["calls"] += sample.value
                elif sample.name == "memstream_llm_tokens_total":
                    out[sample.labels["direction"]] += sample.value
                elif sample.name in ("memstream_batch_seconds_count", "memstream_batch_seconds_sum"):
                    step = out["batches"].setdefault(sample.labels["step"], [0.0, 0.0])
                    step[sample.name.endswith("_sum")] += sample.value
    return out


def _batches(before: dict, after: dict) -> dict:
    """Batches each step ran between two scrapes, and their mean seconds."""
    out = {}
    for step, (n, seconds) in after["batches"].items():
        n0, s0 = before["batches"].get(step, (0.0, 0.0))
        if n > n0:
            out[step] = {"batches": int(n - n0), "mean_ms": round((seconds - s0) / (n - n0) * 1000, 1)}
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:  # two in a row: formation's and the projections' (port + 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return port if port < 65534 else _free_port()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _paced(settings: Settings, dsn: str, tag: str, *, users: int, rate: float, heavy_every: float,
                 heavy_turns: int, seed: int = 11) -> dict:
    """Turns appended as they would arrive: ``rate`` turns/s from the other users, and one very
    active user's turn every ``heavy_every`` s; each turn's time from its append to its facts
    (every read projection) visible."""
    from memstream.projections import positions
    from memstream.projections.db import create_pool
    from memstream.read_client.reader import READ_YOUR_WRITES
    from memstream.streams.log.producer import TurnLog

    r = random.Random(seed)
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    seen: dict[str, list[float]] = {"heavy": [], "others": []}
    waiting: list[tuple] = []  # (partition, offset, who, appended at)
    said: list[TurnRecorded] = []  # the very active user's turns
    done = asyncio.Event()

    async def watch() -> None:
        # One reader of the positions for every turn in flight (a poll per turn would load
        # Postgres as much as the worker does, and time the polling).
        while waiting or not done.is_set():
            pending = list(waiting)  # more are appended while the positions are read
            applied = {p: await positions.applied_through(pool, READ_YOUR_WRITES, settings.events_topic, p)
                       for p in {w[0] for w in pending}}
            now = time.perf_counter()
            for w in [w for w in pending if applied[w[0]] > w[1]]:
                seen[w[2]].append(now - w[3])
                waiting.remove(w)
            await asyncio.sleep(0.02)

    def turn(user: str, i: int) -> TurnRecorded:
        return TurnRecorded.new(user_id=user, conversation_id="paced", user_message=r.choice(TEMPLATES)(r),
                                assistant_message="Noted, thanks!",
                                occurred_at=datetime(2026, 2, 1, tzinfo=timezone.utc) + timedelta(seconds=i))

    async with TurnLog(settings) as log:
        async def heavy() -> None:
            for i in range(heavy_turns):
                t0 = time.perf_counter()
                said.append(turn(f"form-{tag}-heavy", i))
                [p] = await log.append_many(said[-1:])
                waiting.append((p.partition, p.offset, "heavy", t0))
                await asyncio.sleep(max(0.0, heavy_every - (time.perf_counter() - t0)))

        async def others() -> None:
            tick, i, until = 0.2, 0, time.perf_counter() + heavy_turns * heavy_every
            owed = 0.0
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                owed += rate * tick
                batch = [turn(f"form-{tag}-{r.randrange(users)}", 10_000 + i + k) for k in range(int(owed))]
                owed -= len(batch)
                i += len(batch)
                if batch:
                    for p in await log.append_many(batch):
                        waiting.append((p.partition, p.offset, "others", t0))
                await asyncio.sleep(max(0.0, tick - (time.perf_counter() - t0)))

        watcher = asyncio.ensure_future(watch())
        await asyncio.gather(heavy(), others())
        done.set()
        await asyncio.wait_for(watcher, 120)
    await pool.close()
    ms = lambda v: round(v * 1000, 1)  # noqa: E731
    # Their own calls per turn (each turn after the first has facts of its slot to weigh: two).
    heavy_calls = (await calls_per_turn(said))["calls_per_turn"]
    return {"heavy_user_turns": len(seen["heavy"]), "heavy_every_s": heavy_every,
            "heavy_user_llm_calls_per_turn": heavy_calls,
            "heavy_turn_to_facts_visible_p50_ms": ms(_pct(seen["heavy"], 0.5)),
            "heavy_turn_to_facts_visible_p95_ms": ms(_pct(seen["heavy"], 0.95)),
            "other_turns": len(seen["others"]), "other_turns_per_s": rate,
            "turn_to_facts_visible_p50_ms": ms(_pct(seen["others"], 0.5)),
            "turn_to_facts_visible_p95_ms": ms(_pct(seen["others"], 0.95))}


async def _applied(pool, settings: Settings, deadline: float) -> None:
    """Until every read projection has applied what formation made of every event it formed."""
    from memstream.projections import positions
    from memstream.read_client.reader import READ_YOUR_WRITES

    formed = await positions.load(pool, "formation", settings.events_topic)
    for p, offset in formed.items():
        while await positions.applied_through(pool, READ_YOUR_WRITES, settings.events_topic, p) < offset:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the projections did not apply partition {p} up to {offset}")
            await asyncio.sleep(0.05)


async def run_formation_bench(base: Settings, *, turns: int, users: int, llm_latency: float | None = None,
                              llm_latency_p95: float | None = None, concurrency: int | None = None,
                              paced: bool = True, on_progress=None) -> dict:
    from memstream.projections.db import create_pool
    from memstream.stack.worker_process import WorkerProcess

    settings, tag, dsn = await prepared(base, "benchf")
    port = _free_port()
    update = {"metrics_port": port}
    if llm_latency is not None:
        update.update(extractor="offline+latency", stand_in_latency_p50=llm_latency,
                      stand_in_latency_p95=llm_latency_p95)
    if concurrency is not None:
        # A batch holds one worker's turns in flight: at least as many as the calls it may make.
        update.update(formation_concurrency=concurrency, batch_size=max(settings.batch_size, concurrency))
    settings = settings.model_copy(update=update)
    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    batch = fact_turns(turns, users, tag)
    await append_backlog(settings, batch)

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
        await _applied(pool, settings, time.perf_counter() + 120)  # every decision in the counts below
        used = await asyncio.to_thread(_scrape, port)
        kinds = Counter({r["status"]: r["n"] for r in await pool.fetch(
            "SELECT status, count(*) AS n FROM memory_facts GROUP BY status")})
        reinforced = await pool.fetchval("SELECT coalesce(sum(observation_count - 1), 0)::bigint FROM memory_facts")
        deferred = await pool.fetchval("SELECT count(*) FROM memory_facts WHERE deferred <> '{}'::jsonb")
        rate = formed_turns / seconds
        latency = None
        if paced and llm_latency is not None:
            per_turn = used["calls"] / turns * llm_latency
            latency = await _paced(settings, dsn, tag, users=users, rate=round(rate / 2, 1),
                                   heavy_every=round(2 * per_turn, 2), heavy_turns=40)
            latency["paced_batches"] = _batches(used, await asyncio.to_thread(_scrape, port))
    finally:
        worker.stop()
        await pool.close()
        await discarded(settings, dsn)
    calls = used["calls"]
    report = {
        "turns": turns, "users": users, "extractor": settings.extractor,
        "worker": "memstream worker (formation + projections processes), embed_threads=%d" % settings.embed_threads,
        "llm_latency_s": llm_latency, "llm_latency_p95_s": llm_latency_p95,
        "concurrency": settings.formation_concurrency, "batch_size": settings.batch_size,
        "timed_turns": formed_turns, "seconds": round(seconds, 2),
        "formation_turns_per_s": round(rate, 1),
        "llm_calls_per_turn": round(calls / turns, 3),
        "llm_calls_per_turn_before": round(calls_before(batch) / turns, 3),
        "tokens_per_turn": {"input": round(used["input"] / turns, 1), "output": round(used["output"] / turns, 1)},
        "fact_rows": dict(kinds), "reinforcements": reinforced, "facts_with_gate_deferrals": deferred,
        "batches": _batches({"batches": {}}, used),
    }
    if llm_latency is not None:
        bound = settings.formation_concurrency / (calls / turns * llm_latency)
        report.update(bound_turns_per_s=round(bound, 1), share_of_bound=round(rate / bound, 3))
    if latency:
        report.update(latency)
    return report


async def calls_per_turn(turns: list[TurnRecorded]) -> dict:
    """LLM calls formation makes for ``turns`` (each user's in order, as a worker forms them),
    counted on the latency stand-in at no latency, in memory (no stack); and what it made
    before (``calls_before``)."""
    from memstream.embedding import default_embedder
    from memstream.llm.latency import Latency, Meter, latent_clients
    from memstream.streams.worker.formation.pipeline import Formation
    from memstream.streams.worker.formation.graph import GraphView
    from memstream.streams.worker.formation.views import MemoryView
    from memstream.streams.log.records import Record

    meter = Meter()
    extractor, resolver, relations, turn = latent_clients(Latency(0.0), meter)
    embedder = await asyncio.to_thread(default_embedder)
    formation = Formation(producer=None, decisions_topic="", embedder=embedder, extractor=extractor, resolver=resolver,
                          dead_letters=None, pool=None, barrier=None, relations=relations, turn_extractor=turn)
    records = [Record(topic="events", partition=0, offset=i, key=t.user_id.encode(), value=b"", headers=(),
                      timestamp_ms=int(t.occurred_at.timestamp() * 1000)) for i, t in enumerate(turns)]
    await formation.decide(list(zip(records, turns)), MemoryView(embedder.model_id), GraphView(None))
    return {"turns": len(turns), "calls_per_turn": round(meter.calls / len(turns), 3),
            "calls_per_turn_before": round(calls_before(turns) / len(turns), 3),
            "input_tokens_per_turn": round(meter.input_tokens / len(turns), 1),
            "output_tokens_per_turn": round(meter.output_tokens / len(turns), 1)}
