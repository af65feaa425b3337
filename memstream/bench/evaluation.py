"""``memstream eval``: retrieval accuracy on a public memory benchmark, beside plain retrievers.

A set (LoCoMo, BEAM or LongMemEval, read by ``evalsets.load_set``) is ingested through the real
write path (``TurnLog`` -> ``memstream worker`` subprocess -> projections), one episode per
utterance, and every question is asked through ``MemoryReader.read`` with the default settings
and budgets: what a host would get back. In the same run, on the same episodes, plain
retrievers answer the same questions — BM25 over the whole texts, dense retrieval over each
episode's own vector (the same embedder's), dense over every passage's vector, and the
reciprocal rank fusion of BM25 and dense — so memstream's figures can be read against the
simplest things that could have been built instead, and never alone.

The scores are Hit@k, Recall@k and MRR of the evidence utterances among the first ``k``
returned (memstream's by their ``rank``: a read's episodes section is in time order), per
category (LoCoMo) or ability (BEAM) and overall, with the Recall@k ceiling where evidence has
more than ``k`` items. An utterance longer than an event may hold is truncated, counted and
warned about, never a failed run.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from memstream.bench import discarded, isolated
from memstream.bench.baselines import BM25, dense_search, recall_ceiling, rrf
from memstream.bench.evalsets import fit_messages, load_set
from memstream.bench.locomo import QA_CONVERSATION, Sample, sample_turns, score, select_samples, user_id_for
from memstream.config import Settings
from memstream.embedding import from_bytes
from memstream.read_settings import MAX_K
from memstream.schemas.events import MAX_MESSAGE_CHARS

log = logging.getLogger("memstream.eval")

APPEND_CHUNK = 500
CATCH_UP_TIMEOUT_S = 3600.0  # worker start-up (model load, group join) plus formation of every turn
CATCH_UP_POLL_S = 10.0  # one bounded read-your-writes wait; the worker's liveness is checked between
METHODS = ("memstream", "bm25", "dense", "dense_passages", "rrf")


async def run_eval(base: Settings, path: Path, *, fmt: str = "auto", conv: str | None = None, k: int = 5,
                   limit: int | None = None, catch_up_timeout: float = CATCH_UP_TIMEOUT_S, keep: bool = False,
                   reuse: str | None = None, on_progress=None, sweep: bool = False, reflect: bool = False) -> dict:
    """Ingest ``path`` through a fresh pipeline (own topics, group and schema), ask every question
    of memstream and of the plain retrievers, and score them. ``limit``: the first samples only.
    The schema is dropped, the worker stopped and the topics deleted afterwards, whatever
    happens, unless ``keep`` (the report's ``tag`` then names the run, and ``reuse=tag`` asks
    its questions again without ingesting, and keeps it still: for trying settings). ``sweep``: then run a decay
    sweep for each user as of their last turn (through the pipeline: archived facts, episodes
    moved to the cold index) and ask every question again (method ``memstream_swept``).
    ``reflect``: then (after the sweep, if any) a reflection sweep of each user as of their last
    turn, and every question asked again (``memstream_reflected``); the report's ``context``
    scores the evidence found anywhere in what a read returned, before and after it."""
    from memstream.projections.db import migrate
    from memstream.read_client import MemoryReader
    from memstream.stack.launcher import stack_from_settings
    from memstream.stack.worker_process import WorkerProcess
    from memstream.streams.log.topics import ensure_topics

    if not 1 <= k <= MAX_K:  # before an ingest of hours, not at the first question
        raise ValueError(f"k must be from 1 to {MAX_K}")
    samples = select_samples(load_set(path, fmt), conv)[:limit]
    # "speaker: text" is what an episode holds (``sample_turns``).
    samples, truncated = fit_messages(samples, MAX_MESSAGE_CHARS)
    on_progress = on_progress or (lambda done, total: None)
    settings, tag = isolated(base, "locomo", reuse)
    stack_from_settings(settings).up()
    dsn = settings.dsn()
    worker = reader = None
    ingest_s = 0.0
    log.info("eval %s: %d samples, k=%d, schema %s", path, len(samples), k, settings.postgres_schema)
    try:
        if reuse is None:
            await ensure_topics(settings)
        await migrate(dsn, settings.postgres_schema)  # a kept run's schema, to the code's migrations
        reader = await MemoryReader.connect(settings, dsn)
        if reuse is None or sweep or reflect:
            worker = WorkerProcess(settings, Path(settings.home) / "logs" / f"locomo-{tag}.log")
        if reuse is None:
            t0 = time.perf_counter()
            last = await _ingest(settings, samples, tag)
            await _wait_caught_up(reader, last, worker, catch_up_timeout)
            ingest_s = time.perf_counter() - t0
            log.info("ingested %d turns in %.1f s (including worker start-up)",
                     sum(len(s.utterances) for x in samples for s in x.sessions), ingest_s)
        asked = await _ask(reader, samples, tag, k, on_progress)
        plain = await _baselines(settings, dsn, samples, tag, k)
        if sweep:
            swept = await _swept(settings, dsn, reader, worker, catch_up_timeout)
            after = await _ask(reader, samples, tag, k, on_progress)
        if reflect:
            reflected = await _reflected(settings, dsn, reader, worker, catch_up_timeout)
            since = await _ask(reader, samples, tag, k, on_progress)
            rests_on = await _rests_on(settings, dsn)
    finally:
        if reader is not None:
            await reader.close()
        if worker is not None:
            worker.stop()
        if not keep and reuse is None:  # a kept run asked again stays kept
            await discarded(settings, dsn)
    results, latencies, degraded, _ = asked
    methods = {"memstream": score(results, k), **{name: score(r, k) for name, r in plain.items()}}
    if sweep:
        methods = {"memstream": methods.pop("memstream"), "memstream_swept": score(after[0], k), **methods}
    if reflect:
        methods = {"memstream": methods.pop("memstream"), "memstream_reflected": score(since[0], k), **methods}
    report = {"file": str(path), "samples": len(samples), "questions": len(results), "k": k,
              "truncated_messages": truncated, **methods["memstream"],
              "recall_ceiling": recall_ceiling([len(set(e)) for _, e, _ in results if e], k),
              "methods": methods, "ingest_seconds": round(ingest_s, 2), **_latency(latencies),
              "degraded_reads": degraded}
    if sweep:
        report["sweep"] = {**swept, **{f"swept_{name}": v for name, v in _latency(after[1]).items()},
                           "swept_degraded_reads": after[2]}
    if reflect:
        last = after if sweep else asked
        report["reflect"] = {**reflected, **{f"reflected_{name}": v for name, v in _latency(since[1]).items()},
                             "reflected_degraded_reads": since[2]}
        report["context"] = {"before": score(_in_context(last, rests_on), None),
                             "after": score(_in_context(since, rests_on), None)}
    if keep or reuse is not None:
        report["tag"] = tag
    log.info("eval overall: %s", {name: m["overall"] for name, m in methods.items()})
    return report


async def _ingest(settings: Settings, samples: Sequence[Sample], tag: str) -> dict:
    """Append every sample's turns in order; returns each user's last log position."""
    from memstream.streams.log.producer import TurnLog

    last = {}
    async with TurnLog(settings) as turn_log:
        for sample in samples:
            turns = sample_turns(sample, tag)
            for i in range(0, len(turns), APPEND_CHUNK):
                positions = await turn_log.append_many(turns[i:i + APPEND_CHUNK])
                last[user_id_for(tag, sample)] = positions[-1]
    return last


async def _swept(settings: Settings, dsn: str, reader, worker, timeout: float) -> dict:
    """A decay sweep of each user as of their last turn, applied (read-your-writes); how much it
    archived and moved."""
    from memstream.projections.db import create_pool
    from memstream.streams.worker.sweeping import sweep

    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    try:
        last = await pool.fetch("SELECT user_id, max(occurred_at) AS at FROM episodes GROUP BY user_id ORDER BY 1")
        appended, archived, cooled = {}, 0, 0
        for r in last:
            found = await sweep(settings, pool, at=r["at"], user_id=r["user_id"])
            appended.update(found.appended)
            archived, cooled = archived + found.archiving, cooled + found.cooling
        await _wait_caught_up(reader, appended, worker, timeout)
        held = await pool.fetchrow("SELECT count(*) FILTER (WHERE cooled_at IS NULL) AS hot, "
                                   "count(*) FILTER (WHERE cooled_at IS NOT NULL) AS cold FROM episodes")
    finally:
        await pool.close()
    log.info("swept %d users: %d facts archived, %d episodes to the cold index", len(last), archived, cooled)
    return {"users": len(last), "facts_archived": archived, "episodes_cooled": cooled,
            "episodes_hot_after": held["hot"], "episodes_cold_after": held["cold"],
            "cold_after_days": settings.episode_cold_after_days}


async def _reflected(settings: Settings, dsn: str, reader, worker, timeout: float) -> dict:
    """A reflection sweep of each user as of their last turn, applied (read-your-writes); what it
    asked about and what formation kept."""
    from memstream.embedding import embedder_for
    from memstream.projections.db import create_pool
    from memstream.streams.worker.reflecting import sweep

    model = embedder_for(settings).model_id
    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    try:
        before = await pool.fetchrow(_REFLECTED)  # a kept run asked again may hold an earlier sweep's
        last = await pool.fetch("SELECT user_id, max(occurred_at) AS at FROM episodes GROUP BY user_id ORDER BY 1")
        appended, clusters, facts, turns = {}, 0, 0, 0
        for r in last:
            found = await sweep(settings, pool, at=r["at"], model=model, user_id=r["user_id"])
            appended.update(found.appended)
            clusters, facts, turns = clusters + found.asking, facts + found.facts_read, turns + found.turns_read
        await _wait_caught_up(reader, appended, worker, timeout)
        after = await pool.fetchrow(_REFLECTED)
    finally:
        await pool.close()
    made = {k: after[k] - before[k] for k in after.keys()}
    log.info("reflected on %d users: %d clusters asked, %d reflections kept", len(last), clusters, made["kept"])
    return {"users": len(last), "facts_read": facts, "turns_read": turns, "clusters": clusters,
            "reflections": made["kept"], "refused": made["refused"], "sources_facts": made["facts"],
            "sources_turns": made["turns"]}


# The reflections recorded so far and what they were drawn from, and those refused.
_REFLECTED = """
SELECT count(*) AS kept, coalesce(sum(cardinality(derived_from)), 0) AS facts,
       coalesce(sum(cardinality(derived_from_turns)), 0) AS turns,
       (SELECT count(*) FROM fact_refusals WHERE category = 'reflection') AS refused
