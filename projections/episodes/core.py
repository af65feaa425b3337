"""Episodes, the pure core: an ``EpisodeRecorded`` decision becomes one immutable row, and an
``EpisodesSwept`` moves rows between the hot and the cold vector index."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime

from memstream.schemas import EpisodeRecorded, EpisodesSwept


def episode_id(source_event_id: uuid.UUID) -> uuid.UUID:
    return uuid.uuid5(source_event_id, "episode")


@dataclass(frozen=True, slots=True)
class EpisodeRow:
    episode_id: uuid.UUID
    source_event_id: uuid.UUID
    user_id: str
    conversation_id: str
    occurred_at: datetime
    recorded_at: datetime
    source_partition: int
    source_offset: int
    user_message: str
    assistant_message: str
    metadata: dict | None
    embedding: bytes
    embedding_model: str
    passages: tuple[tuple[int, int, bytes], ...] = ()  # (start, end, vector) of a long turn's windows
    cooled_at: datetime | None = None  # out of the hot vector index since (a decay sweep's time)


def apply(decision: EpisodeRecorded) -> EpisodeRow:
    return EpisodeRow(
        episode_id=episode_id(decision.source_event_id),
        source_event_id=decision.source_event_id,
        user_id=decision.user_id,
        conversation_id=decision.conversation_id,
        occurred_at=decision.occurred_at,
        recorded_at=decision.recorded_at,
        source_partition=decision.source.partition,
        source_offset=decision.source.offset,
        user_message=decision.user_message,
        assistant_message=decision.assistant_message,
        metadata=decision.metadata,
        embedding=decision.embedding,
        embedding_model=decision.embedding_model,
        passages=tuple((p.start, p.end, p.embedding) for p in decision.passages),
    )


def swept(row: EpisodeRow, d: EpisodesSwept) -> EpisodeRow:
    """``row`` after ``d``: cooled keeps its first time (a sweep delivered again, or a later one
    naming it, changes nothing), warmed is hot again. The store does the same in SQL."""
    if row.cooled_at is None and row.episode_id in d.cooled:
        row = replace(row, cooled_at=d.swept_at)
    if row.cooled_at is not None and row.episode_id in d.warmed:
        row = replace(row, cooled_at=None)
    return row
