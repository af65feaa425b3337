"""Episodes, the asyncpg shell: batched inserts plus positions in one transaction."""
from __future__ import annotations

import json
from typing import Sequence

import asyncpg
import numpy as np
from pgvector import Vector

from memstream.projections import positions as pos
from memstream.projections.episodes.core import EpisodeRow

_INSERT = """
INSERT INTO episodes (episode_id, source_event_id, user_id, conversation_id, occurred_at,
    recorded_at, source_partition, source_offset, user_message, assistant_message, metadata,
    embedding, embedding_model)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[],
    $6::timestamptz[], $7::int[], $8::bigint[], $9::text[], $10::text[], $11::jsonb[],
    $12::vector[], $13::text[])
ON CONFLICT (user_id, episode_id) DO NOTHING
"""


class EpisodeStore:
    name = "episodes"

    async def apply_batch(self, conn: asyncpg.Connection, rows: Sequence[EpisodeRow], positions: pos.Positions) -> None:
        async with conn.transaction():
            if rows:
                cols = [list(c) for c in zip(*(
                    (r.episode_id, r.source_event_id, r.user_id, r.conversation_id, r.occurred_at,
                     r.recorded_at, r.source_partition, r.source_offset, r.user_message,
                     r.assistant_message, None if r.metadata is None else json.dumps(r.metadata, sort_keys=True),
                     Vector(np.frombuffer(r.embedding, dtype="<f4")), r.embedding_model)
                    for r in rows
                ))]
                await conn.execute(_INSERT, *cols)
            await pos.save(conn, self.name, positions)
