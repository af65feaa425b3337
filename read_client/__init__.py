"""The read client: ranked memory context in milliseconds, no LLM. Imports no Faust."""
from memstream.read_client.budget import Budgets
from memstream.read_client.metrics import ReadMetrics
from memstream.read_client.reader import MemoryReader
from memstream.read_client.render import render_context, render_prompt
from memstream.schemas.read_models import AsOf, MemoryContext

__all__ = ["AsOf", "Budgets", "MemoryContext", "MemoryReader", "ReadMetrics", "render_context", "render_prompt"]
