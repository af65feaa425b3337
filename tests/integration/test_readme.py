"""README's "Using it from a host" snippet, run as written: against the local stack's socket
(no DSN set) and against an explicit DSN."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import HOME, ROOT
from memstream.stack.worker_process import worker_env

pytestmark = pytest.mark.asyncio


def host_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Using it from a host"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize("with_dsn", [False, True], ids=["local-stack-socket", "explicit-dsn"])
async def test_the_readme_host_snippet_runs_as_written_and_reads_its_own_write(settings, dsn, workers, tmp_path,
                                                                                with_dsn):
    w = workers()
    await w.wait_assigned()
    env = worker_env(settings.model_copy(update={"home": HOME}))
    env.pop("MEMSTREAM_POSTGRES_DSN", None)
    if with_dsn:
        env["MEMSTREAM_POSTGRES_DSN"] = dsn
    (tmp_path / "host.py").write_text(host_snippet())
    done = subprocess.run([sys.executable, "host.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Lives in Lisbon" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("User: where do I live?")
