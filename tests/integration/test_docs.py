"""Every Python block of README.md and docs/*.md runs as written, in a subprocess, against the local
stack with a worker running; the read-only commands of their shell blocks (`memstream status`,
`memstream dead-letters list`, ...) run for real. The pure checks (extraction, commands parsed
with the CLI, make targets, JSON, links, README's length) are tests/unit/test_docs_pages.py.

README's host snippet runs twice: against the local stack's socket (no DSN set), as every block
does, and against an explicit DSN, since both are what its text promises."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HOME, ROOT
from memstream.stack.worker_process import worker_env
from tests.unit.test_docs_pages import Block, all_commands, python_blocks, runs_on_stack

pytestmark = pytest.mark.asyncio

MEMSTREAM = Path(sys.executable).with_name("memstream")  # the installed entry point, memstream.cli:main


def host_snippet() -> Block:
    """README's quick start: the first Python block under "### Using it from a host"."""
    readme = (ROOT / "README.md").read_text()
    heading = readme[:readme.index("### Using it from a host")].count("\n") + 1
    return next(b for b in python_blocks() if b.page.name == "README.md" and b.line > heading)


def environment(settings, dsn: str | None) -> dict[str, str]:
    """The test's settings as MEMSTREAM_* variables; no DSN means the local stack's socket."""
    env = worker_env(settings.model_copy(update={"home": HOME}))
    env.pop("MEMSTREAM_POSTGRES_DSN", None)
    if dsn is not None:
        env["MEMSTREAM_POSTGRES_DSN"] = dsn
    return env


def run_block(block: Block, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    script = cwd / "block.py"
    script.write_text(block.text)
    return subprocess.run([sys.executable, script.name], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


async def test_the_readme_host_snippet_reads_its_own_write_against_an_explicit_dsn(settings, dsn, workers, tmp_path):
    w = workers()
    await w.wait_assigned()
    done = run_block(host_snippet(), environment(settings, dsn), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Lives in Lisbon" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("User: where do I live?")


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.id)
async def test_every_python_block_runs_as_written_against_the_local_stacks_socket(settings, workers, tmp_path, block):
    w = workers()
    await w.wait_assigned()
    done = run_block(block, environment(settings, None), tmp_path)
    assert done.returncode == 0, f"{block.id}:\n{done.stderr[-3000:]}"
    if block == host_snippet():
        assert "Lives in Lisbon" in done.stdout, done.stdout
        assert done.stdout.rstrip().endswith("User: where do I live?")


@pytest.mark.parametrize("command", [c for c in all_commands() if runs_on_stack(c)], ids=lambda c: c.id)
async def test_read_only_commands_run_for_real(settings, command):
    done = subprocess.run([str(MEMSTREAM), *command.argv[1:]], cwd=ROOT, env=environment(settings, None),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command.id}: `{shlex.join(command.argv)}` exited {done.returncode}:\n" \
                                 f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
