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
import json
import logging
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Sequence

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError, HTTPClientError
from pydantic import AfterValidator, BaseModel, Field, ValidationError
from memstream.llm.protocols import (CATEGORIES, CandidateFact, ExistingFact, MalformedOutput, ModelRefused,
                                     ModelFailed, ModelUnavailable, Operation, Resolution, Throttled,
                                     TurnCandidates)
from memstream.llm.retrying import retrying
from memstream.schemas import TurnRecorded
from memstream.schemas.events import in_range

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
    botocore's own retries are off: ``_converse`` retries, so attempts are counted once. Its
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


MAX_SLOT_CHARS = 100


def _world_time(when: datetime | None) -> datetime | None:
    # A model may answer a bare date ("2024-05-01": naive) or a year past what the store holds:
    # a naive time is taken as UTC, one out of range is no time at all (the fact stands undated).
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when if when is None or in_range(when) else None


WorldTime = Annotated[datetime | None, AfterValidator(_world_time)]


class _Fact(BaseModel):
    text: str = Field(min_length=1, description="the fact as a short sentence about the user")
    category: Literal[CATEGORIES]  # type: ignore[valid-type]
    # Bounded: attributes and relations are btree keys in the projections (a model's runaway
    # output must fail here, as malformed, not as an index row too large in the store).
    attribute: str = Field(min_length=1, max_length=MAX_SLOT_CHARS,
                           description="slot: name, home, employer, role, likes, allergy, ...")
    value: str
    confidence: float = Field(ge=0, le=1)
    explicit: bool = Field(description="true if the user stated it, false if inferred")
    valid_at: WorldTime = Field(None, description="when the fact became true, if the turn says")
    negated: bool = Field(False, description="true if the user says it is no longer true or asks to forget it")


class _Facts(BaseModel):
    facts: list[_Fact]


class _Resolution(BaseModel):
    operation: Literal["ADD", "UPDATE", "DELETE", "NOOP"]
    target_index: int | None = Field(None, description="index of the existing fact for UPDATE, DELETE or NOOP")
    reason: str = Field(min_length=1)


EXTRACT_TOOL = "record_facts"
RESOLVE_TOOL = "classify_fact"
EXTRACT_PROMPT = (
    "You extract durable facts about the USER from one conversation turn: identity, where they live or work, "
    "preferences and dislikes, constraints (allergies, diets), family, pets, plans with dates. Only facts about "
    "the user. Mark explicit=true only for what the user stated; inferred facts get explicit=false and lower "
    "confidence. A date dates only the fact it is said of (a child's birthday sets valid_at of the birthday, not "
    "of the child). An explicit request to forget or delete a memory (\"forget that I live in Lisbon\") is that "
    "fact with negated=true and explicit=true, never a fact to learn. "
    f"Always answer by calling {EXTRACT_TOOL}; an empty list is fine."
)
RESOLVE_PROMPT = (
    "Decide how a new candidate fact relates to the user's existing facts. ADD if it is new; UPDATE(target) if it "
    "replaces an existing fact's value; DELETE(target) if the user says an existing fact is no longer true or "
    "asks to forget it (a negated candidate deletes the fact it names; if none matches, ADD, and nothing is stored); "
    f"NOOP(target) if it is already known. Always answer by calling {RESOLVE_TOOL}."
)


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
    try:
        return model.model_validate(uses[0].get("input"))
    except ValidationError as exc:
        # Without the input: it is what the model read in the turn (logged, and a dead letter's reason).
        errors = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False)[:3]]
        raise MalformedOutput(f"{tool_name} input does not fit its schema: {errors}") from exc


def _render_turn(turn: TurnRecorded) -> str:
    return (f"Turn at {turn.occurred_at.isoformat()}\nUSER: {turn.user_message}\n"
            f"ASSISTANT: {turn.assistant_message}")


