"""``memstream worker`` with no role: run every role as a child process and keep them together.

Signals are forwarded; if one child exits, the other is stopped and the supervisor exits with
the child's code, so whatever runs the worker (systemd, Kubernetes) restarts the pair."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

log = logging.getLogger("memstream.worker")


def supervise(roles: tuple[str, ...], extra_args: list[str]) -> int:
    children = {
        role: subprocess.Popen([sys.executable, "-m", "memstream.cli", *extra_args, "worker", "--role", role,
                                "--no-prepare"])
        for role in roles
    }
    stopping = False

    def forward(signum, _frame):
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    while children:
        for role, child in list(children.items()):
            rc = child.poll()
            if rc is None:
                continue
            del children[role]
            if not stopping:
                log.error("worker role %s exited with %s; stopping the others", role, rc)
                code = rc or 1
                forward(signal.SIGTERM, None)
        time.sleep(0.2)
    return code
