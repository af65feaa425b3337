"""LLM access for formation, behind small protocols (offline rules, AWS Bedrock)."""
from memstream.llm.protocols import (CandidateFact, ExistingFact, ExtractionClient, Operation,
                                     Resolution, ResolutionClient)

__all__ = ["CandidateFact", "ExistingFact", "ExtractionClient", "Operation", "Resolution", "ResolutionClient"]