class _Counted:
    """Tokens used so far, for the workers' metrics."""

    _converse: _Converse

    @property
    def tokens(self) -> tuple[int, int]:
        return self._converse.tokens


class BedrockExtractor(_Counted):
    """``ExtractionClient`` over Bedrock Converse."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._converse = _Converse(client, model_id, **kw)
        self.model_id = f"bedrock:{model_id}"
        self._tool = _tool(EXTRACT_TOOL, "Record the facts found in the turn.", _Facts)

    def request(self, turn: TurnRecorded) -> dict:
        return self._converse.request(EXTRACT_PROMPT, _render_turn(turn), self._tool)

    async def extract(self, turn: TurnRecorded) -> Sequence[CandidateFact]:
        out = await self._converse.call(self.request(turn), _Facts)
        return [CandidateFact(**f.model_dump()) for f in out.facts]  # type: ignore[attr-defined]


class BedrockResolver(_Counted):
    """``ResolutionClient`` over Bedrock Converse. Neighbours are shown numbered; the model
    answers with an index, mapped back to the fact id here (it never sees ids)."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._converse = _Converse(client, model_id, **kw)
        self.model_id = f"bedrock:{model_id}"
        self._tool = _tool(RESOLVE_TOOL, "Classify the candidate against the existing facts.", _Resolution)
        self._all_tool = _tool(RESOLVE_ALL_TOOL, "Classify each candidate against its existing facts.", _Resolutions)

    def request(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> dict:
        existing = "\n".join(f"[{i}] {n.text} (attribute={n.attribute}, similarity={n.similarity:.2f})"
                             for i, n in enumerate(neighbours)) or "(none)"
        user = (f"Candidate: {json.dumps({'text': candidate.text, 'attribute': candidate.attribute, 'value': candidate.value, 'negated': candidate.negated})}\n"
                f"Existing facts:\n{existing}")
        return self._converse.request(RESOLVE_PROMPT, user, self._tool)

    async def resolve(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> Resolution:
        return _resolution(await self._converse.call(self.request(candidate, neighbours), _Resolution), neighbours)

    def request_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> dict:
        blocks = []
        for c, (candidate, neighbours) in enumerate(asked):
            existing = "\n".join(f"  [{i}] {n.text} (attribute={n.attribute}, similarity={n.similarity:.2f})"
                                  for i, n in enumerate(neighbours)) or "  (none)"
            blocks.append(f"Candidate {c}: {json.dumps({'text': candidate.text, 'attribute': candidate.attribute, 'value': candidate.value, 'negated': candidate.negated})}\n"
                          f"Existing facts for candidate {c} (target_index counts in this list):\n{existing}")
        prompt = RESOLVE_PROMPT.replace(f"Always answer by calling {RESOLVE_TOOL}.", "")
        return self._converse.request(prompt + "Classify every candidate, each against its own list of existing "
                                      f"facts. Always answer by calling {RESOLVE_ALL_TOOL} once, with one resolution "
                                      "per candidate.", "\n\n".join(blocks), self._all_tool)

    async def resolve_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> list[Resolution]:
        out = await self._converse.call(self.request_all(asked), _Resolutions)
        by_index = {r.candidate_index: r for r in out.resolutions}  # type: ignore[attr-defined]
        if sorted(r.candidate_index for r in out.resolutions) != list(range(len(asked))):  # type: ignore[attr-defined]
            raise MalformedOutput(f"{RESOLVE_ALL_TOOL} must classify candidates 0..{len(asked) - 1} once each, "
                                  f"got {sorted(by_index)}")
        return [_resolution(by_index[c], neighbours) for c, (_, neighbours) in enumerate(asked)]


def _resolution(out: _Resolution, neighbours: Sequence[ExistingFact]) -> Resolution:
    op, index = Operation(out.operation), out.target_index
    if op is Operation.ADD:
        return Resolution(op, None, out.reason)
    if index is None or not 0 <= index < len(neighbours):
        raise MalformedOutput(f"{op.value} needs a target_index in [0, {len(neighbours)}), got {index!r}")
    return Resolution(op, neighbours[index].fact_id, out.reason)


class _IndexedResolution(_Resolution):
    candidate_index: int = Field(description="which candidate this classifies")


class _Resolutions(BaseModel):
    resolutions: list[_IndexedResolution]


RESOLVE_ALL_TOOL = "classify_facts"


class _Relation(BaseModel):
    source: str = Field(min_length=1, description='"I" for the user, else the entity name')
    relation: str = Field(min_length=1, max_length=MAX_SLOT_CHARS,
                          description="snake_case, e.g. works_at, managed_by, lives_in, has_child")
    target: str = Field(min_length=1)
    target_is_entity: bool
    confidence: float = Field(ge=0, le=1)
    explicit: bool
    valid_at: WorldTime = None
    negated: bool = False


class _Relations(BaseModel):
    relations: list[_Relation]


RELATE_TOOL = "record_relations"
RELATE_PROMPT = (
    "You extract relationships stated or implied in one conversation turn as (source, relation, target) "
    'triples. Name the user "I". Use short snake_case relations (works_at, managed_by, lives_in, married_to, '
    "has_child, friend_of, has_pet...). negated=true when the user says a relationship ended or explicitly asks "
    "to forget it. valid_at only from a date said of that relationship (a birthday does not date has_child). "
    f"Always answer by calling {RELATE_TOOL}; an empty list is fine."
)


class BedrockRelationExtractor(_Counted):
    """``RelationExtractionClient`` over Bedrock Converse."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._converse = _Converse(client, model_id, **kw)
        self.model_id = f"bedrock:{model_id}"
        self._tool = _tool(RELATE_TOOL, "Record the relationships found in the turn.", _Relations)

    def request(self, turn: TurnRecorded) -> dict:
        return self._converse.request(RELATE_PROMPT, _render_turn(turn), self._tool)

    async def extract(self, turn: TurnRecorded):
        from memstream.llm.relations import RelationCandidate

        out = await self._converse.call(self.request(turn), _Relations)
        return [RelationCandidate(**r.model_dump()) for r in out.relations]  # type: ignore[attr-defined]


class _Turn(BaseModel):
    facts: list[_Fact]
    relations: list[_Relation]


TURN_TOOL = "record_turn"
TURN_PROMPT = (
    "You read one conversation turn for two things at once.\n\nFACTS. " + EXTRACT_PROMPT.replace(
        f"Always answer by calling {EXTRACT_TOOL}; an empty list is fine.", "")
    + "\n\nRELATIONS. " + RELATE_PROMPT.replace(f"Always answer by calling {RELATE_TOOL}; an empty list is fine.", "")
    + f"\n\nAlways answer by calling {TURN_TOOL} with both lists; empty lists are fine."
)


class BedrockTurnExtractor(_Counted):
    """``TurnExtractionClient`` over Bedrock Converse: facts and relations in one tool call."""

    def __init__(self, client, model_id: str, **kw: Any):
        self._converse = _Converse(client, model_id, **kw)
        self.model_id = self.relations_model_id = f"bedrock:{model_id}"
        self._tool = _tool(TURN_TOOL, "Record the facts and the relationships found in the turn.", _Turn)

    def request(self, turn: TurnRecorded) -> dict:
        return self._converse.request(TURN_PROMPT, _render_turn(turn), self._tool)

    async def extract_turn(self, turn: TurnRecorded) -> TurnCandidates:
        from memstream.llm.relations import RelationCandidate

        out = await self._converse.call(self.request(turn), _Turn)
        return TurnCandidates([CandidateFact(**f.model_dump()) for f in out.facts],  # type: ignore[attr-defined]
                              [RelationCandidate(**r.model_dump()) for r in out.relations])  # type: ignore[attr-defined]
