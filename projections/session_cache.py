"""Tier 0: the recent turns of each conversation, a derived cache in Redis.

One sorted set per conversation, scored by ``occurred_at``; members are the turn as canonical
JSON, so re-adding a redelivered turn is a no-op. Keys carry the schema and the projection
epoch, so a rebuild or a second deployment never reads another's cache. Losing Redis loses
nothing: the read client falls back to Postgres.
"""
from __future__ import annotations

import json
from typing import Iterable, Sequence

from memstream.projections.episodes.core import EpisodeRow


def tier0_key(schema: str, epoch: int, user_id: str, conversation_id: str) -> str:
    # Length-prefix the user id so "a:b" + "c" and "a" + "b:c" cannot share a key.
    return f"memstream:{schema}:e{epoch}:t0:{len(user_id)}:{user_id}:{conversation_id}"


def turn_member(row: EpisodeRow) -> str:
    return json.dumps(
        {"episode_id": str(row.episode_id), "occurred_at": row.occurred_at.isoformat(),
         "user_message": row.user_message, "assistant_message": row.assistant_message},
        sort_keys=True, separators=(",", ":"),
    )


async def push_turns(redis, schema: str, epoch: int, rows: Iterable[EpisodeRow], keep: int) -> None:
    pipe = redis.pipeline(transaction=False)
    touched = set()
    for row in rows:
        key = tier0_key(schema, epoch, row.user_id, row.conversation_id)
        pipe.zadd(key, {turn_member(row): row.occurred_at.timestamp()})
        touched.add(key)
    for key in touched:
        pipe.zremrangebyrank(key, 0, -(keep + 1))
    await pipe.execute()


async def recent_turns(redis, schema: str, epoch: int, user_id: str, conversation_id: str, n: int) -> Sequence[dict]:
    """The last ``n`` turns of the conversation, oldest first."""
    members = await redis.zrange(tier0_key(schema, epoch, user_id, conversation_id), -n, -1)
    return [json.loads(m) for m in members]
