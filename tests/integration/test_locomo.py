"""``memstream eval`` end to end: a set goes through TurnLog, a real worker subprocess and the
projections, every question through ``MemoryReader.read`` and the plain retrievers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memstream.bench.evaluation import render, run_eval
from memstream.config import Settings

from .conftest import HOME
from .helpers import schemas_named

pytestmark = pytest.mark.asyncio

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "locomo" / "small.json"
# Measured 0.889 Hit@5 (16/18) with the offline pipeline; the floor leaves room for tie-breaks.
HIT_AT_5_FLOOR = 0.7


async def test_locomo_fixture_is_ingested_asked_and_scored_and_a_kept_run_asked_again_after_a_sweep(stack, dsn):
    from memstream.bench import discarded, isolated

    before = await schemas_named(dsn, "locomo_")
    # The cold index on, at a day before each user's last turn: most turns go cold in the sweep.
    # The fixture's speakers state two facts: clusters looser than the default's, to reflect on them.
    settings = Settings(home=HOME, episode_cold_after_days=1, reflect_similarity=0.3, reflect_min_observations=2)
    report = await run_eval(settings, FIXTURE, fmt="locomo", conv=None, k=5, keep=True)
    try:
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

        again = await run_eval(settings, FIXTURE, fmt="locomo", reuse=report["tag"], sweep=True, reflect=True)
        assert again["tag"] == report["tag"] and await schemas_named(dsn, "locomo_") != before  # still kept
        swept = again["sweep"]
        assert swept["users"] == 2 and swept["episodes_cooled"] == swept["episodes_cold_after"] > 0
        assert again["methods"]["memstream"]["overall"] == report["overall"]  # asked again, the same answers
        assert 0 < again["methods"]["memstream_swept"]["overall"]["hit_at_k"] <= 1
        assert "episodes to the cold index" in render(again)
        # Reflected on as of each user's last turn: what was kept, and the evidence in the whole
        # context (episodes, and what the returned facts and reflections rest on) before and after.
        reflected = again["reflect"]
        assert reflected["users"] == 2 and reflected["clusters"] == reflected["reflections"] + reflected["refused"]
        assert reflected["turns_read"] > 0 and reflected["reflections"] > 0, reflected
        context = again["context"]
        assert context["before"]["overall"]["hit_at_k"] >= again["methods"]["memstream_swept"]["overall"]["hit_at_k"]
        assert 0 < again["methods"]["memstream_reflected"]["overall"]["hit_at_k"] <= 1
        assert "reflections kept" in render(again) and "evidence anywhere" in render(again)
    finally:
        await discarded(isolated(settings, "locomo", report["tag"])[0], dsn)
    assert await schemas_named(dsn, "locomo_") == before


def _beam_chat(root: Path) -> Path:
    """A BEAM-layout chat of our own, one message of which is a 400,000-character paste."""
    chat = root / "500K" / "1"
    (chat / "probing_questions").mkdir(parents=True)
    paste = "log line: worker started and listening on port 8080\n" * 8_000  # 416,000 characters
    turns = [[{"role": "user", "id": 0, "time_anchor": "March-02-2024", "content": "I run Redis 7 on a small VM."},
              {"role": "assistant", "id": 1, "content": "Good choice for caching."}],
             [{"role": "user", "id": 2, "content": f"Here is my whole log:\n{paste}"},
              {"role": "assistant", "id": 3, "content": "The worker listens on port 8080."}],
             [{"role": "user", "id": 4, "content": "My deadline for the launch is April 3."},
              {"role": "assistant", "id": 5, "content": "Noted, April 3."}]]
    (chat / "chat.json").write_text(json.dumps([{"batch_number": 1, "time_anchor": None, "turns": turns}]))
    questions = {"information_extraction": [{"question": "Which Redis version do I run?", "source_chat_ids": [0]}],
                 "temporal_reasoning": [{"question": "When is my launch deadline?",
                                         "source_chat_ids": {"first_event": [4], "second_event": [5]}}],
                 "abstention": [{"question": "What is my cat called?"}]}
    (chat / "probing_questions" / "probing_questions.json").write_text(json.dumps(questions))
    return root / "500K"


async def test_a_beam_chat_with_a_400k_character_message_is_scored_beside_the_baselines(stack, dsn, tmp_path):
    before = await schemas_named(dsn, "locomo_")
    report = await run_eval(Settings(home=HOME), _beam_chat(tmp_path), k=5)
    assert await schemas_named(dsn, "locomo_") == before  # not kept: its schema is dropped afterwards

    assert report["truncated_messages"] == 1 and report["samples"] == 1
    assert report["questions"] == 3 and report["skipped_no_evidence"] == 1
    assert set(report["methods"]) == {"memstream", "bm25", "dense", "dense_passages", "rrf"}
    for method in report["methods"].values():
        assert set(method["per_category"]) == {"information_extraction", "temporal_reasoning"}
    assert report["methods"]["memstream"]["overall"]["hit_at_k"] == 1.0  # six messages, k=5
    assert report["recall_ceiling"] == 1.0 and report["degraded_reads"] == 0
    assert "memstream" in render(report) and "temporal_reasoning" in render(report)