FROM memory_facts WHERE category = 'reflection'
"""


async def _rests_on(settings: Settings, dsn: str) -> dict:
    """The turns (dia_ids) each fact and reflection rests on: those it was read from, a
    reflection's turns and its source facts' turns."""
    from memstream.projections.db import create_pool

    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        dia = {(r["user_id"], r["source_event_id"]): r["dia"] for r in await pool.fetch(
            "SELECT user_id, source_event_id, metadata->>'dia_id' AS dia FROM episodes")}
        facts = await pool.fetch("SELECT user_id, fact_id, source_event_id, observed_in, derived_from, "
                                 "derived_from_turns FROM memory_facts")
    finally:
        await pool.close()
    own = {f["fact_id"]: [f["source_event_id"], *f["observed_in"], *f["derived_from_turns"]] for f in facts}
    out = {}
    for f in facts:
        turns = own[f["fact_id"]] + [t for s in f["derived_from"] for t in own.get(s, [])]
        out[f["fact_id"]] = list(dict.fromkeys(d for t in turns if (d := dia.get((f["user_id"], t)))))
    return out


def _in_context(asked, rests_on: dict) -> list:
    """Each question's context: the returned episodes in rank order, then the turns the returned
    facts and reflections rest on."""
    results, _, _, facts = asked
    return [(category, evidence, list(dict.fromkeys([*ranked, *(d for f in returned for d in rests_on.get(f, []))])))
            for (category, evidence, ranked), returned in zip(results, facts)]


async def _wait_caught_up(reader, last: dict, worker, timeout: float) -> None:
    """Block until the episodes projection covers every user's last turn. Waits in bounded
    read-your-writes steps so a worker that died is reported at once, not after the timeout."""
    deadline = time.monotonic() + timeout
    for user_id, position in last.items():
        while True:
            if worker.proc.poll() is not None:
                raise RuntimeError(f"the worker exited with code {worker.proc.returncode}; see {worker.log_path}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{user_id} not projected within {timeout:.0f}s; see {worker.log_path}")
            if await reader.caught_up(position, timeout=min(CATCH_UP_POLL_S, remaining)):
                break


async def _ask(reader, samples: Sequence[Sample], tag: str, k: int, on_progress):
    """Ask every question one at a time (so latencies are not queueing behind each other): the
    results to score, latencies, degraded reads, and the facts each read returned."""
    results: list[tuple[object, list[str], list[str]]] = []
    facts: list[list] = []
    latencies: list[float] = []
    degraded = 0
    total = sum(len(sample.questions) for sample in samples)
    for sample in samples:
        user_id = user_id_for(tag, sample)
        for q in sample.questions:
            t = time.perf_counter()
            ctx = await reader.read(user_id, QA_CONVERSATION, q.question, k=k)
            latencies.append((time.perf_counter() - t) * 1000)
            on_progress(len(latencies), total)
            if ctx.degraded:
                degraded += 1
                log.warning("a read was degraded: %s", ctx.degraded)
            ranked = [e.metadata["dia_id"] for e in sorted(ctx.episodes, key=lambda e: e.rank)
                      if e.metadata and "dia_id" in e.metadata]
            log.debug("%s | %r evidence=%s got=%s", sample.sample_id, q.question, q.evidence, ranked)
            results.append((q.category, q.evidence, ranked))
            facts.append([f.fact_id for f in ctx.facts])
    return results, latencies, degraded, facts


async def _baselines(settings: Settings, dsn: str, samples: Sequence[Sample], tag: str, k: int) -> dict[str, list]:
    """Each plain retriever's ranked dia_ids for every question, on the episodes the store holds
    (their whole texts for BM25, their own and their passages' vectors for dense retrieval) and
    the read path's embedder for the questions."""
    from memstream.embedding import embedder_for
    from memstream.projections.db import create_pool

    embedder = embedder_for(settings, settings.read_embed_threads)  # the stored vectors' model
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        return await _plain(pool, embedder, samples, tag, k)
    finally:
        await pool.close()


async def _plain(pool, embedder, samples: Sequence[Sample], tag: str, k: int) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in METHODS[1:]}
    for sample in samples:
        user_id = user_id_for(tag, sample)
        rows = await pool.fetch(
            "SELECT metadata->>'dia_id' AS dia, user_message, assistant_message, embedding FROM episodes "
            "WHERE user_id = $1 ORDER BY occurred_at, episode_id", user_id)
        passages = await pool.fetch(
            "SELECT e.metadata->>'dia_id' AS dia, p.embedding FROM episode_passages p JOIN episodes e "
            "USING (user_id, episode_id) WHERE p.user_id = $1 ORDER BY e.occurred_at, p.passage", user_id)
        ids = [r["dia"] for r in rows]
        bm25 = BM25({r["dia"]: f"{r['user_message']}\n{r['assistant_message']}" for r in rows})
        own = _matrix([r["embedding"] for r in rows], embedder.dim)
        every_ids = ids + [r["dia"] for r in passages]
        every = np.vstack([own, _matrix([r["embedding"] for r in passages], embedder.dim)]) if passages else own
        questions = [q.question for q in sample.questions]
        vectors = embedder.embed(questions) if questions else []
        for q, vec in zip(sample.questions, vectors):
            ranked_bm25 = bm25.search(q.question, max(k, 100))
            ranked_dense = dense_search(ids, own, vec, max(k, 100))
            out["bm25"].append((q.category, q.evidence, ranked_bm25[:k]))
            out["dense"].append((q.category, q.evidence, ranked_dense[:k]))
            out["dense_passages"].append((q.category, q.evidence, dense_search(every_ids, every, vec, k)))
            out["rrf"].append((q.category, q.evidence, rrf([ranked_bm25, ranked_dense], k)))
    return out


