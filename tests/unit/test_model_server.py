"""The local model server's thread count: the CPUs it may use, not the host's."""
from __future__ import annotations

import os

import pytest

from memstream.stack.model_server import usable_cpus


@pytest.mark.parametrize("cpu_max, most", [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1),
                                            ("garbled\n", None)])
def test_the_server_uses_the_cpus_its_affinity_and_quota_allow(tmp_path, cpu_max, most):
    allowed = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text(cpu_max)
    assert usable_cpus(tmp_path / "cpu.max") == (allowed if most is None else min(allowed, most))
    assert usable_cpus(tmp_path / "absent") == allowed
