"""API keys: who may call the HTTP API, for which users.

A key belongs to one tenant and reaches only that tenant's users: those whose ``user_id``
starts with ``<tenant>:``. An operator key reaches every user and the operator routes
(status). Keys are random (``secrets``), shown once when made, and kept only as their SHA-256 in
``<home>/api-keys.json`` (mode 0600); a lost key is replaced, not recovered.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from memstream.schemas.errors import InvalidArgument

PREFIX = "msk_"
TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


@dataclass(frozen=True)
class Principal:
    """Who a request is: a tenant's key, or an operator's."""

    name: str
    tenant: str | None  # None: an operator

    @property
    def operator(self) -> bool:
        return self.tenant is None

    def reaches(self, user_id: str) -> bool:
        return self.operator or user_id.startswith(f"{self.tenant}:")


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeys:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._session: dict[str, dict] = {}  # keys of this process only (``session_key``)

    def _load(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}

    def create(self, name: str, *, tenant: str | None = None) -> str:
        """A new key for ``tenant`` (None: an operator key); returns it, the only time it is shown."""
        if tenant is not None and not TENANT.fullmatch(tenant):
            raise InvalidArgument(f"a tenant is 1-63 of a-z, 0-9, '_' and '-', starting with a letter or digit, "
                                  f"not {tenant!r}")
        key = PREFIX + secrets.token_urlsafe(32)
        keys = self._load()
        keys[_digest(key)] = {"name": name, "tenant": tenant, "created_at": datetime.now(timezone.utc).isoformat()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".api-keys-")
        with os.fdopen(fd, "w") as f:  # mkstemp made it 0600
            json.dump(keys, f, indent=2)
        os.replace(tmp, self.path)
        return key

    def session_key(self, name: str, *, tenant: str | None = None) -> str:
        """A key that lives as long as this object, written nowhere: for a sign-in link a local
        server prints (``memstream serve --demo``)."""
        key = PREFIX + secrets.token_urlsafe(32)
        self._session[_digest(key)] = {"name": name, "tenant": tenant}
        return key

    def principal(self, key: str | None) -> Principal | None:
        """Who holds ``key``, or None for no or an unknown key."""
        if not key or not key.startswith(PREFIX):
            return None
        found = self._session.get(_digest(key)) or self._load().get(_digest(key))
        return None if found is None else Principal(found["name"], found["tenant"])
