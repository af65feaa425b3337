"""``run_locomo_eval`` end to end: the fixture goes through TurnLog, a real worker subprocess and
the projections, and every question through ``MemoryReader.read``."""
from __future__ import annotations

from pathlib import Path

import pytest

from memstream.bench.locomo import run_locomo_eval
from memstream.config import Settings

from .conftest import HOME
from .helpers import schemas_named

pytestmark = pytest.mark.asyncio

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "locomo" / "small.json"
# Measured 0.889 Hit@5 (16/18) with the offline pipeline; the floor leaves room for tie-breaks.
HIT_AT_5_FLOOR = 0.7


async def test_locomo_fixture_is_ingested_asked_and_scored(stack, dsn):
    before = await schemas_named(dsn, "locomo_")
    report = await run_locomo_eval(Settings(home=HOME), FIXTURE, conv=None, k=5)

    assert set(report) >= {"file", "samples", "questions", "k", "overall", "per_category", "skipped_no_evidence",
                           "ingest_seconds", "read_ms_p50", "read_ms_p95"}
    assert (report["samples"], report["questions"], report["k"]) == (2, 20, 5)
    assert report["skipped_no_evidence"] == 2  # the two adversarial items
    assert report["overall"]["questions"] == 18
    assert {c: v["questions"] for c, v in report["per_category"].items()} == {"1": 4, "2": 4, "3": 2, "4": 8}
    for metrics in [report["overall"], *report["per_category"].values()]:
        assert 0.0 <= metrics["mrr"] <= metrics["hit_at_k"] <= 1.0
        assert 0.0 <= metrics["recall_at_k"] <= metrics["hit_at_k"]
    assert report["overall"]["hit_at_k"] >= HIT_AT_5_FLOOR, report
    assert report["degraded_reads"] == 0
    assert report["ingest_seconds"] > 0 and 0 < report["read_ms_p50"] <= report["read_ms_p95"]
    assert await schemas_named(dsn, "locomo_") == before  # its schema is dropped afterwards

