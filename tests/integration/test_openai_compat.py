"""The OpenAI-compatible adapters against a real llama.cpp server (``xllamacpp``, started here with
the 135M SmolLM2 from its pinned package): answers that fit the schema by ``json_schema`` and by
a forced tool call, tokens counted, calls at once, a prompt too long for the model refused, a
server that is down retried and then reported. The 135M model proves the plumbing, not quality
(``make test-llm`` runs formation with the 1.5B one)."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from memstream.llm.openai_compat import (OpenAIExtractor, OpenAIResolver, OpenAITurnExtractor, openai_client)
from memstream.llm.protocols import (CandidateFact, MalformedOutput, ModelRefused, ModelUnavailable, Resolution,
                                     TurnCandidates)
from memstream.schemas import TurnRecorded

pytestmark = pytest.mark.asyncio


def turn(text: str, reply: str = "Noted!") -> TurnRecorded:
    return TurnRecorded.new(user_id="u1", conversation_id="c1", occurred_at=datetime(2026, 3, 1, tzinfo=timezone.utc),
                            user_message=text, assistant_message=reply)


async def test_a_turn_is_read_into_schema_valid_facts_and_relations_and_its_tokens_counted(chat_model):
    client = openai_client(chat_model, None, timeout_s=180)  # a slower CPU than this one's 6 s
    extractor = OpenAITurnExtractor(client, "smollm2")
    found = await extractor.extract_turn(turn("My name is Ana and I live in Lisbon."))
    assert isinstance(found, TurnCandidates)
    assert all(isinstance(f, CandidateFact) and f.attribute and 0 <= f.confidence <= 1 for f in found.facts)
    assert extractor.tokens[0] > 50 and extractor.tokens[1] > 0
    assert extractor.model_id == "openai:smollm2"


async def test_a_forced_tool_call_answers_as_the_response_format_does(chat_model):
    extractor = OpenAIExtractor(openai_client(chat_model, None, timeout_s=180), "smollm2", structured="tools",
                                max_tokens=512)
    try:
        facts = await extractor.extract(turn("I work at Acme."))
    except MalformedOutput:  # a tiny model may write its call as text (no tool call): asked again, never guessed
        pass
    else:
        assert all(isinstance(f, CandidateFact) for f in facts)
    assert extractor.tokens[1] > 0


async def test_a_resolution_names_a_known_fact_or_is_asked_again(chat_model):
    resolver = OpenAIResolver(openai_client(chat_model, None, timeout_s=180), "smollm2")
    candidate = CandidateFact(text="Lives in Porto", category="location", attribute="home", value="Porto",
                              confidence=0.9, explicit=True)
    try:
        answer = await resolver.resolve(candidate, [])
    except MalformedOutput as exc:  # a tiny model may name a fact that is not there: asked again, never guessed
        assert "target_index" in str(exc)
    else:
        assert isinstance(answer, Resolution) and answer.target is None


async def test_calls_at_once_all_answer_or_are_asked_again(chat_model):
    # Four at once: enough to overlap calls on one client. Answers of 128 tokens at most: this model
    # writes 700 to 1,200 here (30 s each, four at once), and how many varies with the CPU; an answer
    # cut off is MalformedOutput (asked again), and a whole one is the first test's.
    extractor = OpenAIExtractor(openai_client(chat_model, None, max_in_flight=4, timeout_s=180), "smollm2",
                                max_tokens=128)
    said = [turn(f"My name is Ana and I live in city number {n}.") for n in range(4)]
    answers = await asyncio.wait_for(asyncio.gather(*(extractor.extract(t) for t in said), return_exceptions=True), 600)
    assert all(isinstance(a, (list, MalformedOutput)) for a in answers), answers
    assert extractor.tokens[0] > 4 * 50  # every call's prompt counted (an answer may be one token)


async def test_a_turn_too_long_for_the_model_is_refused_not_retried(chat_model):
    extractor = OpenAIExtractor(openai_client(chat_model, None, timeout_s=180), "smollm2")
    with pytest.raises(ModelRefused):
        await extractor.extract(turn("word " * 20_000))


async def test_a_server_that_is_down_is_retried_then_reported_as_unavailable():
    extractor = OpenAIExtractor(openai_client("http://127.0.0.1:9/v1", None, timeout_s=2), "smollm2",
                                attempts=2, backoff=0.01)
    with pytest.raises(ModelUnavailable):
        await extractor.extract(turn("I live in Oslo."))
