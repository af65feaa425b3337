"""The read client: ranked memory context in milliseconds, no LLM. Imports no Faust."""
from memstream.read_client.reader import MemoryReader
from memstream.schemas.read_models import MemoryContext

__all__ = ["MemoryReader", "MemoryContext"]
