"""Commands that measure: benchmarks (``memstream bench``) and accuracy (``memstream eval``)."""
from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import click

from memstream.progress import progress
from memstream.read_settings import MAX_K
from memstream.cli.base import main, resolve_dsn, settings_of


@main.group()
def bench() -> None:
    """Benchmarks that print numbers."""


@bench.command("ingest")
@click.option("--turns", default=10_000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--rate", default=25.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="turns/s in the paced (latency) phase")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_ingest(ctx: click.Context, turns: int, users: int, rate: float, as_json: bool) -> None:
    """Append N turns for M users; report append and turn-to-episode latency and throughput.

    Self-contained: starts the local stack if needed, creates its own topics and schema
    (bench_<tag>), runs its own worker, and drops the schema at the end (topics are kept)."""
    from memstream.bench.ingest import run_ingest_bench

    with progress("append", unit="turns") as on_progress:
        report = asyncio.run(run_ingest_bench(settings_of(ctx), turns=turns, users=users, rate=rate,
                                              on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("rebuild")
@click.option("--episodes", default=100_000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--compare-replay", is_flag=True, help="also time the batch-by-batch replay of the same topic")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_rebuild(ctx: click.Context, episodes: int, users: int, compare_replay: bool, as_json: bool) -> None:
    """Rebuild N recorded episodes (vectors in the log) into a fresh schema; seconds per phase.

    Self-contained: its own topics and schemas (dropped at the end; topics are kept)."""
    from memstream.bench.rebuild import run_rebuild_bench

    with progress("rebuild") as on_progress:
        report = asyncio.run(run_rebuild_bench(settings_of(ctx), episodes=episodes, users=users,
                                               compare_replay=compare_replay, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("grow")
@click.option("--turns", default=100_000, show_default=True, type=click.IntRange(min=1),
              help="turns, and as many recorded episodes with vectors")
@click.option("--users", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_grow(ctx: click.Context, turns: int, users: int, as_json: bool) -> None:
    """Grow a log of N turns and N decisions to twice its partitions: copy rate, and how long
    appends wait at the fence. Self-contained, like `bench rebuild`."""
    from memstream.bench.grow import run_grow_bench

    with progress("copy") as on_progress:
        report = asyncio.run(run_grow_bench(settings_of(ctx), turns=turns, users=users, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("read")
@click.option("--rows", default=1_000_000, show_default=True, type=click.IntRange(min=1), help="corpus size across all users")
@click.option("--readers", default=32, show_default=True, type=click.IntRange(min=1), help="concurrent readers in the concurrency phase")
@click.option("--reads", default=300, show_default=True, type=click.IntRange(min=1), help="reads per single-reader phase")
@click.option("--keep", is_flag=True, help="keep the benchmark schema afterwards")
@click.option("--reuse", metavar="SCHEMA", help="measure a corpus kept by an earlier --keep run (same --rows)")
@click.option("--decay", is_flag=True, help="last, age the heavy user over three years, sweep, and read again "
                                            "(it archives facts of the corpus: not with --keep for later runs)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_read(ctx: click.Context, rows: int, readers: int, reads: int, keep: bool, reuse: str | None,
               decay: bool, as_json: bool) -> None:
    """Read latency (one and many readers, gated path, growth per user) and filtered-ANN full-k;
    with --decay, the heavy user's before and after a decay sweep."""
    from memstream.bench.read import run_read_bench

    with progress("load the corpus", unit="users") as on_progress:
        report = asyncio.run(run_read_bench(settings_of(ctx), rows=rows, readers=readers, reads=reads, keep=keep,
                                              reuse=reuse, on_progress=on_progress, decay=decay))
    click.echo(json.dumps(report, indent=2, default=str) if as_json else _render_report(report))


@bench.command("reform")
@click.option("--turns", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=2000, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_reform(ctx: click.Context, turns: int, users: int, as_json: bool) -> None:
    """Form a log of N turns of M users again (`memstream reform`, offline extractor): events/s,
    overall and over its first and last tenth. Self-contained, like `bench rebuild`."""
    from memstream.bench.reform import run_reform_bench

    with progress("reform", unit="events") as on_progress:
        report = asyncio.run(run_reform_bench(settings_of(ctx), turns=turns, users=users, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("keys")
@click.option("--users", default=100_000, show_default=True, type=click.IntRange(min=10))
@click.option("--forgets", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_keys(ctx: click.Context, users: int, forgets: int, as_json: bool) -> None:
    """What erasure costs the key store: a forget's destroy (update and vacuum) among N users'
    keys, p50/p95, and a KEK rotation of all of them. Self-contained (its own schema and KEK)."""
    from memstream.bench.keys import run_keys_bench

    s = settings_of(ctx)
    report = asyncio.run(run_keys_bench(s, resolve_dsn(s), users=users, forgets=min(forgets, users)))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("formation")
@click.option("--turns", default=3000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--llm-latency", type=click.FloatRange(min=0), metavar="SECONDS",
              help="the offline rules answer as a hosted model would: SECONDS per call (p50)")
@click.option("--llm-latency-p95", type=click.FloatRange(min=0), metavar="SECONDS",
              help="with --llm-latency: log-normal latencies with this p95 (default: every call p50)")
@click.option("--concurrency", type=click.IntRange(min=1), help="LLM calls in flight (formation_concurrency)")
@click.option("--no-paced", is_flag=True, help="skip the turn -> facts visible phase")
@click.option("--local-model", type=click.Choice(["smollm2-135m", "qwen2.5-1.5b"]),
              help="form with this pinned local model (llama.cpp, OpenAI-compatible) instead of the configured extractor")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_formation(ctx: click.Context, turns: int, users: int, llm_latency: float | None,
                    llm_latency_p95: float | None, concurrency: int | None, no_paced: bool, local_model: str | None,
                    as_json: bool) -> None:
    """Turns/s through formation (extract, resolve, gate, merge) for one worker, LLM calls and
    tokens per turn; with --llm-latency, also turn -> facts visible while turns arrive paced
    (half the measured rate, plus one very active user).

    Self-contained like ``bench ingest``: its own topics, schema and worker; the schema is
    dropped at the end."""
    from memstream.bench.formation import run_formation_bench

    if llm_latency_p95 is not None and (llm_latency is None or llm_latency_p95 < llm_latency):
        raise click.UsageError("--llm-latency-p95 needs --llm-latency, and is at least it")
    if local_model is not None and llm_latency is not None:
        raise click.UsageError("--local-model is a real model: it takes no --llm-latency")
    with _served(settings_of(ctx), local_model) as s, progress("formation", unit="turns") as on_progress:
        if local_model is not None:
            s = s.model_copy(update={"extractor": "openai"})
        report = asyncio.run(run_formation_bench(
            s, turns=turns, users=users, llm_latency=llm_latency, llm_latency_p95=llm_latency_p95,
            concurrency=concurrency, paced=not no_paced, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@contextlib.contextmanager
def _served(s, local_model: str | None):
    """``s`` pointed at ``local_model`` served by llama.cpp for the block (``s`` itself when None)."""
    if local_model is None:
        yield s
        return
    from memstream.stack import model_server

    with _model_served(s, local_model, model_server.CHAT_PORT, parallel=min(4, s.formation_concurrency)):
        # A model on two cores answers a call in seconds to minutes: wait for it.
        yield s.model_copy(update={"openai_base_url": f"http://127.0.0.1:{model_server.CHAT_PORT}/v1",
                                   "openai_model": local_model, "openai_timeout_s": max(s.openai_timeout_s, 600.0)})


@contextlib.contextmanager
def _embedded_by(s, local_embedder: str | None):
    """``s`` embedding through ``/v1/embeddings`` of ``local_embedder`` served by llama.cpp for
    the block (``s`` itself when None). Every process of the run (its worker too) is given it."""
    if local_embedder is None:
        yield s
        return
    from memstream.stack import model_server

    with _model_served(s, local_embedder, model_server.EMBED_PORT, parallel=2, embedding=True):
        yield s.model_copy(update={"embedder": "openai", "embedding_model": local_embedder,
                                   "embedding_window_chars": model_server.MODELS[local_embedder].window_chars,
                                   "embedding_base_url": f"http://127.0.0.1:{model_server.EMBED_PORT}/v1"})


@contextlib.contextmanager
def _model_served(s, model: str, port: int, **start):
    """``model`` served by llama.cpp on ``port`` for the block, its files under ``s.home``."""
    from memstream.stack import model_server

    served = model_server.start(model, Path(s.home) / "models", port, log_path=Path(s.home) / "model-server.log",
                                **start)
    try:
        yield
    finally:
        model_server.stop(served)


def _render_report(report: dict) -> str:
    return "\n".join(f"{k:<34} {v}" for k, v in report.items())


@main.group("eval")
def eval_group() -> None:
    """Accuracy harnesses."""


def _eval_options(f):
    f = click.option("--json", "as_json", is_flag=True)(f)
    f = click.option("--sweep", is_flag=True,
                     help="then sweep each user as of their last turn (decay: facts archived, old episodes to the "
                          "cold index) and ask again")(f)
    f = click.option("--reflect", is_flag=True,
                     help="then (after --sweep) a reflection sweep of each user as of their last turn, and ask "
                          "again; also scores the evidence anywhere in what a read returned, before and after")(f)
    f = click.option("--reuse", metavar="TAG",
                     help="ask again on a kept run's data, without ingesting (same PATH, --conv and --limit); it stays kept")(f)
    f = click.option("--keep", is_flag=True, help="keep the run's schema and topics (its tag is printed)")(f)
    f = click.option("--limit", type=click.IntRange(min=1), help="only the first N samples")(f)
    f = click.option("--k", default=5, show_default=True, type=click.IntRange(min=1, max=MAX_K),
                     help="how many episodes read returns (Hit@k, Recall@k)")(f)
    f = click.option("--local-embedder", type=click.Choice(["minilm"]),
                     help="embed through /v1/embeddings of this pinned model served by llama.cpp (a fresh run's "
                          "embedder: the vectors stored and the questions' alike)")(f)
    return click.option("--conv", help="only this sample_id")(f)


def _run_eval(ctx: click.Context, path: Path, fmt: str, as_json: bool, **kwargs) -> None:
    from memstream.bench.evaluation import render, run_eval

    local_embedder = kwargs.pop("local_embedder")
    if local_embedder is not None and kwargs.get("reuse") is not None:
        raise click.UsageError("--local-embedder embeds a fresh run: a kept run's vectors are another model's")
    try:
        with _embedded_by(settings_of(ctx), local_embedder) as s, \
                progress("eval questions", unit="questions") as on_progress:
            report = asyncio.run(run_eval(s, path, fmt=fmt, on_progress=on_progress, **kwargs))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
    if "tag" in report and not as_json:
        click.echo(f"kept as {report['tag']}: --reuse {report['tag']} asks again")


@eval_group.command("run")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["auto", "locomo", "beam", "longmemeval"]), default="auto",
              show_default=True, help="auto: a directory is BEAM, a JSON file LoCoMo or LongMemEval")
@_eval_options
@click.pass_context
def eval_run(ctx: click.Context, path: Path, fmt: str, as_json: bool, **kwargs) -> None:
    """Ingest a benchmark (LoCoMo file, BEAM chat directory, LongMemEval file) through the
    pipeline, ask every question through read and of plain retrievers (BM25, dense, RRF) on the
    same episodes, and print Hit@k, Recall@k and MRR side by side, per category and overall."""
    _run_eval(ctx, path, fmt, as_json, **kwargs)


@eval_group.command("locomo")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_eval_options
@click.pass_context
def eval_locomo(ctx: click.Context, path: Path, as_json: bool, **kwargs) -> None:
    """``eval run --format locomo``."""
    _run_eval(ctx, path, "locomo", as_json, **kwargs)


@eval_group.command("fetch")
@click.argument("dataset", type=click.Choice(["beam", "locomo"]))
@click.option("--from", "source", help="a git URL or local repository to clone instead of the public one")
@click.pass_context
def eval_fetch(ctx: click.Context, dataset: str, source: str | None) -> None:
    """Fetch a public benchmark into MEMSTREAM_HOME/datasets (git), for ``eval run``. Neither is
    shipped: BEAM has no licence file, LoCoMo is CC BY-NC."""
    from memstream.bench.datasets import fetch

    try:
        path = fetch(dataset, Path(settings_of(ctx).home) / "datasets", source)
    except (OSError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{dataset}: {path}")


@eval_group.command("formation")
@click.option("--extractor", "extractors", multiple=True,
              help="offline | offline-strict | openai | bedrock (repeat to compare; default: the configured one)")
@click.option("--dataset", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="labelled conversations (default: the set shipped with memstream)")
@click.option("--limit", type=click.IntRange(min=1), help="only the first N conversations")
@click.option("--local-model", type=click.Choice(["smollm2-135m", "qwen2.5-1.5b"]),
              help="serve this pinned local model (llama.cpp) for the run; extractor 'openai' then asks it")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def eval_formation(ctx: click.Context, extractors: tuple[str, ...], dataset: Path | None, limit: int | None,
                   local_model: str | None, as_json: bool) -> None:
    """What formation stores, against labelled conversations: precision, recall, junk rate,
    wrong-subject rate and decision accuracy of facts and edges, and LLM calls per turn."""
    from memstream.bench.formation_eval import DATASET, render, run

    with _served(settings_of(ctx), local_model) as s, progress("eval formation", unit="turns") as on_progress:
        reports = run(s, list(extractors) or [s.extractor], dataset or DATASET, limit, on_progress,
                      parallel=4 if local_model else 1)
    click.echo(json.dumps(reports, indent=2) if as_json else render(reports))
