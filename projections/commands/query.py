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


async def person_identity(conn, user_id: str) -> dict[str, Any] | None:
    value = await conn.fetchval("SELECT attributes FROM person_identities WHERE user_id = $1", user_id)
    return json.loads(value) if isinstance(value, str) else value


async def expert_identity(conn, identity_id: str) -> dict[str, Any] | None:
    r = await conn.fetchrow("SELECT identity_id, name, instructions, attributes FROM expert_identities "
                            "WHERE identity_id = $1 AND NOT deleted", identity_id)
    if r is None:
        return None
    out = dict(r)
    out["attributes"] = json.loads(out["attributes"]) if isinstance(out["attributes"], str) else out["attributes"]
    return out


async def expert_identities(conn) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch(
        "SELECT identity_id, name FROM expert_identities WHERE NOT deleted ORDER BY identity_id")]
