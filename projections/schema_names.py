"""The Postgres schemas memstream may own."""
from __future__ import annotations

import re

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(name: str) -> str:
    """A Postgres schema memstream may own: a plain lower-case identifier, never ``public``."""
    if not _SCHEMA.match(name) or name == "public" or name.startswith("pg_"):
        raise ValueError(
            f"invalid Postgres schema {name!r}: use a lower-case identifier "
            "(letters, digits, _), not 'public' or 'pg_*'"
        )
    return name
