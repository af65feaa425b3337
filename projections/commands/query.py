"""Commands, the query side: due reminders and identities."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any


async def due_reminders(conn, user_id: str, now: datetime) -> list[dict[str, Any]]:
    """Pending reminders whose time has come, oldest first — whatever the message."""
    rows = await conn.fetch(
        "SELECT reminder_id, text, due_at FROM reminders WHERE user_id = $1 AND status = 'pending' AND due_at <= $2 "
        "ORDER BY due_at, reminder_id", user_id, now)
    return [dict(r) for r in rows]


async def due_reminders_as_of(conn, user_id: str, at: datetime) -> list[dict[str, Any]]:
    """The reminders that were due and still pending at ``at`` (in world time: a reminder keeps
    when it was scheduled and resolved, not when that was recorded)."""
    rows = await conn.fetch(
        "SELECT reminder_id, text, due_at FROM reminders WHERE user_id = $1 AND scheduled_at <= $2 AND due_at <= $2 "
        "AND (resolved_at IS NULL OR resolved_at > $2) ORDER BY due_at, reminder_id", user_id, at)
    return [dict(r) for r in rows]


async def person_identity_as_of(conn, user_id: str, at: datetime) -> dict[str, Any] | None:
    """The person identity as set by ``at``; None when it was set (or set again) later: one
    version is kept, not its history."""
    value = await conn.fetchval("SELECT attributes FROM person_identities WHERE user_id = $1 AND updated_at <= $2",
                                user_id, at)
    return json.loads(value) if isinstance(value, str) else value


async def person_identity(conn, user_id: str) -> dict[str, Any] | None:
    value = await conn.fetchval("SELECT attributes FROM person_identities WHERE user_id = $1", user_id)
    return json.loads(value) if isinstance(value, str) else value


async def expert_identity(conn, identity_id: str, at: datetime | None = None) -> dict[str, Any] | None:
    """The expert identity; ``at``: as set by then (None if set again, or deleted, since: one
    version is kept)."""
    r = await conn.fetchrow("SELECT identity_id, name, instructions, attributes FROM expert_identities "
                            "WHERE identity_id = $1 AND NOT deleted AND ($2::timestamptz IS NULL OR updated_at <= $2)",
                            identity_id, at)
    if r is None:
        return None
    out = dict(r)
    out["attributes"] = json.loads(out["attributes"]) if isinstance(out["attributes"], str) else out["attributes"]
    return out


async def expert_identities(conn) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch(
        "SELECT identity_id, name FROM expert_identities WHERE NOT deleted ORDER BY identity_id")]
