"""Text embedders. The contract is ``Embedder``; the default is the offline int8 MiniLM."""
from memstream.embedding.base import Embedder, embed_with_passages, from_bytes, to_bytes
from memstream.embedding.minilm import TOKENIZER_PATH, MiniLMOnnx

__all__ = ["Embedder", "MiniLMOnnx", "embed_with_passages", "TOKENIZER_PATH", "from_bytes", "to_bytes", "default_embedder", "embedder_for", "dimensions_of"]


def default_embedder(threads: int = 1, variant: str = "dynamic") -> Embedder:
    return MiniLMOnnx(threads=threads, variant=variant)


def embedder_for(settings, threads: int | None = None) -> Embedder:
    """The embedder ``settings.embedder`` names: ``minilm`` (in process), ``openai`` (an
    OpenAI-compatible ``/v1/embeddings``) or ``titan`` (Bedrock Titan Text Embeddings v2)."""
    if settings.embedder == "minilm":
        return MiniLMOnnx(threads=threads or settings.embed_threads, variant=settings.embedding_variant)
    if settings.embedder == "openai":
        from memstream.embedding.remote import OpenAIEmbedder

        key = settings.embedding_api_key or settings.openai_api_key
        return OpenAIEmbedder(settings.embedding_base_url or settings.openai_base_url,
                              key.get_secret_value() if key is not None else None,
                              settings.embedding_model or "text-embedding-3-small",
                              dimensions=settings.embedding_dimensions, window_chars=settings.embedding_window_chars)
    if settings.embedder == "titan":
        import boto3

        from memstream.embedding.remote import TITAN_V2, TitanEmbedder

        return TitanEmbedder(boto3.client("bedrock-runtime", region_name=settings.bedrock_region),
                             model=settings.embedding_model or TITAN_V2, dimensions=settings.embedding_dimensions or 1024)
    raise ValueError(f"unknown embedder {settings.embedder!r} (minilm | openai | titan)")


def dimensions_of(settings) -> int:
    """The dimension of the vectors ``settings.embedder`` makes, without loading a model when it
    is known (the stores' vector columns are made for it: ``projections.db.migrate``)."""
    if settings.embedder == "minilm":
        return MiniLMOnnx.dim
    if settings.embedder == "titan":
        return settings.embedding_dimensions or 1024
    return settings.embedding_dimensions or embedder_for(settings).dim
