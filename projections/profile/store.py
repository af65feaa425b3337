"""Tier 1, the shell: rebuilt inside the facts projection's transaction; cached in Redis."""
from __future__ import annotations

import json
from typing import Iterable

from memstream.projections.profile.core import build_profile


async def refresh(conn, user_ids: Iterable[str]) -> dict[str, dict]:
    """Rebuild the profiles of ``user_ids`` from their current facts; returns them."""
    users = sorted(set(user_ids))
    if not users:
        return {}
    rows = await conn.fetch(
        "SELECT user_id, attribute, value, text, category, observation_count, recorded_at FROM memory_facts "
        "WHERE user_id = ANY($1::text[]) AND status = 'current'", users)
    by_user: dict[str, list] = {u: [] for u in users}
    for r in rows:
        by_user[r["user_id"]].append(r)
    profiles = {u: build_profile(facts) for u, facts in by_user.items()}
    await conn.executemany(
        "INSERT INTO profiles VALUES ($1, $2::jsonb, $3) ON CONFLICT (user_id) DO UPDATE "
        "SET profile = EXCLUDED.profile, facts = EXCLUDED.facts",
        [(u, json.dumps(p, sort_keys=True), len(by_user[u])) for u, p in profiles.items()])
    return profiles


def profile_key(schema: str, epoch: int, user_id: str) -> str:
    return f"memstream:{schema}:e{epoch}:t1:{len(user_id)}:{user_id}"


async def cache(redis, schema: str, epoch: int, profiles: dict[str, dict]) -> None:
    pipe = redis.pipeline(transaction=False)
    for user, profile in profiles.items():
        pipe.set(profile_key(schema, epoch, user), json.dumps(profile, sort_keys=True))
    await pipe.execute()


async def read(redis, pool, schema: str, epoch: int, user_id: str) -> dict:
    """O(1): one Redis GET; on a miss, one Postgres row (written back to the cache)."""
    if redis is not None:
        cached = await redis.get(profile_key(schema, epoch, user_id))
        if cached is not None:
            return json.loads(cached)
    value = await pool.fetchval("SELECT profile FROM profiles WHERE user_id = $1", user_id)
    profile = (json.loads(value) if isinstance(value, str) else value) or {}
    if redis is not None and value is not None:
        await redis.set(profile_key(schema, epoch, user_id), json.dumps(profile, sort_keys=True))
    return profile
