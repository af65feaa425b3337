"""Bedrock adapters against botocore's Stubber: request shape, parsing, throttling, bad output."""
import uuid
from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import ANY, Stubber

from memstream.llm.bedrock import BedrockExtractor, BedrockResolver
from memstream.llm.protocols import (CandidateFact, ExistingFact, MalformedOutput, ModelFailed, ModelRefused,
                                     ModelUnavailable, Operation, Throttled)
from memstream.schemas import TurnRecorded
from memstream.schemas.errors import Refused, Retryable

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
TURN = TurnRecorded.new(user_id="u", conversation_id="c", user_message="I moved to Berlin last month.",
                        assistant_message="Exciting!", occurred_at=datetime(2026, 5, 1, tzinfo=timezone.utc))


@pytest.fixture
def client():
    c = boto3.client("bedrock-runtime", region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    with Stubber(c) as stub:
        c.stub = stub
        yield c
        stub.assert_no_pending_responses()


def tool_response(name, tool_input):
    return {
        "output": {"message": {"role": "assistant", "content": [
            {"toolUse": {"toolUseId": "t1", "name": name, "input": tool_input}}]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 10, "outputTokens": 10, "totalTokens": 20},
        "metrics": {"latencyMs": 5},
    }


BERLIN = {"facts": [{"text": "Lives in Berlin", "category": "location", "attribute": "home", "value": "Berlin",
                     "confidence": 0.95, "explicit": True, "valid_at": "2026-04-01T00:00:00Z",
                     "evidence": "I moved to Berlin"}]}


async def test_extraction_forces_the_tool_at_temperature_zero_and_parses_its_input(client):
    ex = BedrockExtractor(client, MODEL)
    expected = {"modelId": MODEL, "system": ANY, "messages": ANY,
                "toolConfig": {"tools": ANY, "toolChoice": {"tool": {"name": "record_facts"}}},
                "inferenceConfig": {"temperature": 0.0, "maxTokens": 1024}}
    client.stub.add_response("converse", tool_response("record_facts", BERLIN), expected)
    facts = await ex.extract(TURN)
    assert facts == [CandidateFact(text="Lives in Berlin", category="location", attribute="home", value="Berlin",
                                   confidence=0.95, explicit=True,
                                   valid_at=datetime(2026, 4, 1, tzinfo=timezone.utc), evidence="I moved to Berlin")]
    req = ex.request(TURN)
    assert "I moved to Berlin last month." in req["messages"][0]["content"][0]["text"]
    assert req["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"]["required"] == ["facts"]
    assert ex.model_id == f"bedrock:{MODEL}"


async def test_throttling_is_retried_with_backoff(client):
    ex = BedrockExtractor(client, MODEL, backoff=0.001)
    client.stub.add_client_error("converse", service_error_code="ThrottlingException", http_status_code=429)
    client.stub.add_client_error("converse", service_error_code="ServiceUnavailableException", http_status_code=503)
    client.stub.add_response("converse", tool_response("record_facts", BERLIN))
    assert [f.value for f in await ex.extract(TURN)] == ["Berlin"]


async def test_errors_past_the_attempt_limit_are_ours_by_what_they_say_of_the_turn(client):
    from botocore.exceptions import ClientError

    ex = BedrockExtractor(client, MODEL, backoff=0.001, attempts=2)
    for code, status, raised in [("ThrottlingException", 429, Throttled), ("ServiceUnavailableException", 503,
                                                                          ModelUnavailable),
                                 ("ModelErrorException", 424, ModelFailed)]:
        for _ in range(1 if raised is ModelFailed else 2):  # formation's attempts of the turn count it
            client.stub.add_client_error("converse", service_error_code=code, http_status_code=status)
        with pytest.raises(raised, match=code) as info:
            await ex.extract(TURN)
        assert isinstance(info.value, Retryable)  # formation retries the turn
    # The request made of this turn (too long for the model): asked once, the turn dead-lettered.
    client.stub.add_client_error("converse", service_error_code="ValidationException", http_status_code=400,
                                 service_message="Input is too long for requested model.")
    with pytest.raises(ModelRefused, match="too long") as info:
        await ex.extract(TURN)
    assert isinstance(info.value, Refused)
    # The deployment (credentials, access, a setting the model does not take): raised as it is, the worker stops.
    client.stub.add_client_error("converse", service_error_code="AccessDeniedException", http_status_code=403)
    with pytest.raises(ClientError, match="AccessDenied"):
        await ex.extract(TURN)
    client.stub.add_client_error("converse", service_error_code="ValidationException", http_status_code=400,
                                 service_message="The provided model identifier is invalid.")
    with pytest.raises(ClientError, match="model identifier"):
        await ex.extract(TURN)


class Unreachable:
    """A client whose endpoint cannot be reached, then can (botocore's own error)."""

    def __init__(self, fails: int, then: dict):
        self.fails, self.then, self.calls = fails, then, 0

    def converse(self, **request):
        from botocore.exceptions import EndpointConnectionError

        self.calls += 1
        if self.calls <= self.fails:
            raise EndpointConnectionError(endpoint_url="https://bedrock-runtime.us-east-1.amazonaws.com")
        return self.then


async def test_a_lost_connection_is_retried_then_unavailable():
    ok = Unreachable(1, tool_response("record_facts", BERLIN))
    assert [f.value for f in await BedrockExtractor(ok, MODEL, backoff=0.001).extract(TURN)] == ["Berlin"]
    assert ok.calls == 2
    with pytest.raises(ModelUnavailable, match="EndpointConnectionError"):
        await BedrockExtractor(Unreachable(9, {}), MODEL, backoff=0.001, attempts=2).extract(TURN)


@pytest.mark.parametrize("stop", ["content_filtered", "guardrail_intervened", "model_context_window_exceeded"])
async def test_an_answer_stopped_for_the_turns_content_is_refused(client, stop):
    client.stub.add_response("converse", {**tool_response("record_facts", BERLIN), "stopReason": stop})
    with pytest.raises(ModelRefused, match=stop):
        await BedrockExtractor(client, MODEL).extract(TURN)


async def test_a_malformed_answer_does_not_repeat_what_the_model_read(client):
    secret = {"facts": [{**BERLIN["facts"][0], "category": "Lives at 12 Secret Street"}]}
    client.stub.add_response("converse", tool_response("record_facts", secret))
    with pytest.raises(MalformedOutput, match="category") as info:
        await BedrockExtractor(client, MODEL).extract(TURN)
    assert "Secret Street" not in str(info.value)  # logged, and a dead letter's reason


@pytest.mark.parametrize("response", [
    {"output": {"message": {"role": "assistant", "content": [{"text": "I think she moved."}]}}, "stopReason": "end_turn",
     "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}, "metrics": {"latencyMs": 1}},
    tool_response("record_facts", {"facts": [{"text": "x", "category": "astrology", "attribute": "a", "value": "v",
                                              "confidence": 0.5, "explicit": True}]}),
    tool_response("record_facts", {"facts": [{"text": "Lives in Berlin", "confidence": 2}]}),
    tool_response("other_tool", BERLIN),
    tool_response("record_facts", {"facts": [{**BERLIN["facts"][0], "attribute": "a" * 101}]}),  # a btree key
])
async def test_malformed_tool_output_raises_a_clear_error(client, response):
    client.stub.add_response("converse", response)
    with pytest.raises(MalformedOutput):
        await BedrockExtractor(client, MODEL).extract(TURN)


def neighbours():
    return [ExistingFact(uuid.UUID(int=1), "Lives in Lisbon", "location", "home", "Lisbon", 0.82),
            ExistingFact(uuid.UUID(int=2), "Likes hiking", "preference", "likes", "hiking", 0.11)]


CAND = CandidateFact(text="Lives in Berlin", category="location", attribute="home", value="Berlin",
                     confidence=0.9, explicit=True)


async def test_resolution_maps_the_target_index_back_to_the_fact_id(client):
    res = BedrockResolver(client, MODEL)
    client.stub.add_response("converse", tool_response("classify_fact", {"operation": "UPDATE", "target_index": 0,
                                                                         "reason": "moved"}))
    r = await res.resolve(CAND, neighbours())
    assert (r.op, r.target, r.reason) == (Operation.UPDATE, uuid.UUID(int=1), "moved")
    text = res.request(CAND, neighbours())["messages"][0]["content"][0]["text"]
    assert "[0] Lives in Lisbon" in text and str(uuid.UUID(int=1)) not in text


async def test_a_resolution_naming_a_fact_it_was_not_shown_is_malformed(client):
    client.stub.add_response("converse", tool_response("classify_fact", {"operation": "DELETE", "target_index": 7,
                                                                         "reason": "gone"}))
    with pytest.raises(MalformedOutput, match="target_index"):
        await BedrockResolver(client, MODEL).resolve(CAND, neighbours())


async def test_relation_extraction_forces_its_tool_and_parses_triples(client):
    from memstream.llm.bedrock import BedrockRelationExtractor
    from memstream.llm.relations import RelationCandidate

    rel = BedrockRelationExtractor(client, MODEL)
    client.stub.add_response("converse", tool_response("record_relations", {"relations": [
        {"source": "I", "relation": "has_manager", "target": "David", "target_is_entity": True,
         "confidence": 0.9, "explicit": True}]}),
        {"modelId": MODEL, "system": ANY, "messages": ANY,
         "toolConfig": {"tools": ANY, "toolChoice": {"tool": {"name": "record_relations"}}},
         "inferenceConfig": {"temperature": 0.0, "maxTokens": 1024}})
    assert await rel.extract(TURN) == [RelationCandidate("I", "has_manager", "David", True, 0.9, True)]
    for bad in ({"source": "I"}, {"source": "I", "relation": "r" * 101, "target": "David", "target_is_entity": True,
                                  "confidence": 0.9, "explicit": True}):
        client.stub.add_response("converse", tool_response("record_relations", {"relations": [bad]}))
        with pytest.raises(MalformedOutput):
            await rel.extract(TURN)


async def test_one_call_resolves_every_candidate_of_a_turn_each_against_its_own_list(client):
    other = CandidateFact(text="Likes jazz", category="preference", attribute="likes", value="jazz",
                          confidence=0.9, explicit=True)
    jazz = [ExistingFact(uuid.UUID(int=9), "Loves jazz", "preference", "likes", "jazz", 0.97)]
    res = BedrockResolver(client, MODEL)
    client.stub.add_response("converse", tool_response("classify_facts", {"resolutions": [
        {"candidate_index": 1, "operation": "NOOP", "target_index": 0, "reason": "known"},
        {"candidate_index": 0, "operation": "UPDATE", "target_index": 0, "reason": "moved"}]}),
        {"modelId": MODEL, "system": ANY, "messages": ANY,
         "toolConfig": {"tools": ANY, "toolChoice": {"tool": {"name": "classify_facts"}}}, "inferenceConfig": ANY})
    got = await res.resolve_all([(CAND, neighbours()), (other, jazz)])
    assert [(r.op, r.target) for r in got] == [(Operation.UPDATE, uuid.UUID(int=1)), (Operation.NOOP, uuid.UUID(int=9))]
    text = res.request_all([(CAND, neighbours()), (other, jazz)])["messages"][0]["content"][0]["text"]
    assert "Candidate 1:" in text and "[0] Loves jazz" in text and str(uuid.UUID(int=9)) not in text
    client.stub.add_response("converse", tool_response("classify_facts", {"resolutions": [
        {"candidate_index": 0, "operation": "ADD", "reason": "new"}]}))  # one of two answered
    with pytest.raises(MalformedOutput, match="classify candidates 0..1 once each"):
        await res.resolve_all([(CAND, neighbours()), (other, jazz)])


async def test_one_call_extracts_a_turns_facts_and_relations_together(client):
    from memstream.llm.bedrock import BedrockTurnExtractor
    from memstream.llm.relations import RelationCandidate

    ex = BedrockTurnExtractor(client, MODEL)
    client.stub.add_response("converse", tool_response("record_turn", {**BERLIN, "relations": [
        {"source": "I", "relation": "lives_in", "target": "Berlin", "target_is_entity": True,
         "confidence": 0.95, "explicit": True}]}),
        {"modelId": MODEL, "system": ANY, "messages": ANY,
         "toolConfig": {"tools": ANY, "toolChoice": {"tool": {"name": "record_turn"}}}, "inferenceConfig": ANY})
    got = await ex.extract_turn(TURN)
    assert [f.value for f in got.facts] == ["Berlin"]
    assert got.relations == [RelationCandidate("I", "lives_in", "Berlin", True, 0.95, True)]
    assert ex.model_id == ex.relations_model_id == f"bedrock:{MODEL}"
    schema = ex.request(TURN)["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"]
    assert schema["required"] == ["facts", "relations"]
    assert "FACTS." in ex.request(TURN)["system"][0]["text"] and "RELATIONS." in ex.request(TURN)["system"][0]["text"]


@pytest.mark.parametrize("said, stored", [
    ("2026-04-01", datetime(2026, 4, 1, tzinfo=timezone.utc)),  # a bare date: naive, taken as UTC
    ("0001-01-01T00:00:00+05:00", None),  # past what the store holds: undated
])
async def test_a_date_the_model_gives_is_one_the_store_can_compare_and_hold(client, said, stored):
    client.stub.add_response("converse", tool_response("record_facts", {"facts": [{**BERLIN["facts"][0],
                                                                                   "valid_at": said}]}))
    [fact] = await BedrockExtractor(client, MODEL).extract(TURN)
    assert fact.valid_at == stored and (stored is None or fact.valid_at.tzinfo is not None)
