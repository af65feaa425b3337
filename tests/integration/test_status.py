"""``memstream status`` on the real stack: real positions and lags (records and seconds) that grow
while the worker is stopped and return to zero when it resumes, the dead letters with the last
one's reason, the worker groups' members and assignments, and a health check's exit code."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from aiokafka import AIOKafkaProducer

from memstream.stack.worker_process import worker_env
from memstream.streams.log.producer import TurnLog

from .conftest import HOME, ROOT, wait_until
from .helpers import turns

pytestmark = pytest.mark.asyncio


def status(settings, *args: str) -> subprocess.CompletedProcess:
    env = worker_env(settings.model_copy(update={"home": HOME}))
    return subprocess.run([sys.executable, "-m", "memstream.cli", "status", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


async def turns_and_a_bad_record(settings, sent, topic: str) -> None:
    """``sent`` through ``TurnLog``, then a record that is not JSON on ``topic`` (a dead letter)."""
    async with TurnLog(settings) as log:
        await log.append_many(sent)
    bad = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await bad.start()
    try:
        await bad.send_and_wait(topic, b"not json", key=sent[0].user_id.encode())
    finally:
        await bad.stop()


def lags(report: dict) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for p in report["positions"]:
        out[(p["projection"], p["topic"])] = out.get((p["projection"], p["topic"]), 0) + p["lag"]
    return out


async def test_status_shows_a_lag_that_grows_while_the_worker_is_stopped_and_clears_when_it_resumes(
        settings, conn, workers):
    w = workers()
    await w.wait_assigned()
    await turns_and_a_bad_record(settings, turns(8, users=2, prefix="st"), settings.ingress_topic)

    every_step = {"formation", "episodes", "facts", "graph", "commands", "sealing"}

    def settled():
        done = status(settings, "--json", "--max-lag", "0")
        report = json.loads(done.stdout)
        steps = {p["projection"] for p in report["positions"]}
        return done.returncode == 0 and report["dead_letters"] == 1 and every_step <= steps and report

    report = await wait_until(lambda: _async(settled), timeout=60, what="every step at lag 0")
    assert report["last_dead_letter"]["stage"] == "sealing" and "undecodable" in report["last_dead_letter"]["reason"]
    groups = report["groups"]
    assert set(groups) == {settings.group_id, f"{settings.group_id}-projections"}
    formation_parts = {a for m in groups[settings.group_id] for a in m["assigned"]}
    assert formation_parts >= {f"{settings.events_topic}/{p}" for p in range(settings.partitions)}

    w.stop()
    async with TurnLog(settings) as log:
        await log.append_many(turns(5, users=1, prefix="st2"))
    behind = status(settings, "--json", "--max-lag", "0")
    assert behind.returncode == 2  # the health check fails while the worker is away
    report = json.loads(behind.stdout)
    assert lags(report)[("formation", settings.events_topic)] == 5 and report["max_lag"] >= 5
    oldest = max(p["lag_s"] or 0 for p in report["positions"] if p["projection"] == "formation")
    assert 0 < oldest < 60
    assert "lag" in status(settings).stdout.splitlines()[0]  # the table for people

    workers()
    await wait_until(lambda: _async(lambda: status(settings, "--max-lag", "0").returncode == 0), timeout=90,
                     what="the lag to clear once a worker is back")


async def _async(fn):
    import asyncio

    return await asyncio.to_thread(fn)


def _free_port_pair() -> int:
    import socket

    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two free neighbouring ports")


def _scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of a Prometheus text exposition."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"] = s.value
    return out


async def test_the_workers_serve_metrics_of_what_they_applied_decided_embedded_and_dead_lettered(
        settings, conn, tmp_path):
    from .conftest import Worker

    port = _free_port_pair()
    w = Worker(settings.model_copy(update={"metrics_port": port}), tmp_path / "worker.log")
    try:
        await w.wait_assigned()
        await turns_and_a_bad_record(settings, turns(6, users=2, prefix="mx"), settings.events_topic)

        def ready():
            formation, projections = _scrape(port), _scrape(port + 1)
            done = (formation.get("memstream_decisions_total{kind=EpisodeRecorded}", 0) >= 6
                    and projections.get("memstream_records_total{step=episodes}", 0) >= 6
                    # a batch's steps run one after another: episodes counted does not mean facts timed
                    and projections.get("memstream_batch_seconds_count{step=facts}", 0) >= 1
                    and formation.get("memstream_dead_letters_total{stage=formation}", 0) == 1)
            return done and (formation, projections)

        formation, projections = await wait_until(lambda: _async(ready), timeout=120, what="the metrics to count it all")
        assert formation["memstream_embedding_seconds_count{}"] >= 1
        extraction = [v for k, v in formation.items() if k.startswith("memstream_llm_calls_total{") and "stage=extraction" in k]
        assert sum(extraction) >= 6  # one extraction call per turn (the offline client: no tokens, no cost)
        assert projections["memstream_batch_seconds_count{step=facts}"] >= 1

        def lag_gauged():
            lags = {k: v for k, v in _scrape(port + 1).items() if k.startswith("memstream_lag_records{")}
            return lags and all(v == 0 for v in lags.values()) and lags

        lags = await wait_until(lambda: _async(lag_gauged), timeout=60, what="a zero lag in the gauge")
        assert any("step=episodes" in k for k in lags)
    finally:
        w.stop()


async def test_a_read_records_its_parts_into_the_hosts_registry_and_traces_a_span_per_channel(settings, conn, dsn,
                                                                                          workers):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    from memstream.embedding import default_embedder
    from memstream.read_client import MemoryReader, ReadMetrics

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)  # the host's SDK; memstream only uses the API
    w = workers()
    await w.wait_assigned()
    async with TurnLog(settings) as log:
        pos = await log.append(turns(1, users=1, prefix="otel")[0])
    registry = CollectorRegistry()
    reader = await MemoryReader.connect(settings, dsn, embedder=default_embedder(), metrics=ReadMetrics(registry))
    try:
        ctx = await reader.read("otel-user-0", "c", "what about my cat Miso?", after=pos, wait_timeout=30)
    finally:
        await reader.close()
    assert ctx.caught_up
    assert registry.get_sample_value("memstream_read_seconds_count", {"part": "total"}) == 1
    assert registry.get_sample_value("memstream_read_seconds_count", {"part": "embed"}) == 1
    finished = {s.name: s for s in spans.get_finished_spans()}
    read = finished["memstream.read"]
    channels = [s for s in finished.values() if s.name.startswith("memstream.read.")]
    assert channels and all(s.parent is not None and s.parent.span_id == read.context.span_id for s in channels)
    assert read.attributes["memstream.caught_up"] is True and "otel" not in str(dict(read.attributes))  # no ids, no words


async def test_a_part_of_the_status_that_fails_is_reported_unavailable_and_the_lag_still_is(settings, dsn, monkeypatch):
    from memstream.streams.ops import status as status_mod

    async def refused(_settings):
        raise PermissionError("group describe not authorised")  # e.g. an ACL the monitor's principal lacks

    monkeypatch.setattr(status_mod, "worker_groups", refused)
    report = await status_mod.pipeline_status(settings, dsn)
    assert report.positions and report.groups == {}
    assert report.unavailable == {"groups": "PermissionError: group describe not authorised"}
    assert "groups: unavailable (PermissionError: group describe not authorised)" in report.lines()
    assert report.as_dict()["unavailable"] == report.unavailable
