"""Formation with a real model: the pinned Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) on llama.cpp's
server, asked through the OpenAI-compatible adapters — end to end through a worker on the real
stack, and ``eval formation`` on part of the labelled set (at most 1.2 LLM calls a turn, the
goal; junk at the level measured, far from the goal of 5%, with recall beside it). ``make test-llm`` (not in ``make test``:
about 2-3 s a turn on two cores)."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from memstream.bench.formation_eval import evaluate
from memstream.schemas import TurnRecorded
from memstream.stack import model_server
from tests.integration.conftest import HOME, wait_until
from tests.integration.helpers import BASE
from tests.integration.test_formation import append_and_wait

pytestmark = [pytest.mark.llm, pytest.mark.asyncio]

MODEL = "qwen2.5-1.5b"


@pytest.fixture(scope="module")
def local_model():
    if model_server.answers(model_server.CHAT_PORT):
        pytest.fail(f"port {model_server.CHAT_PORT} already serves a model: stop it so this test serves {MODEL}")
    proc = model_server.start(MODEL, HOME / "models", log_path=HOME / "model-server.log", wait_s=300)
    try:
        yield f"http://127.0.0.1:{model_server.CHAT_PORT}/v1"
    finally:
        model_server.stop(proc)


@pytest.fixture
def on_model(settings, local_model):
    return settings.model_copy(update={"extractor": "openai", "openai_base_url": local_model, "openai_model": MODEL,
                                       "formation_concurrency": 4, "openai_timeout_s": 600.0})


async def test_a_worker_forms_turns_with_the_local_model(on_model, conn, workers):
    w = workers(settings=on_model)
    await w.wait_assigned(timeout=120)
    said = [TurnRecorded.new(user_id="lm", conversation_id="c", user_message=m, assistant_message="Noted.",
                             occurred_at=BASE + timedelta(minutes=i))
            for i, m in enumerate(["Hi, I'm Rosa and I live in Valencia.", "Can you recommend a good book?",
                                   "My brother Luis lives in Quito."])]
    await append_and_wait(on_model, conn, said)
    facts = await wait_until(lambda: conn.fetch(
        "SELECT attribute, value FROM memory_facts WHERE user_id = 'lm' AND status = 'current'"),
        timeout=120, what="the user's facts")
    values = {r["value"] for r in facts}
    assert any("Valencia" in v for v in values), facts  # under whatever slot the model names it
    assert not any("Quito" in v for v in values), facts  # the brother's city is not the user's
    assert await conn.fetchval("SELECT count(*) FROM episodes WHERE user_id = 'lm'") == 3
    assert await conn.fetchval("SELECT extractor FROM memory_facts WHERE user_id = 'lm' LIMIT 1") == f"openai:{MODEL}"


async def test_eval_formation_with_the_local_model_holds_its_measured_level(settings, local_model):
    """Calls a turn at the goal (1.2); junk held at the level measured (0.35-0.41 on these 53
    turns, 2026-12-05), not at the goal of 5%, which this model does not reach (BENCHMARKS.md):
    a regression guard, not the goal."""
    s = settings.model_copy(update={"extractor": "openai", "openai_base_url": local_model, "openai_model": MODEL,
                                    "formation_concurrency": 4, "openai_timeout_s": 600.0, "openai_max_tokens": 768})
    report = await evaluate(s, limit=3, parallel=3)
    (HOME / "eval-formation-local-model.json").write_text(json.dumps(report, indent=2))  # the figures, for BENCHMARKS.md
    assert report["turns"] >= 50
    assert report["junk_rate"] is not None and report["junk_rate"] <= 0.5, report
    assert report["recall"] >= 0.3, report  # a guard that refuses everything is not a guard
    assert report["llm_calls_per_turn"] <= 1.2, report


# Clusters as a reflection sweep finds them: facts of one theme, as an extractor words them.
CLUSTERS = [
    ["Goes hiking most weekends", "Likes camping in the mountains", "Hikes in the Pyrenees every summer"],
    ["Is training for a marathon", "Runs five mornings a week", "Likes running"],
    ["Likes jazz", "Plays the saxophone", "Likes blues music"],
    ["Is vegetarian", "Likes Italian food", "Cooks pasta at home"],
    ["Works as a nurse", "Works night shifts", "Works at the city hospital"],
    ["Has a dog named Rex", "Walks the dog every evening", "Likes dogs"],
]


async def test_the_local_model_reflects_on_clusters_in_the_schema_and_grounding_decides_each(local_model):
    """Each cluster's answer fits the reflection schema (citing facts it was shown); the grounding
    keeps or refuses each with a reason. How many it keeps is written for BENCHMARKS.md; at least
    one must pass: a grounding that refuses every sentence of a real model is not a grounding."""
    from memstream.llm.openai_compat import OpenAIReflector, openai_client
    from memstream.schemas.facts import FactContent
    from memstream.streams.worker.formation.reflections import ungrounded

    reflector = OpenAIReflector(openai_client(local_model, None, timeout_s=600.0), MODEL, max_tokens=256)
    out = []
    for texts in CLUSTERS:
        facts = [FactContent(t, "preference", "likes", t, 0.9, True) for t in texts]
        answer = await reflector.reflect([f.text for f in facts])
        assert len(answer.cited) >= 2 and all(0 <= i < len(facts) for i in answer.cited), answer
        why = ungrounded(answer.text, [facts[i].text for i in answer.cited])
        out.append({"facts": texts, "reflection": answer.text, "cited": list(answer.cited), "refused": why})
    (HOME / "reflections-local-model.json").write_text(json.dumps(out, indent=2))
    assert any(r["refused"] is None for r in out), out
