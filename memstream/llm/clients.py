"""The LLM clients formation uses, by the name ``settings.extractor`` gives."""
from __future__ import annotations

from typing import NamedTuple


class LlmClients(NamedTuple):
    extractor: object  # ExtractionClient
    resolver: object  # ResolutionClient
    relations: object  # RelationExtractionClient
    turn: object  # TurnExtractionClient: facts and relations in one call (formation uses it when given)


def llm_clients(settings) -> LlmClients:
    """The clients named by ``settings.extractor``: ``offline``, ``offline-strict``, ``bedrock``,
    ``openai`` (any OpenAI-compatible chat API), or ``offline+latency`` (the offline rules answering as slowly as a hosted model:
    ``memstream.llm.latency``, for benchmarks and tests only)."""
    if settings.extractor in ("offline", "offline-strict"):
        from memstream.llm.offline import OfflineExtractor, OfflineResolver, StrictOfflineExtractor
        from memstream.llm.offline_relations import OfflineRelationExtractor, OfflineTurnExtractor

        extractor = StrictOfflineExtractor() if settings.extractor == "offline-strict" else OfflineExtractor()
        relations = OfflineRelationExtractor()
        return LlmClients(extractor, OfflineResolver(), relations, OfflineTurnExtractor(extractor, relations))
    if settings.extractor == "offline+latency":
        from memstream.llm.latency import Latency, latent_clients

        return LlmClients(*latent_clients(Latency(settings.stand_in_latency_p50, settings.stand_in_latency_p95,
                                                  settings.stand_in_max_in_flight)))
    if settings.extractor == "bedrock":
        from memstream.llm.bedrock import (BedrockExtractor, BedrockRelationExtractor, BedrockResolver,
                                           BedrockTurnExtractor, bedrock_client, bedrock_executor)

        # Twice the calls formation has in flight: boto3's calls cannot be cancelled, so those
        # abandoned at a revoke run on (up to the read timeout) beside the calls of the next batch.
        n = 2 * settings.formation_concurrency
        client, kw = bedrock_client(settings.bedrock_region, max_in_flight=n), {"executor": bedrock_executor(n)}
        return LlmClients(BedrockExtractor(client, settings.bedrock_extraction_model, **kw),
                          BedrockResolver(client, settings.bedrock_resolution_model, **kw),
                          BedrockRelationExtractor(client, settings.bedrock_extraction_model, **kw),
                          BedrockTurnExtractor(client, settings.bedrock_extraction_model, **kw))
    if settings.extractor == "openai":
        from memstream.llm.openai_compat import (OpenAIExtractor, OpenAIRelationExtractor, OpenAIResolver,
                                                 OpenAITurnExtractor, openai_client)

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key is not None else None
        client = openai_client(settings.openai_base_url, key, timeout_s=settings.openai_timeout_s,
                               max_in_flight=settings.formation_concurrency)
        kw = {"structured": settings.openai_structured, "max_tokens": settings.openai_max_tokens}
        model, resolution = settings.openai_model, settings.openai_resolution_model or settings.openai_model
        return LlmClients(OpenAIExtractor(client, model, **kw), OpenAIResolver(client, resolution, **kw),
                          OpenAIRelationExtractor(client, model, **kw), OpenAITurnExtractor(client, model, **kw))
    raise ValueError(f"unknown extractor {settings.extractor!r} "
                     "(offline | offline-strict | bedrock | openai | offline+latency)")


def reflection_client(settings):
    """The reflection model (``ReflectionClient``) for ``settings.extractor``: the same service
    and model as extraction, the offline summariser for the offline rules."""
    if settings.extractor == "bedrock":
        from memstream.llm.bedrock import BedrockReflector, bedrock_client, bedrock_executor

        return BedrockReflector(bedrock_client(settings.bedrock_region, max_in_flight=2),
                                settings.bedrock_extraction_model, executor=bedrock_executor(2))
    if settings.extractor == "openai":
        from memstream.llm.openai_compat import OpenAIReflector, openai_client

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key is not None else None
        client = openai_client(settings.openai_base_url, key, timeout_s=settings.openai_timeout_s, max_in_flight=2)
        return OpenAIReflector(client, settings.openai_model, structured=settings.openai_structured,
                               max_tokens=settings.openai_max_tokens)
    from memstream.llm.offline_reflection import OfflineReflector

    return OfflineReflector()
