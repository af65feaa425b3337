"""Reading an OpenAI-compatible answer (``openai_compat._parse``): the schema's JSON in the content
or in the forced tool call; a cut-off answer, a filtered one or one that is not the schema's JSON
each raise the error formation handles for it. Pure: the answers are built, no service is asked
(tests/integration/test_openai_compat.py asks a real llama.cpp server)."""
from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion

from memstream.llm.openai_compat import _Chat, _parse
from memstream.llm.protocols import MalformedOutput, ModelRefused, Unanswered
from memstream.llm.structured import EXTRACT_PROMPT, EXTRACT_TOOL, FactsAnswer
from memstream.schemas.errors import Refused

FACT = {"text": "Lives in Lisbon", "category": "location", "attribute": "home", "value": "Lisbon",
        "confidence": 0.9, "explicit": True, "evidence": "I live in Lisbon"}


def completion(content: str | None = None, finish: str = "stop", tool_args: str | None = None) -> ChatCompletion:
    message: dict = {"role": "assistant", "content": content}
    if tool_args is not None:
        message["tool_calls"] = [{"id": "c1", "type": "function", "function": {"name": EXTRACT_TOOL,
                                                                               "arguments": tool_args}}]
    return ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})


def test_the_answer_is_read_from_the_content_or_from_the_forced_tool_call():
    from_content = _parse(completion(json.dumps({"facts": [FACT]})), EXTRACT_TOOL, FactsAnswer)
    from_tool = _parse(completion(None, "tool_calls", json.dumps({"facts": [FACT]})), EXTRACT_TOOL, FactsAnswer)
    assert from_content == from_tool and from_content.facts[0].value == "Lisbon"


@pytest.mark.parametrize("answer, finish, error", [
    ('{"facts": [', "length", MalformedOutput),  # cut off at the token limit
    ("I cannot help with that.", "stop", MalformedOutput),  # prose, not the schema's JSON
    ('{"facts": [{"text": "x"}]}', "stop", MalformedOutput),  # JSON, not the schema
    ("", "content_filter", ModelRefused),
])
def test_an_answer_that_does_not_fit_is_asked_again_and_a_filtered_one_is_refused(answer, finish, error):
    with pytest.raises(error) as raised:
        _parse(completion(answer, finish), EXTRACT_TOOL, FactsAnswer)
    assert isinstance(raised.value, Unanswered if error is MalformedOutput else Refused)
    assert "Lisbon" not in str(raised.value)  # what the user said never reaches a reason


def test_a_request_holds_the_answer_to_its_schema_by_response_format_or_by_a_forced_tool():
    by_format = _Chat(None, "m").request(EXTRACT_PROMPT, "USER: hi", EXTRACT_TOOL, FactsAnswer)
    assert by_format["response_format"]["json_schema"]["schema"] == FactsAnswer.model_json_schema()
    assert "tools" not in by_format and f"calling {EXTRACT_TOOL}" not in by_format["messages"][0]["content"]
    by_tool = _Chat(None, "m", structured="tools").request(EXTRACT_PROMPT, "USER: hi", EXTRACT_TOOL, FactsAnswer)
    assert by_tool["tool_choice"]["function"]["name"] == EXTRACT_TOOL and "response_format" not in by_tool
    assert by_tool["temperature"] == 0.0 and by_tool["seed"] == 0


def test_a_resolution_answer_can_only_name_a_fact_it_was_shown():
    from pydantic import ValidationError

    from memstream.llm.structured import resolution_answer, resolutions_answer

    one = resolution_answer(2)
    assert one.model_json_schema()["properties"]["target_index"]["maximum"] == 1
    assert one.model_validate({"operation": "NOOP", "target_index": 1, "reason": "same"}).target_index == 1
    for wrong in ({"operation": "UPDATE", "reason": "changed"}, {"operation": "NOOP", "target_index": 2, "reason": "r"}):
        with pytest.raises(ValidationError):
            one.model_validate(wrong)
    batch = resolutions_answer(2, 3)
    fields = list(batch.model_json_schema()["$defs"].values())[0]["properties"]
    assert list(fields)[0] == "candidate_index" and fields["candidate_index"]["maximum"] == 1
    with pytest.raises(ValidationError):  # one resolution per candidate
        batch.model_validate({"resolutions": [{"candidate_index": 0, "operation": "ADD", "target_index": 0,
                                               "reason": "new"}]})


def test_a_model_s_name_for_a_slot_is_memstream_s():
    answer = FactsAnswer.model_validate({"facts": [{**FACT, "attribute": "Company"}, {**FACT, "attribute": "Favorite Book"},
                                                   {**FACT, "attribute": "sailing_club"}]})
    assert [f.attribute for f in answer.facts] == ["employer", "favourite_book", "sailing_club"]


def _bad_request(body: dict) -> Exception:
    import httpx
    import openai

    response = httpx.Response(400, request=httpx.Request("POST", "http://model/v1/chat/completions"))
    inner = body.get("error", body)
    return openai.BadRequestError(str(inner.get("message")), response=response, body=inner)


@pytest.mark.parametrize("body, turn_refused", [
    ({"error": {"code": "content_filter", "message": "The response was filtered due to the prompt triggering Azure "
                "OpenAI's content management policy.", "param": "prompt", "status": 400}}, True),
    ({"error": {"code": "invalid_prompt", "message": "Invalid prompt: your prompt was flagged as potentially "
                "violating our usage policy."}}, True),
    ({"error": {"code": "context_length_exceeded", "message": "This model's maximum context length is 8192 "
                "tokens."}}, True),
    ({"error": {"code": "model_not_found", "message": "The model `gpt-9` does not exist."}}, False),
    ({"error": {"code": None, "message": "Invalid schema for response_format 'facts'."}}, False),
])
def test_a_400_for_the_turn_gives_the_turn_up_and_one_for_the_request_stops_the_worker(body, turn_refused):
    from memstream.llm.openai_compat import refused

    assert refused(_bad_request(body)) is turn_refused
