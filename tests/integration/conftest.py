"""Integration tier: real Kafka, Postgres+pgvector and Redis from the local stack.

The stack is started (or reused) once per session. Every test gets its own topics, consumer
group and Postgres schema, so tests cannot see each other's data."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
from pgvector.asyncpg import register_vector

from memstream.config import Settings
from memstream.projections.db import drop_schema
from memstream.stack.launcher import Stack
from memstream.stack.worker_process import worker_env
from memstream.streams.log.topics import drop_topics, ensure_topics
from tests import pooled_schemas

ROOT = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("MEMSTREAM_HOME", ROOT / ".memstream"))


@pytest.fixture(scope="session")
def stack() -> Stack:
    s = Stack(HOME)
    s.up()
    return s


@pytest.fixture(scope="session")
def dsn(stack: Stack) -> str:
    return stack.postgres.dsn


@pytest.fixture(scope="session")
def chat_model():
    """A real llama.cpp server (``xllamacpp``) with the 135M SmolLM2 from its pinned package, on the
    local stack's model port: its OpenAI-compatible base URL. Reused if one already answers."""
    from memstream.stack import model_server

    if model_server.answers(model_server.CHAT_PORT):
        if (found := model_server.serving(model_server.CHAT_PORT)) != "smollm2-135m":
            pytest.fail(f"port {model_server.CHAT_PORT} serves {found or 'something else'}, not smollm2-135m: "
                        "stop it (an eval's or make test-llm's model server) and run the tests again")
        yield f"http://127.0.0.1:{model_server.CHAT_PORT}/v1"
        return
    proc = model_server.start("smollm2-135m", HOME / "models", log_path=HOME / "model-server.log")
    try:
        yield f"http://127.0.0.1:{model_server.CHAT_PORT}/v1"
    finally:
        model_server.stop(proc)


@pytest.fixture(autouse=True)
def no_postgres_crash(request):
    """A backend that crashed during a test fails it with the server log's reason: otherwise the
    test sees only "the database system is in recovery mode" and times out retrying."""
    if "stack" not in request.fixturenames and "dsn" not in request.fixturenames:
        yield
        return
    postgres = request.getfixturevalue("stack").postgres
    mark = postgres.log_size()
    yield
    if crashes := postgres.crashes(since=mark):
        pytest.fail("Postgres crashed during this test: " + "; ".join(crashes), pytrace=False)


@pytest.fixture(scope="session")
def runs(stack: Stack):
    """Every test's settings: their topics are deleted at the end, at once (a broker loads every
    topic it holds at each start)."""
    made: list[Settings] = []
    yield made
    asyncio.run(drop_topics(*made))


@pytest.fixture
async def settings(stack: Stack, dsn: str, runs: list):
    tag = uuid.uuid4().hex[:10]
    s = Settings(
        home=HOME,
        events_topic=f"t{tag}.events",
        decisions_topic=f"t{tag}.decisions",
        dead_letter_topic=f"t{tag}.dead-letter",
        ingress_topic=f"t{tag}.ingress",
        group_id=f"g{tag}",
        postgres_schema=f"t_{tag}",
        keys_schema=f"k_{tag}",
        partitions=4,
    )
    runs.append(s)
    await ensure_topics(s)
    await pooled_schemas.fresh(dsn, s.postgres_schema)
    yield s
    await pooled_schemas.done(dsn, s.postgres_schema)
    await drop_schema(dsn, s.keys_schema)


@pytest.fixture
async def conn(dsn: str, settings: Settings):
    c = await asyncpg.connect(dsn, server_settings={"search_path": f"{settings.postgres_schema},public"})
    await register_vector(c)
    yield c
    await c.close()


class Worker:
    def __init__(self, settings: Settings, log_path: Path, group_id: str | None = None):
        env = worker_env(settings.model_copy(update={"home": HOME, "group_id": group_id or settings.group_id}))
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstream.cli", "worker"], env=env, cwd=ROOT,
            stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def assigned_by_role(self) -> dict[str, set[str]]:
        """The partitions of the latest assignment each role of this worker logged."""
        latest: dict[str, set[str]] = {}
        for line in self.log().splitlines():
            if "assigned partitions:" in line:
                head, parts = line.split("assigned partitions:")
                latest[head.split()[-1]] = {p for p in parts.split() if p != "(none)"}
        return latest

    def assigned(self) -> list[str]:
        return sorted({p for parts in self.assigned_by_role().values() for p in parts})

    async def wait_assigned(self, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            # Both roles: the projections role also reads the events topic (commands), so
            # "some role has events and decisions" could return before formation has joined.
            roles = self.assigned_by_role()
            if (any(".events/" in p for p in roles.get("formation", ()))
                    and any(".decisions/" in p for p in roles.get("projections", ()))):
                return self.assigned()
            await asyncio.sleep(0.05)  # a start is about 2.5 s: a coarser look adds to every test
        raise AssertionError(f"worker got no partitions within {timeout}s:\n{self.log()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def workers(settings: Settings, tmp_path: Path):
    started: list[Worker] = []

    def start(group_id: str | None = None, settings: Settings = settings) -> Worker:
        w = Worker(settings, tmp_path / f"worker{len(started)}.log", group_id)
        started.append(w)
        return w

    yield start
    for w in started:  # the test is over: nothing of a graceful stop is looked at (3.5 s each)
        w.kill()


@contextlib.asynccontextmanager
async def served(app):
    """``app`` served by uvicorn on a free loopback port for the block: yields its base URL."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def wait_until(predicate, timeout: float = 60, what: str = "condition", interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@pytest.fixture
def forbid_llm_and_embedder(monkeypatch):
    """Call this once the live pipeline is done: from then on any extractor, resolver,
    reflection model or embedder call in this process fails the test, and so does a sweep's plan
    (what reads the clock): replays must only apply recorded decisions."""
    from memstream.embedding import minilm
    from memstream.llm import offline, offline_reflection, offline_relations
    from memstream.streams.worker import reflecting, sweeping

    def arm() -> None:
        def forbidden(*a, **k):
            raise AssertionError("replay must not call an LLM client or the embedder")

        for cls, method in ((offline.OfflineExtractor, "extract"), (offline.StrictOfflineExtractor, "extract"),
                            (offline.OfflineResolver, "resolve"),
                            (offline_relations.OfflineRelationExtractor, "extract"), (minilm.MiniLMOnnx, "embed"),
                            (offline_reflection.OfflineReflector, "reflect"), (reflecting, "plan"),
                            (sweeping, "plan")):
            monkeypatch.setattr(cls, method, forbidden)

    return arm
