"""AWS Bedrock adapters for formation: the Converse API with a forced tool for structured output.

Credentials come only from boto3's own chain or from arguments passed to ``bedrock_client``;
this module never reads the environment. boto3 is synchronous, so calls run in a thread.
Throttling, transient service errors and lost connections are retried with exponential
backoff, then raised as ``Throttled`` or ``ModelUnavailable`` (formation retries the turn). The
model failing on the request (``ModelFailed``), or a response without the forced tool call or
whose input does not fit the tool's schema (``MalformedOutput``), is raised at once: formation
asks again a few times, it never guesses. A turn too long for the model, or an answer a content
filter or guardrail stopped, raises ``ModelRefused`` (formation dead-letters the turn). Any
other client error (credentials, access, a model id or setting the model does not take) is
raised as it is: the deployment is broken, the worker stops.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import re
from typing import Any, Sequence

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError, HTTPClientError
from pydantic import BaseModel
from memstream.llm.protocols import (Reflection, CandidateFact, CountsTokens, ExistingFact, MalformedOutput, ModelRefused,
                                     ModelFailed, ModelUnavailable, Resolution, Throttled,
                                     TurnCandidates)
from memstream.llm.retrying import retrying
from memstream.llm.structured import (REFLECT_PROMPT, REFLECT_PROMPT_VERSION, REFLECT_TOOL, ReflectionAnswer,
                                      reflect_question, reflection_of,
                                      EXTRACT_PROMPT, EXTRACT_TOOL, RELATE_PROMPT, RELATE_TOOL, RESOLVE_ALL_TOOL,
                                      RESOLVE_ALL_PROMPT, RESOLVE_PROMPT, RESOLVE_TOOL, TURN_PROMPT, TURN_TOOL, FactsAnswer,
                                      RelationsAnswer, ResolutionAnswer, ResolutionsAnswer, TurnAnswer, render_turn,
                                      resolution_of, resolutions_of, resolve_all_question, resolve_question,
                                      validated)
from memstream.schemas import TurnRecorded

log = logging.getLogger("memstream.llm")

THROTTLING = frozenset({"ThrottlingException"})
# A timeout is the service's load more often than the turn's: retried for ever, never given up.
RETRYABLE = THROTTLING | {"ServiceUnavailableException", "InternalServerException", "ModelNotReadyException",
                          "ModelTimeoutException"}
# The model failing on this request: not asked again here, formation's attempts of the turn count it.
FAILED = frozenset({"ModelErrorException"})
# A ValidationException is Bedrock's every 400: only one about the input's length is the turn's
# (any other is the deployment's: a model id, a tool or token setting the model does not take).
TOO_LONG = re.compile(r"too long|too many (input )?tokens|context (window|length)", re.IGNORECASE)
STOPPED = frozenset({"content_filtered", "guardrail_intervened", "model_context_window_exceeded"})


def bedrock_client(region: str, *, aws_access_key_id: str | None = None, aws_secret_access_key: str | None = None,
                   aws_session_token: str | None = None, max_in_flight: int = 10):
    """A ``bedrock-runtime`` client; explicit keys if given, else boto3's credential chain.
    botocore's own retries are off: ``_Converse.call`` retries, so attempts are counted once. Its
    connection pool holds ``max_in_flight`` connections (botocore's default of 10 would queue
    formation's concurrent calls behind each other)."""
    return boto3.client(
        "bedrock-runtime", region_name=region, aws_access_key_id=aws_access_key_id,
        aws_secret_access_key=aws_secret_access_key, aws_session_token=aws_session_token,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=60,
                      max_pool_connections=max_in_flight),
    )


