"""Formation's model calls over an OpenAI-compatible chat API: OpenAI, Azure OpenAI, or a model of
one's own behind Ollama, vLLM, LM Studio or llama.cpp's server.

The answer is constrained to the schema of ``memstream.llm.structured`` (the same prompts and
answers as the Bedrock adapters): by ``response_format: json_schema`` (default; llama.cpp, vLLM,
Ollama and OpenAI turn it into a grammar or structured outputs), or by a forced tool call
(``structured="tools"``) for a service that constrains tools but not response formats.

Errors map as Bedrock's do. Throttling (429), a service error (5xx), a timeout or a lost
connection are retried here with exponential backoff (``retrying``), then raised as
``Throttled`` or ``ModelUnavailable``: formation retries the turn. An answer that is not the
schema's JSON, or is cut off by the token limit, is ``MalformedOutput``: formation asks again a few
times, it never guesses. A prompt too long for the model, or an answer a content filter stopped,
is ``ModelRefused`` (formation dead-letters the turn). Any other 4xx (a key, a model name, a
setting the service does not take) is raised as it is: the deployment is broken, the worker stops.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import re
from typing import Any, Literal, Sequence

import httpx
import openai
from pydantic import BaseModel

from memstream.llm.protocols import (Reflection, CandidateFact, CountsTokens, ExistingFact, MalformedOutput, ModelRefused,
                                     ModelUnavailable, Resolution, Throttled, TurnCandidates)
from memstream.llm.retrying import retrying
from memstream.llm.structured import (REFLECT_PROMPT, REFLECT_PROMPT_VERSION, REFLECT_TOOL, ReflectionAnswer,
                                      reflect_question, reflection_of,
                                      EXTRACT_PROMPT, EXTRACT_TOOL, RELATE_PROMPT, RELATE_TOOL, RESOLVE_ALL_PROMPT,
                                      RESOLVE_ALL_TOOL, RESOLVE_PROMPT, RESOLVE_TOOL, TURN_PROMPT, TURN_TOOL,
                                      FactsAnswer, RelationsAnswer, TurnAnswer, render_turn, resolution_answer,
                                      resolution_of, resolutions_answer, resolutions_of, resolve_all_question,
                                      resolve_question, validated)
from memstream.schemas import TurnRecorded

log = logging.getLogger("memstream.llm")

Structured = Literal["json_schema", "tools"]
# A 400 about the prompt's length is the turn's (too long for this model); any other is the deployment's.
TOO_LONG = re.compile(r"context.{0,20}(length|window|size)|too (long|many tokens)|maximum context|exceeds? the",
                      re.IGNORECASE)


def openai_client(base_url: str, api_key: str | None, *, timeout_s: float = 60.0,
                  max_in_flight: int = 16) -> openai.AsyncOpenAI:
    """An async client for ``base_url`` (``https://api.openai.com/v1``, an Azure resource's
    ``https://<name>.openai.azure.com/openai/v1/``, ``http://127.0.0.1:11434/v1`` for Ollama...).
    The SDK's own retries are off: ``_Chat.call`` retries, so attempts are counted once. Its
    connection pool holds ``max_in_flight`` connections (formation's calls in flight)."""
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0,
                              timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
                              http_client=httpx.AsyncClient(limits=limits))


class _Chat:
    """One model behind one client: a request constrained to an answer's schema, retried, parsed."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, *, structured: Structured = "json_schema",
                 attempts: int = 5, backoff: float = 0.5, max_tokens: int = 1024, seed: int | None = 0):
        self._client, self.model, self._structured = client, model, structured
        self._attempts, self._backoff, self._max_tokens, self._seed = attempts, backoff, max_tokens, seed
        self.tokens = (0, 0)  # input and output tokens of every call so far (the answers' usage)
        # Requests whose answer did not fit, by digest: asked again, they are sampled warmer (at
        # temperature 0 a model gives the same unusable answer every time).
        self._unfit: collections.OrderedDict[str, int] = collections.OrderedDict()

    def request(self, system: str, user: str, name: str, answer: type[BaseModel]) -> dict[str, Any]:
        schema = answer.model_json_schema()
        if self._structured == "json_schema":  # the prompts name a tool; here the answer is the object itself
            system = system.replace(f"by calling {name}", "with one JSON object of the schema given")
        request: dict[str, Any] = {
            "model": self.model, "temperature": 0.0, "max_tokens": self._max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
        if self._seed is not None:
            request["seed"] = self._seed
        if self._structured == "tools":
            request["tools"] = [{"type": "function", "function": {"name": name, "parameters": schema}}]
            request["tool_choice"] = {"type": "function", "function": {"name": name}}
        else:
            request["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        return request

    async def call(self, request: dict[str, Any], name: str, answer: type[BaseModel]) -> BaseModel:
        what = f"openai-compatible {self.model}"
        key = hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()
        if tries := self._unfit.get(key):
            request = {**request, "temperature": min(1.0, 0.4 * tries), "seed": tries}
        try:
            response = await retrying(lambda: self._client.chat.completions.create(**request), retry_if=_passing,
                                      attempts=self._attempts, backoff=self._backoff, what=what)
        except openai.RateLimitError as exc:
            raise Throttled(f"{what}: {_said(exc)}") from exc
        except (openai.APIConnectionError, openai.InternalServerError) as exc:  # timeouts are connection errors
            raise ModelUnavailable(f"{what}: {type(exc).__name__}: {_said(exc)}") from exc
        except openai.BadRequestError as exc:
            if refused(exc):
                raise ModelRefused(f"{what}: {_said(exc)}") from exc
            raise
        if response.usage is not None:
            self.tokens = (self.tokens[0] + (response.usage.prompt_tokens or 0),
                           self.tokens[1] + (response.usage.completion_tokens or 0))
        try:
            return _parse(response, name, answer)
        except MalformedOutput:
            self._unfit[key] = self._unfit.get(key, 0) + 1
            self._unfit.move_to_end(key)
            while len(self._unfit) > 1024:
                self._unfit.popitem(last=False)
            raise


# What services answer with a 400 when their content policy stops a prompt (OpenAI, Azure OpenAI).
_POLICY_CODES = frozenset({"content_filter", "content_policy_violation", "invalid_prompt",
                           "ResponsibleAIPolicyViolation"})
_POLICY = re.compile(r"content (management )?policy|content filter", re.IGNORECASE)


def refused(exc: openai.BadRequestError) -> bool:
    """Whether a 400 is the service declining this turn (too long for the model, or its content
    policy), which formation gives the turn up on, rather than a request it can never take (a
    model name, a schema), which stops the worker."""
    said, body = _said(exc), getattr(exc, "body", None)
    inner = body.get("error") if isinstance(body, dict) else None
    codes = {getattr(exc, "code", None), inner.get("code") if isinstance(inner, dict) else None}
    return bool(TOO_LONG.search(said) or codes & _POLICY_CODES or _POLICY.search(said))


def _passing(exc: BaseException) -> bool:
    return isinstance(exc, (openai.RateLimitError, openai.APIConnectionError, openai.InternalServerError))


def _said(exc: openai.APIError) -> str:
    # The service's message, without the request (it holds what the user said).
    body = getattr(exc, "body", None)
    message = None
    if isinstance(body, dict):
        message = body.get("message") or (body["error"].get("message") if isinstance(body.get("error"), dict) else None)
    return str(message or getattr(exc, "message", "") or exc)[:300]


def _parse(response, name: str, answer: type[BaseModel]) -> BaseModel:
    if not response.choices:
        raise MalformedOutput("the service answered no choice")
    choice = response.choices[0]
    if choice.finish_reason == "content_filter":
        raise ModelRefused("the model stopped: content_filter")
    if choice.finish_reason == "length":
        raise MalformedOutput("the answer was cut off at the token limit")
    message = choice.message
    calls = [c for c in (message.tool_calls or []) if getattr(c, "function", None) and c.function.name == name]
    text = calls[0].function.arguments if calls else (message.content or "")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedOutput(f"{name}: the answer is not JSON ({exc.msg} at {exc.pos})") from exc
    return validated(answer, data, f"{name}: the answer")


class OpenAIExtractor(CountsTokens):
    """``ExtractionClient`` over an OpenAI-compatible chat API."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, **kw: Any):
        self._service = _Chat(client, model, **kw)
        self.model_id = f"openai:{model}"

    async def extract(self, turn: TurnRecorded) -> Sequence[CandidateFact]:
        out = await self._service.call(self._service.request(EXTRACT_PROMPT, render_turn(turn), EXTRACT_TOOL, FactsAnswer),
                                    EXTRACT_TOOL, FactsAnswer)
        return [CandidateFact(**f.model_dump()) for f in out.facts]  # type: ignore[attr-defined]


class OpenAIResolver(CountsTokens):
    """``ResolutionClient`` over an OpenAI-compatible chat API. Neighbours are shown numbered;
    the model answers with an index, mapped back to the fact id here (it never sees ids)."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, **kw: Any):
        self._service = _Chat(client, model, **kw)
        self.model_id = f"openai:{model}"

    async def resolve(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> Resolution:
        answer = resolution_answer(len(neighbours))
        request = self._service.request(RESOLVE_PROMPT, resolve_question(candidate, neighbours), RESOLVE_TOOL, answer)
        return resolution_of(await self._service.call(request, RESOLVE_TOOL, answer), neighbours)

    async def resolve_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> list[Resolution]:
        answer = resolutions_answer(len(asked), max((len(n) for _, n in asked), default=0))
        request = self._service.request(RESOLVE_ALL_PROMPT, resolve_all_question(asked), RESOLVE_ALL_TOOL, answer)
        return resolutions_of(await self._service.call(request, RESOLVE_ALL_TOOL, answer), asked)


class OpenAIRelationExtractor(CountsTokens):
    """``RelationExtractionClient`` over an OpenAI-compatible chat API."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, **kw: Any):
        self._service = _Chat(client, model, **kw)
        self.model_id = f"openai:{model}"

    async def extract(self, turn: TurnRecorded):
        from memstream.llm.relations import RelationCandidate

        request = self._service.request(RELATE_PROMPT, render_turn(turn), RELATE_TOOL, RelationsAnswer)
        out = await self._service.call(request, RELATE_TOOL, RelationsAnswer)
        return [RelationCandidate(**r.model_dump()) for r in out.relations]  # type: ignore[attr-defined]


class OpenAITurnExtractor(CountsTokens):
    """``TurnExtractionClient`` over an OpenAI-compatible chat API: facts and relations in one answer."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, **kw: Any):
        self._service = _Chat(client, model, **kw)
        self.model_id = self.relations_model_id = f"openai:{model}"

    async def extract_turn(self, turn: TurnRecorded) -> TurnCandidates:
        from memstream.llm.relations import RelationCandidate

        out = await self._service.call(self._service.request(TURN_PROMPT, render_turn(turn), TURN_TOOL, TurnAnswer),
                                    TURN_TOOL, TurnAnswer)
        return TurnCandidates([CandidateFact(**f.model_dump()) for f in out.facts],  # type: ignore[attr-defined]
                              [RelationCandidate(**r.model_dump()) for r in out.relations])  # type: ignore[attr-defined]


class OpenAIReflector(CountsTokens):
    """``ReflectionClient`` over an OpenAI-compatible chat API. Memories are shown numbered; the
    model cites them by number (it never sees ids)."""

    prompt_version = REFLECT_PROMPT_VERSION

    def __init__(self, client: openai.AsyncOpenAI, model: str, **kw: Any):
        self._service = _Chat(client, model, **kw)
        self.model_id = f"openai:{model}"

    async def reflect(self, memories: Sequence[str]) -> Reflection:
        request = self._service.request(REFLECT_PROMPT, reflect_question(memories), REFLECT_TOOL, ReflectionAnswer)
        return reflection_of(await self._service.call(request, REFLECT_TOOL, ReflectionAnswer), len(memories))