def _matrix(vectors: list, dim: int) -> np.ndarray:
    if not vectors:
        return np.zeros((0, dim), dtype=np.float32)
    return np.vstack([np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else from_bytes(bytes(v)), dtype=np.float32)
                      for v in vectors])


def _latency(values_ms: list[float]) -> dict:
    if not values_ms:
        return {"read_ms_p50": None, "read_ms_p95": None}
    a = np.asarray(values_ms)
    return {"read_ms_p50": round(float(np.percentile(a, 50)), 2), "read_ms_p95": round(float(np.percentile(a, 95)), 2)}


def render(report: dict) -> str:
    """The side-by-side tables: overall, then per category or ability, every method in columns."""
    k, methods = report["k"], report["methods"]
    names = list(methods)
    head = f"{'':<28}" + "".join(f"{n:>20}" for n in names)
    lines = [f"{report['file']}: {report['samples']} samples, {report['questions']} questions "
             f"({report['overall']['questions']} with evidence), k={k}; {report['truncated_messages']} messages "
             f"truncated; Recall@{k} ceiling {report['recall_ceiling']:.3f}",
             f"Hit@{k} / Recall@{k} / MRR", head]

    def row(label: str, pick) -> str:
        cells = []
        for n in names:
            m = pick(methods[n])
            cells.append(f"{m['hit_at_k']:.3f}/{m['recall_at_k']:.3f}/{m['mrr']:.3f}" if m else "-")
        return f"{label:<28}" + "".join(f"{c:>20}" for c in cells)

    lines.append(row("overall", lambda m: m["overall"]))
    for cat in report["per_category"]:
        n = report["per_category"][cat]["questions"]
        lines.append(row(f"  {cat} (n={n})", lambda m, c=cat: m["per_category"].get(c)))
    lines.append(f"read p50 {report['read_ms_p50']} ms, p95 {report['read_ms_p95']} ms; "
                 f"ingest {report['ingest_seconds']} s; degraded reads {report['degraded_reads']}")
    if "sweep" in report:
        w = report["sweep"]
        lines.append(f"sweep of {w['users']} users as of their last turns: {w['facts_archived']} facts archived, "
                     f"{w['episodes_cooled']} episodes to the cold index (not said in {w['cold_after_days']:g} days; "
                     f"{w['episodes_hot_after']} hot, {w['episodes_cold_after']} cold after); reads after it p50 "
                     f"{w['swept_read_ms_p50']} ms, p95 {w['swept_read_ms_p95']} ms")
    if "reflect" in report:
        w, c = report["reflect"], report["context"]
        lines.append(f"reflection sweep of {w['users']} users as of their last turns: {w['facts_read']} facts and "
                     f"{w['turns_read']} turns read, {w['clusters']} clusters asked, {w['reflections']} reflections "
                     f"kept ({w['sources_facts']} source facts, {w['sources_turns']} source turns), {w['refused']} "
                     f"refused; reads after it p50 {w['reflected_read_ms_p50']} ms, p95 {w['reflected_read_ms_p95']} ms")
        lines.append("evidence anywhere in the read's context (its episodes, and the turns its facts and "
                     "reflections rest on), Hit / Recall:")
        for name in ("before", "after"):
            o = c[name]["overall"]
            lines.append(f"  {name} the reflection sweep: {o['hit_at_k']:.3f} / {o['recall_at_k']:.3f}")
    return "\n".join(lines)
