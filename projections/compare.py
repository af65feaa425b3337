"""Row-for-row comparison of a projection table in two schemas (live vs rebuilt)."""
from __future__ import annotations

import asyncpg

from memstream.projections.schema_names import check_schema_name

# Tables each projection owns, compared on every column (generated ones included).
TABLES = {"episodes": ["episodes", "episode_passages", "episodes_terms", "forgotten_episodes"], "facts": ["memory_facts", "memory_facts_terms", "fact_refusals"],
          "graph": ["entities", "memory_edges"],
          "commands": ["reminders", "person_identities", "expert_identities", "fact_uses", "episode_uses"], "profile": ["profiles"]}


async def diff_counts(conn: asyncpg.Connection, a: str, b: str, table: str) -> tuple[int, int]:
    """(rows in a not in b, rows in b not in a), as multisets."""
    a, b = check_schema_name(a), check_schema_name(b)
    only_a = await conn.fetchval(f'SELECT count(*) FROM (SELECT * FROM "{a}".{table} EXCEPT ALL SELECT * FROM "{b}".{table}) d')
    only_b = await conn.fetchval(f'SELECT count(*) FROM (SELECT * FROM "{b}".{table} EXCEPT ALL SELECT * FROM "{a}".{table}) d')
    return only_a, only_b
