from __future__ import annotations

from datetime import datetime, timedelta, timezone

import asyncpg

from memstream.schemas import TurnRecorded

BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def turns(n: int, users: int = 5, prefix: str = "t") -> list[TurnRecorded]:
    return [
        TurnRecorded.new(
            user_id=f"{prefix}-user-{i % users}", conversation_id=f"conv-{i % users}-{i // (users * 10)}",
            user_message=f"message {i}: I mentioned topic number {i} and my cat Miso",
            assistant_message=f"noted {i}", occurred_at=BASE + timedelta(minutes=i),
        )
        for i in range(n)
    ]


async def schemas_named(dsn: str, prefix: str) -> set[str]:
    """The Postgres schemas whose names start with ``prefix`` (a command's own, to see it dropped)."""
    conn = await asyncpg.connect(dsn)
    try:
        return {r["nspname"] for r in await conn.fetch("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)",
                                                       prefix)}
    finally:
        await conn.close()
