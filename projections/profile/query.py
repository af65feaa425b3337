"""Tier 1, the query side: one user's profile, from Redis or Postgres."""
from __future__ import annotations

import contextlib
import json

from memstream.projections.facts import query as facts_q
from memstream.projections.profile.core import build_profile, profile_key

# A profile the reader cached on a miss; the projection's own writes do not expire.
WRITE_BACK_TTL_S = 600


async def read(redis, pool, schema: str, epoch: int, user_id: str) -> dict:
    """O(1): one Redis GET; on a miss, one Postgres row (written back to the cache)."""
    if redis is not None:
        cached = await redis.get(profile_key(schema, epoch, user_id))
        if cached is not None:
            return json.loads(cached)
    value = await pool.fetchval("SELECT profile FROM profiles WHERE user_id = $1", user_id)
    profile = (json.loads(value) if isinstance(value, str) else value) or {}
    if redis is not None and value is not None:
        # Only into a free key (a profile the projection cached meanwhile is newer), and taken
        # back if the profile was deleted meanwhile (a forget: its erasure may have come between
        # this read and this write).
        # If that check fails, the key goes at once (or, Redis failing too, within the TTL).
        key = profile_key(schema, epoch, user_id)
        if await redis.set(key, json.dumps(profile, sort_keys=True), nx=True, ex=WRITE_BACK_TTL_S):
            try:
                kept = await pool.fetchval("SELECT EXISTS (SELECT FROM profiles WHERE user_id = $1)", user_id)
            except BaseException:
                with contextlib.suppress(Exception):
                    await redis.delete(key)
                raise
            if not kept:
                await redis.delete(key)
    return profile


async def as_of(conn, user_id: str, valid_time, recorded_time) -> dict:
    """The profile as it was: built, as the projection builds today's, from the fact versions
    that held at ``valid_time`` as believed at ``recorded_time``."""
    return build_profile(await facts_q.as_of(conn, user_id, valid_time, recorded_time))
