"""Tier 1, the shell: rebuilt inside the facts projection's transaction; cached in Redis."""
from __future__ import annotations

import json
from typing import Iterable

from memstream.projections.profile.core import build_profile, profile_key


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
    profiles = {u: build_profile(facts) if facts else None for u, facts in by_user.items()}
    # A user without current facts has no profile row (a forgotten user leaves nothing behind).
    await conn.execute("DELETE FROM profiles WHERE user_id = ANY($1::text[])", [u for u, p in profiles.items() if p is None])
    await conn.executemany(
        "INSERT INTO profiles VALUES ($1, $2::jsonb, $3) ON CONFLICT (user_id) DO UPDATE "
        "SET profile = EXCLUDED.profile, facts = EXCLUDED.facts",
        [(u, json.dumps(p, sort_keys=True), len(by_user[u])) for u, p in profiles.items() if p is not None])
    return profiles


async def cache(redis, schema: str, epoch: int, profiles: dict[str, dict]) -> None:
    pipe = redis.pipeline(transaction=False)
    for user, profile in profiles.items():
        if profile is None:
            pipe.delete(profile_key(schema, epoch, user))
        else:
            pipe.set(profile_key(schema, epoch, user), json.dumps(profile, sort_keys=True))
    await pipe.execute()
