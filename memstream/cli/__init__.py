"""The ``memstream`` command, one module per audience: ``data`` (a person's memory), ``operate``
(operators), ``consolidate`` (their sweeps), ``develop`` (local development) and ``measure``
(benchmarks and evaluations).
Settings come from ``MEMSTREAM_*`` variables and options."""
from __future__ import annotations

from memstream.cli import consolidate, data, develop, measure, operate  # noqa: F401 (each registers its commands)
from memstream.cli.base import main

__all__ = ["main"]
