"""Text embedders. The contract is ``Embedder``; the default is the offline int8 MiniLM."""
from memstream.embedding.base import Embedder, embed_with_passages, from_bytes, to_bytes
from memstream.embedding.minilm import TOKENIZER_PATH, MiniLMOnnx

__all__ = ["Embedder", "MiniLMOnnx", "embed_with_passages", "TOKENIZER_PATH", "from_bytes", "to_bytes", "default_embedder"]


def default_embedder(threads: int = 1, variant: str = "dynamic") -> Embedder:
    return MiniLMOnnx(threads=threads, variant=variant)
