"""A test double for a hosted LLM: the offline clients behind a wait per call.

Every figure for formation with the offline extractor is CPU time; a hosted model answers in
about a second. These wrappers make the offline clients answer as slowly as one would: each call
sleeps a latency drawn from a log-normal with the given p50 and p95 (or exactly p50), fails with
``Throttled`` past ``max_in_flight`` calls at once (as Bedrock throttles above a quota), and is
counted with the tokens Bedrock would report for the request the Bedrock adapter would send
(about four characters a token). Only benchmarks and tests make them (``extractor =
"offline+latency"``); never the default, never the demo. Their answers are the offline ones, so a
replay of what they decided lands on the same stores.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Sequence

from memstream.llm.bedrock import BedrockExtractor, BedrockRelationExtractor, BedrockResolver, BedrockTurnExtractor
from memstream.llm.offline import OfflineExtractor, OfflineResolver
from memstream.llm.offline_relations import OfflineRelationExtractor, OfflineTurnExtractor
from memstream.llm.protocols import CandidateFact, ExistingFact, Resolution, Throttled, TurnCandidates
from memstream.llm.retrying import retrying
from memstream.schemas import TurnRecorded

Z95 = 1.6448536  # the standard normal's 95th percentile

@dataclass
class Latency:
    """Seconds per call: log-normal with median ``p50`` and 95th percentile ``p95`` (None: always
    ``p50``); at most ``max_in_flight`` calls at once (None: no limit), the rest ``Throttled``."""

    p50: float
    p95: float | None = None
    max_in_flight: int | None = None
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self):
        if self.p50 < 0 or (self.p95 is not None and self.p95 < self.p50):
            raise ValueError(f"latency needs 0 <= p50 <= p95, not p50={self.p50} p95={self.p95}")
        self._rng = random.Random(self.seed)

    def draw(self) -> float:
        if self.p95 is None or self.p95 == self.p50 or self.p50 == 0:
            return self.p50
        return self._rng.lognormvariate(math.log(self.p50), math.log(self.p95 / self.p50) / Z95)


@dataclass
class Meter:
    """What the stand-in was asked, as Bedrock's usage would report it."""

    calls: int = 0
    throttled: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    in_flight: int = 0
    most_in_flight: int = 0


def _tokens(text: str) -> int:
    return max(1, round(len(text) / 4))


def _answer_text(answer) -> str:
    if isinstance(answer, TurnCandidates):
        return _answer_text(list(answer.facts)) + _answer_text(list(answer.relations))
    items = answer if isinstance(answer, (list, tuple)) else [answer]
    return json.dumps([asdict(a) if is_dataclass(a) else str(a) for a in items], default=str)


class _Line:
    """One model endpoint: every client of a stand-in shares its quota and its meter."""

    def __init__(self, latency: Latency, meter: Meter):
        self.latency, self.meter = latency, meter

    async def call(self, request: dict, answer):
        m = self.meter
        if self.latency.max_in_flight is not None and m.in_flight >= self.latency.max_in_flight:
            m.throttled += 1
            await asyncio.sleep(0.02)  # a refusal still costs a round trip
            raise Throttled(f"stand-in quota: {self.latency.max_in_flight} calls in flight")
        m.in_flight += 1
        m.most_in_flight = max(m.most_in_flight, m.in_flight)
        try:
            await asyncio.sleep(self.latency.draw())
        finally:
            m.in_flight -= 1
        used = _tokens(json.dumps(request, default=str)), _tokens(_answer_text(answer))
        m.calls += 1
        m.input_tokens += used[0]
        m.output_tokens += used[1]
        return used


class _Latent:
    """One client of the stand-in: ``inner``'s answers, asked for on ``line`` with the request
    ``shape`` (the Bedrock adapter) would send; the tokens it used so far are its own, as a
    Bedrock adapter counts its own."""

    tokens = (0, 0)

    def __init__(self, line: _Line, inner, shape):
        self._line, self._inner, self._shape = line, inner, shape
        self.model_id = inner.model_id

    async def _ask(self, request: dict, answer):
        used = await retrying(lambda: self._line.call(request, answer))
        self.tokens = (self.tokens[0] + used[0], self.tokens[1] + used[1])
        return answer


class LatentExtractor(_Latent):
    """Facts or relations: an ``ExtractionClient`` or a ``RelationExtractionClient``."""

    async def extract(self, turn: TurnRecorded) -> Sequence:
        return await self._ask(self._shape.request(turn), await self._inner.extract(turn))


class LatentResolver(_Latent):
    async def resolve(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> Resolution:
        return await self._ask(self._shape.request(candidate, neighbours),
                               await self._inner.resolve(candidate, neighbours))

    async def resolve_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> list[Resolution]:
        return await self._ask(self._shape.request_all(asked), await self._inner.resolve_all(asked))


class LatentTurnExtractor(_Latent):
    def __init__(self, line: _Line, inner, shape):
        super().__init__(line, inner, shape)
        self.relations_model_id = inner.relations_model_id

    async def extract_turn(self, turn: TurnRecorded) -> TurnCandidates:
        return await self._ask(self._shape.request(turn), await self._inner.extract_turn(turn))


def latent_clients(latency: Latency, meter: Meter | None = None):
    """The offline extractor, resolver, relation extractor and turn extractor behind one
    stand-in endpoint (one quota, one meter)."""
    line = _Line(latency, meter or Meter())
    return (LatentExtractor(line, OfflineExtractor(), BedrockExtractor(None, "stand-in")),
            LatentResolver(line, OfflineResolver(), BedrockResolver(None, "stand-in")),
            LatentExtractor(line, OfflineRelationExtractor(), BedrockRelationExtractor(None, "stand-in")),
            LatentTurnExtractor(line, OfflineTurnExtractor(), BedrockTurnExtractor(None, "stand-in")))
