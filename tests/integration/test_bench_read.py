"""``run_read_bench`` end to end on a small corpus: every figure ``memstream bench read`` reports
is there, filtered ANN returns the full k, and the corpus's schema is dropped afterwards."""
from __future__ import annotations

import pytest

from memstream.bench.read import run_read_bench
from memstream.config import Settings

from .conftest import HOME
from .helpers import schemas_named

pytestmark = pytest.mark.asyncio


@pytest.mark.slow  # a benchmark's own run: `make test-slow` (or `memstream bench read`)
async def test_bench_read_reports_every_figure_on_a_small_corpus(stack, dsn):
    before = await schemas_named(dsn, "benchr_")
    report = await run_read_bench(Settings(home=HOME), rows=30_000, readers=2, reads=12, decay=True)

    timed = ["heavy_user_one_reader_ms", "heavy_user_new_conversation_ms", "heavy_user_one_reader_names_keyword_mode_ms",
             "heavy_user_gated_ms", "concurrent_2_readers_ms", *(f"growth_one_user/{g}" for g in report["growth_one_user"])]
    assert report["growth_one_user"], "30k rows leave room for the 1k-row growth user"
    for key in timed:
        section, _, sub = key.partition("/")
        p = report[section][sub] if sub else report[section]
        assert 0 < p["p50"] <= p["p95"] <= p["p99"] and p["n"] > 0, (key, p)
    assert report["heavy_user_gated_ms"]["p50"] < report["heavy_user_one_reader_ms"]["p50"]
    assert {"embed", "edges", "facts_vector", "episodes_keyword", "episode_neighbours", "recent_turns"} <= set(
        report["heavy_user_channels_p50_ms"])
    assert report["concurrent_2_readers_reads_per_s"] > 0
    assert report["rows"] >= 30_000 and report["tables"]["memory_edges"] > 0
    for user, ann in report["filtered_ann_full_k"].items():
        assert ann["returned_min"] == ann["asked"], (user, ann)  # the full k whenever the user has k rows
    decayed = report["decay"]  # the heavy user aged three years and swept
    assert decayed["archived"] > 0 and decayed["episodes_cooled"] > 0 and decayed["cold_after_days"] == 365  # the bench's, the index being off by default
    for p in [decayed["before_ms"], decayed["after_ms"], *decayed["episode_search_ms"].values()]:
        assert 0 < p["p50"] <= p["p95"], decayed
    assert await schemas_named(dsn, "benchr_") == before  # dropped afterwards
