"""Run ``memstream worker`` as a child process (demo and benchmarks)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from memstream.config import Settings

def worker_env(settings: Settings) -> dict[str, str]:
    """This process's environment with every setting of ``settings`` (``Settings.to_env``), and
    none of the ``MEMSTREAM_*`` settings it inherited: a child worker runs exactly ``settings``."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("MEMSTREAM_") and k.removeprefix("MEMSTREAM_").lower() in Settings.model_fields)}
    return {**env, **settings.to_env()}


class WorkerProcess:
    def __init__(self, settings: Settings, log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstream.cli", "worker"], env=worker_env(settings),
            stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
