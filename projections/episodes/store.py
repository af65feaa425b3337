"""Episodes, the asyncpg shell: batched inserts plus positions in one transaction."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

import asyncpg
import numpy as np
from pgvector import Vector

from memstream.projections import positions as pos
from memstream.projections.batches import runs
from memstream.projections.episodes.core import EpisodeRow, episode_id
from memstream.schemas import EpisodesSwept, MemoryForgotten

_INSERT = """
INSERT INTO episodes (episode_id, source_event_id, user_id, conversation_id, occurred_at,
    recorded_at, source_partition, source_offset, user_message, assistant_message, metadata,
    embedding, embedding_model)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[],
    $6::timestamptz[], $7::int[], $8::bigint[], $9::text[], $10::text[], $11::jsonb[],
    $12::vector[], $13::text[])
ON CONFLICT (user_id, episode_id) DO NOTHING
RETURNING user_id, episode_id
"""
# An episode's passages go in with it, only with it: a decision for an episode already there (a
# batch applied again, the same turn formed twice) adds nothing, as a rebuild keeps the first.
_INSERT_PASSAGES = """
INSERT INTO episode_passages (user_id, episode_id, passage, start_char, end_char, embedding, embedding_model,
    cooled_at)
SELECT * FROM unnest($1::text[], $2::uuid[], $3::int[], $4::int[], $5::int[], $6::vector[], $7::text[],
    $8::timestamptz[])
ON CONFLICT (user_id, episode_id, passage) DO NOTHING
"""


class EpisodeStore:
    name = "episodes"

    async def apply_batch(self, conn: asyncpg.Connection,
                          rows: Sequence[EpisodeRow | MemoryForgotten | EpisodesSwept],
                          positions: pos.Positions) -> Forgotten:
        """Episode rows, forgettings and sweeps, in log order. Returns what was forgotten (for Tier 0)."""
        forgotten = Forgotten([], [], set())
        async with conn.transaction():
            for run, forget in runs(rows, lambda item: isinstance(item, (MemoryForgotten, EpisodesSwept))):
                forgotten.kept_out |= await _insert(conn, run)
                if forget is None:
                    continue
                if isinstance(forget, EpisodesSwept):
                    await swept(conn, forget)
                    continue
                if forget.kind == "user":
                    forgotten.erased.append(forget.user_id)
                    held = await conn.execute("DELETE FROM episodes WHERE user_id = $1", forget.user_id)
                    await conn.execute("DELETE FROM episode_passages WHERE user_id = $1", forget.user_id)
                    await conn.execute("DELETE FROM forgotten_episodes WHERE user_id = $1", forget.user_id)
                    # Tier 0 is made of episodes: a user without any has no key to look for (a
                    # forget of an id that never existed must not cost a scan of the cache).
                    if held != "DELETE 0":
                        forgotten.users.append(forget.user_id)
                elif forget.kind == "episode":
                    gone = await conn.fetchrow(_FORGET, forget.user_id, episode_id(forget.target))
                    await conn.execute("DELETE FROM episode_passages WHERE user_id = $1 AND episode_id = $2",
                                       forget.user_id, episode_id(forget.target))
                    await conn.execute("INSERT INTO forgotten_episodes VALUES ($1, $2) ON CONFLICT DO NOTHING",
                                       forget.user_id, episode_id(forget.target))
                    if gone is not None:
                        forgotten.episodes.append(gone)
            await pos.save(conn, self.name, positions)
        return forgotten


# Cooling keeps an episode's first time (a sweep delivered again, or a later sweep naming it,
# changes nothing); warming clears it. Passages follow their episode.
_COOL = """UPDATE {table} SET cooled_at = $3 WHERE user_id = $1 AND episode_id = ANY($2::uuid[]) AND cooled_at IS NULL"""
_WARM = """UPDATE {table} SET cooled_at = NULL WHERE user_id = $1 AND episode_id = ANY($2::uuid[]) AND cooled_at IS NOT NULL"""


async def swept(conn, d: EpisodesSwept) -> None:
    """``d``'s episodes out of the hot vector index (``cooled``) and back into it (``warmed``)."""
    for table in ("episodes", "episode_passages"):
        if d.cooled:
            await conn.execute(_COOL.format(table=table), d.user_id, list(d.cooled), d.swept_at)
        if d.warmed:
            await conn.execute(_WARM.format(table=table), d.user_id, list(d.warmed))


_FORGET = ("DELETE FROM episodes WHERE user_id = $1 AND episode_id = $2 "
           "RETURNING episode_id, user_id, conversation_id, occurred_at, user_message, assistant_message")


@dataclass
class Forgotten:
    episodes: list  # the deleted rows (episode_id, user_id, conversation_id, occurred_at, messages)
    users: list[str]  # forgotten users who had episodes here (Tier 0's keys to look for)
    kept_out: set  # (user_id, episode_id) of rows not recorded: their turn was forgotten before
    # Every forgotten user, episodes or not: a kept schema may hold rows of a user with none
    # here (only commands, or every turn forgotten one by one since the switch).
    erased: list[str] = field(default_factory=list)


async def _insert(conn, rows: Sequence[EpisodeRow]) -> set:
    """Inserts ``rows``, but for those of forgotten turns; returns (user_id, episode_id) of those."""
    if not rows:
        return set()
    kept_out = {(u, e) for u, e in await conn.fetch(_FORGOTTEN, [r.user_id for r in rows],
                                                    [r.episode_id for r in rows])}
    rows = [r for r in rows if (r.user_id, r.episode_id) not in kept_out]
    if rows:
        cols = [list(c) for c in zip(*(
            (r.episode_id, r.source_event_id, r.user_id, r.conversation_id, r.occurred_at,
             r.recorded_at, r.source_partition, r.source_offset, r.user_message,
             r.assistant_message, None if r.metadata is None else json.dumps(r.metadata, sort_keys=True),
             Vector(np.frombuffer(r.embedding, dtype="<f4")), r.embedding_model)
            for r in rows
        ))]
        inserted = {(r["user_id"], r["episode_id"]) for r in await conn.fetch(_INSERT, *cols)}
        passages = passage_records([r for r in rows if (r.user_id, r.episode_id) in inserted])
        if passages:
            await conn.execute(_INSERT_PASSAGES, *(list(c) for c in zip(*passages)))
    return kept_out


def passage_records(rows: Sequence[EpisodeRow]) -> list[tuple]:
    """The ``episode_passages`` rows of ``rows``, in its column order."""
    return [(r.user_id, r.episode_id, n, start, end, Vector(np.frombuffer(vector, dtype="<f4")), r.embedding_model,
             r.cooled_at) for r in rows for n, (start, end, vector) in enumerate(r.passages)]


_FORGOTTEN = ("SELECT f.user_id, f.episode_id FROM forgotten_episodes f "
              "JOIN unnest($1::text[], $2::uuid[]) AS r(user_id, episode_id) USING (user_id, episode_id)")
