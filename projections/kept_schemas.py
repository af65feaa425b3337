"""The schemas a switch kept (``<live>_old_<n>``, for an undo) take a user's forget too: else
an undo, or anyone reading them, would bring back a person who asked to be forgotten."""
from __future__ import annotations

import logging
from collections.abc import Iterable

log = logging.getLogger("memstream.projections")


async def forget_users(conn, schema: str, users: Iterable[str]) -> int:
    """Delete ``users``' rows from every table with a ``user_id`` column of ``schema``'s kept
    schemas, in ``conn``'s transaction; returns how many rows went."""
    users = sorted(set(users))
    if not users:
        return 0
    tables = await conn.fetch(  # partitioned tables whole, not each partition again
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'user_id' AND NOT a.attisdropped "
        "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND starts_with(n.nspname, $1) "
        "AND substr(n.nspname, length($1) + 1) ~ '^[0-9]+$'", f"{schema}_old_")
    gone = 0
    for t in tables:
        done = await conn.execute(f'DELETE FROM "{t["nspname"]}"."{t["relname"]}" WHERE user_id = ANY($1::text[])',
                                  users)
        gone += int(done.split()[-1])
    if gone:
        log.info("forgotten users' rows deleted from kept schemas: %d", gone)
    return gone
