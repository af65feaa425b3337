"""Commands, the asyncpg shell."""
from __future__ import annotations

import json
from typing import Sequence

import asyncpg

from memstream.projections import positions as pos
from memstream.projections.db import fetch_by_keys
from memstream.projections.commands.core import (ExpertIdentityGone, ExpertIdentityRow, Used, Logged,
                                                 PersonIdentityRow,
                                                 ReminderRow, Row, UserGone, apply, reminder_key,
                                                 reminder_targets)


REMINDER_COLUMNS = tuple(ReminderRow.__dataclass_fields__)


async def _load_reminders(conn, keys) -> dict:
    rows = await fetch_by_keys(conn, "reminders", REMINDER_COLUMNS, "reminder_id", keys)
    return {reminder_key(row): row for row in (ReminderRow(**dict(r)) for r in rows)}


async def _write(conn, row: Row) -> None:
    if isinstance(row, ReminderRow):
        await conn.execute(
            """INSERT INTO reminders VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
               ON CONFLICT (user_id, reminder_id) DO UPDATE SET status = EXCLUDED.status, resolved_at = EXCLUDED.resolved_at""",
            row.reminder_id, row.user_id, row.text, row.due_at, row.status, row.scheduled_at, row.resolved_at,
            row.source_event_id)
    elif isinstance(row, PersonIdentityRow):
        await conn.execute(
            f"""INSERT INTO person_identities AS t (user_id, attributes, updated_at, source_event_id, source_offset)
                VALUES ($1, $2::jsonb, $3, $4, $5) ON CONFLICT (user_id) DO UPDATE
                SET attributes = EXCLUDED.attributes, updated_at = EXCLUDED.updated_at,
                    source_event_id = EXCLUDED.source_event_id, source_offset = EXCLUDED.source_offset
                WHERE {_NEWER}""",
            row.user_id, json.dumps(row.attributes, sort_keys=True), row.updated_at, row.source_event_id,
            row.source_offset)
    elif isinstance(row, ExpertIdentityRow):
        await _expert(conn, row.identity_id, row.name, row.instructions,
                      None if row.attributes is None else json.dumps(row.attributes, sort_keys=True), row.updated_at,
                      row.source_event_id, row.source_offset, False)
    elif isinstance(row, UserGone):
        await conn.execute("DELETE FROM reminders WHERE user_id = $1", row.user_id)
        await conn.execute("DELETE FROM person_identities WHERE user_id = $1", row.user_id)
        await conn.execute("DELETE FROM fact_uses WHERE user_id = $1", row.user_id)
        await conn.execute("DELETE FROM episode_uses WHERE user_id = $1", row.user_id)
    elif isinstance(row, Used):
        # Ids the user does not hold are counted too, harmlessly: the sweep reads uses of its own memories only.
        for table, key, ids in (("fact_uses", "fact_id", row.fact_ids), ("episode_uses", "episode_id", row.episode_ids)):
            if ids:
                await conn.execute(_COUNTED.format(table=table, key=key), row.user_id, list(ids), row.used_at,
                                   row.source_offset)
    elif isinstance(row, ExpertIdentityGone):
        # A tombstone, text blanked: an older upsert applied again must not bring the persona back.
        await _expert(conn, row.identity_id, "", "", None, row.updated_at, row.source_event_id, row.source_offset, True)


_COUNTED = """INSERT INTO {table} AS t (user_id, {key}, uses, last_used_at, source_offset)
SELECT $1, m, 1, $3, $4 FROM unnest($2::uuid[]) m ON CONFLICT (user_id, {key}) DO UPDATE
SET uses = t.uses + 1, last_used_at = greatest(t.last_used_at, EXCLUDED.last_used_at),
    source_offset = EXCLUDED.source_offset
WHERE EXCLUDED.source_offset > t.source_offset"""

# The latest statement on the log wins, in whatever order statements are applied: a redelivered
# older one changes nothing.
_NEWER = "EXCLUDED.source_offset >= t.source_offset"


async def _expert(conn, *values) -> None:
    await conn.execute(
        f"""INSERT INTO expert_identities AS t (identity_id, name, instructions, attributes, updated_at, source_event_id,
                                                 source_offset, deleted)
            VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8) ON CONFLICT (identity_id) DO UPDATE
            SET name = EXCLUDED.name, instructions = EXCLUDED.instructions, attributes = EXCLUDED.attributes,
                updated_at = EXCLUDED.updated_at, source_event_id = EXCLUDED.source_event_id,
                source_offset = EXCLUDED.source_offset, deleted = EXCLUDED.deleted
            WHERE {_NEWER}""", *values)


class CommandStore:
    name = "commands"

    async def apply_batch(self, conn: asyncpg.Connection, events: Sequence[Logged], positions: pos.Positions) -> None:
        async with conn.transaction():
            state = await _load_reminders(conn, [t for e in events for t in reminder_targets(e)])
            for e in events:
                for row in apply(state, e):
                    if isinstance(row, ReminderRow):
                        state[reminder_key(row)] = row
                    elif isinstance(row, UserGone):
                        state = {k: r for k, r in state.items() if r.user_id != row.user_id}
                    await _write(conn, row)
            await pos.save(conn, self.name, positions)
