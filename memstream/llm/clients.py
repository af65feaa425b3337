"""The LLM clients formation uses, by the name ``settings.extractor`` gives."""
from __future__ import annotations


def llm_clients(settings):
    """The fact extraction, resolution and relation extraction clients named by ``settings.extractor``."""
    if settings.extractor in ("offline", "offline-strict"):
        from memstream.llm.offline import OfflineExtractor, OfflineResolver, StrictOfflineExtractor
        from memstream.llm.offline_relations import OfflineRelationExtractor

        extractor = StrictOfflineExtractor() if settings.extractor == "offline-strict" else OfflineExtractor()
        return extractor, OfflineResolver(), OfflineRelationExtractor()
    if settings.extractor == "bedrock":
        from memstream.llm.bedrock import BedrockExtractor, BedrockRelationExtractor, BedrockResolver, bedrock_client

        client = bedrock_client(settings.bedrock_region)
        return (BedrockExtractor(client, settings.bedrock_extraction_model),
                BedrockResolver(client, settings.bedrock_resolution_model),
                BedrockRelationExtractor(client, settings.bedrock_extraction_model))
    raise ValueError(f"unknown extractor {settings.extractor!r} (offline | offline-strict | bedrock)")
