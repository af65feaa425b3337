"""``run_reform_bench`` end to end on a short log: every figure ``memstream bench reform`` reports
is there, and what it made (schema, topics) is gone afterwards."""
from __future__ import annotations

import pytest

from memstream.bench.reform import run_reform_bench
from memstream.config import Settings

from .conftest import HOME
from .helpers import schemas_named

pytestmark = pytest.mark.asyncio


@pytest.mark.slow  # a benchmark's own run: `make test-slow` (or `memstream bench reform`)
async def test_bench_reform_reports_its_rates_on_a_short_log(stack, dsn):
    before = await schemas_named(dsn, "benchrf_")
    report = await run_reform_bench(Settings(home=HOME), turns=600, users=30)
    assert report["turns"] == 600 and report["new_decisions"] > 600  # an episode and facts per turn
    assert report["events_per_s"] > 0
    # A tenth of so short a log is inside one batch: no rate of its own.
    assert report["first_tenth_events_per_s"] is None and report["last_tenth_events_per_s"] is None
    assert await schemas_named(dsn, "benchrf_") == before