def bedrock_executor(max_in_flight: int) -> concurrent.futures.ThreadPoolExecutor:
    """Threads for boto3's blocking calls: one per call in flight (asyncio's default pool has
    min(32, cores + 4), which would cap formation's concurrency at 6 on two cores)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="bedrock")


def _tool(name: str, description: str, model: type[BaseModel]) -> dict:
    return {"toolSpec": {"name": name, "description": description, "inputSchema": {"json": model.model_json_schema()}}}


class _Converse:
    def __init__(self, client, model_id: str, *, attempts: int = 5, backoff: float = 0.5, max_tokens: int = 1024,
                 executor: concurrent.futures.Executor | None = None):
        self._client, self.model_id, self._executor = client, model_id, executor
        self._attempts, self._backoff, self._max_tokens = attempts, backoff, max_tokens
        self.tokens = (0, 0)  # input and output tokens of every call so far (Converse's usage)

    def request(self, system: str, user: str, tool: dict) -> dict:
        return {
            "modelId": self.model_id,
            "system": [{"text": system}],
            "messages": [{"role": "user", "content": [{"text": user}]}],
            "toolConfig": {"tools": [tool], "toolChoice": {"tool": {"name": tool["toolSpec"]["name"]}}},
            "inferenceConfig": {"temperature": 0.0, "maxTokens": self._max_tokens},
        }

    async def call(self, request: dict, model: type[BaseModel]) -> BaseModel:
        name = request["toolConfig"]["tools"][0]["toolSpec"]["name"]
        loop = asyncio.get_running_loop()
        try:
            response = await retrying(
                lambda: loop.run_in_executor(self._executor, functools.partial(self._client.converse, **request)),
                retry_if=_passing, attempts=self._attempts, backoff=self._backoff, what=f"bedrock {self.model_id}")
        except ClientError as exc:
            code, message = exc.response["Error"]["Code"], exc.response["Error"].get("Message", "")
            what = f"bedrock {self.model_id}: {code}: {message}"
            if code in THROTTLING:
                raise Throttled(what) from exc
            if code in FAILED:
                raise ModelFailed(what) from exc
            if code in RETRYABLE:
                raise ModelUnavailable(what) from exc
            if code == "ValidationException" and TOO_LONG.search(message):
                raise ModelRefused(what) from exc
            raise
        except (BotoConnectionError, HTTPClientError) as exc:
            raise ModelUnavailable(f"bedrock {self.model_id}: {type(exc).__name__}") from exc
        usage = response.get("usage", {})
        self.tokens = (self.tokens[0] + usage.get("inputTokens", 0), self.tokens[1] + usage.get("outputTokens", 0))
        return _parse(response, name, model)


def _passing(exc: BaseException) -> bool:
    return ((isinstance(exc, ClientError) and exc.response["Error"]["Code"] in RETRYABLE)
            or isinstance(exc, (BotoConnectionError, HTTPClientError)))


def _parse(response: dict, tool_name: str, model: type[BaseModel]) -> BaseModel:
    if response.get("stopReason") in STOPPED:
        raise ModelRefused(f"the model stopped: {response['stopReason']}")
    content = response.get("output", {}).get("message", {}).get("content", [])
    uses = [c["toolUse"] for c in content if "toolUse" in c and c["toolUse"].get("name") == tool_name]
    if not uses:
        raise MalformedOutput(f"the model did not call {tool_name} (stopReason={response.get('stopReason')!r})")
    return validated(model, uses[0].get("input"), f"{tool_name} input")


class BedrockExtractor(CountsTokens):
    """``ExtractionClient`` over Bedrock Converse."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._service = _Converse(client, model_id, **kw)
        self.model_id = f"bedrock:{model_id}"
        self._tool = _tool(EXTRACT_TOOL, "Record the facts found in the turn.", FactsAnswer)

    def request(self, turn: TurnRecorded) -> dict:
        return self._service.request(EXTRACT_PROMPT, render_turn(turn), self._tool)

    async def extract(self, turn: TurnRecorded) -> Sequence[CandidateFact]:
        out = await self._service.call(self.request(turn), FactsAnswer)
        return [CandidateFact(**f.model_dump()) for f in out.facts]  # type: ignore[attr-defined]


class BedrockResolver(CountsTokens):
    """``ResolutionClient`` over Bedrock Converse. Neighbours are shown numbered; the model
    answers with an index, mapped back to the fact id here (it never sees ids)."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._service = _Converse(client, model_id, **kw)
        self.model_id = f"bedrock:{model_id}"
        self._tool = _tool(RESOLVE_TOOL, "Classify the candidate against the existing facts.", ResolutionAnswer)
        self._all_tool = _tool(RESOLVE_ALL_TOOL, "Classify each candidate against its existing facts.", ResolutionsAnswer)

    def request(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> dict:
        return self._service.request(RESOLVE_PROMPT, resolve_question(candidate, neighbours), self._tool)

    async def resolve(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> Resolution:
        return resolution_of(await self._service.call(self.request(candidate, neighbours), ResolutionAnswer), neighbours)

    def request_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> dict:
        return self._service.request(RESOLVE_ALL_PROMPT, resolve_all_question(asked), self._all_tool)

    async def resolve_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> list[Resolution]:
        return resolutions_of(await self._service.call(self.request_all(asked), ResolutionsAnswer), asked)


class BedrockRelationExtractor(CountsTokens):
    """``RelationExtractionClient`` over Bedrock Converse."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._service = _Converse(client, model_id, **kw)
        self.model_id = f"bedrock:{model_id}"
        self._tool = _tool(RELATE_TOOL, "Record the relationships found in the turn.", RelationsAnswer)

    def request(self, turn: TurnRecorded) -> dict:
        return self._service.request(RELATE_PROMPT, render_turn(turn), self._tool)

    async def extract(self, turn: TurnRecorded):
        from memstream.llm.relations import RelationCandidate

        out = await self._service.call(self.request(turn), RelationsAnswer)
        return [RelationCandidate(**r.model_dump()) for r in out.relations]  # type: ignore[attr-defined]


class BedrockTurnExtractor(CountsTokens):
    """``TurnExtractionClient`` over Bedrock Converse: facts and relations in one tool call."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._service = _Converse(client, model_id, **kw)
        self.model_id = self.relations_model_id = f"bedrock:{model_id}"
        self._tool = _tool(TURN_TOOL, "Record the facts and the relationships found in the turn.", TurnAnswer)

    def request(self, turn: TurnRecorded) -> dict:
        return self._service.request(TURN_PROMPT, render_turn(turn), self._tool)

    async def extract_turn(self, turn: TurnRecorded) -> TurnCandidates:
        from memstream.llm.relations import RelationCandidate

        out = await self._service.call(self.request(turn), TurnAnswer)
        return TurnCandidates([CandidateFact(**f.model_dump()) for f in out.facts],  # type: ignore[attr-defined]
                              [RelationCandidate(**r.model_dump()) for r in out.relations])  # type: ignore[attr-defined]


class BedrockReflector(CountsTokens):
    """``ReflectionClient`` over Bedrock Converse."""

    prompt_version = REFLECT_PROMPT_VERSION

    def __init__(self, client, model_id: str, **kw: Any):
        self._service = _Converse(client, model_id, **kw)
        self.model_id = f"bedrock:{model_id}"
        self._tool = _tool(REFLECT_TOOL, "Record the sentence the memories show together.", ReflectionAnswer)

    def request(self, memories: Sequence[str]) -> dict:
        return self._service.request(REFLECT_PROMPT, reflect_question(memories), self._tool)

    async def reflect(self, memories: Sequence[str]) -> Reflection:
        return reflection_of(await self._service.call(self.request(memories), ReflectionAnswer), len(memories))
