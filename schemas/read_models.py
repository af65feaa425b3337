"""Read models returned by the read client (pydantic: validated, documented, JSON-able)."""
from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, Field


class Turn(BaseModel):
    """One recent turn of the current conversation (Tier 0)."""

    episode_id: uuid.UUID
    occurred_at: datetime
    user_message: str
    assistant_message: str


class RankedEpisode(BaseModel):
    """A past turn retrieved for the message, with how it scored."""

    episode_id: uuid.UUID
    conversation_id: str
    occurred_at: datetime
    user_message: str
    assistant_message: str
    score: float
    relevance: float
    recency: float
    channels: list[str] = Field(description="channels that retrieved it: vector, keyword")


class MemoryContext(BaseModel):
    """Everything memstream knows that is worth putting in front of the model for a message.

    ``degraded`` names channels that failed (their sections are empty, the rest is intact);
    ``caught_up`` is False when ``read(after=...)`` timed out before the projection reached the
    requested log position.
    """

    user_id: str
    conversation_id: str
    message: str
    recent_turns: list[Turn] = Field(default_factory=list)
    episodes: list[RankedEpisode] = Field(default_factory=list)
    degraded: list[str] = Field(default_factory=list)
    caught_up: bool = True
    timings_ms: dict[str, float] = Field(default_factory=dict)
