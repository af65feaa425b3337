"""API keys: who may call the HTTP API, for which users.

A key belongs to one tenant and reaches only that tenant's users: those whose ``user_id``
starts with ``<tenant>:``. An operator key reaches every user and the operator routes
(status). Keys are random (``secrets``), shown once when made, and kept only as their SHA-256 in
``<home>/api-keys.json`` (mode 0600); a lost key is replaced, not recovered. A key may expire
(``expires_at``) and be revoked; either ends it at once, in every server reading the file (it is
read on each request). Each key is named by an id (the start of its hash) for listing and
revoking; the operator's actions are logged on ``memstream.api``.
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from memstream.schemas.errors import InvalidArgument

log = logging.getLogger("memstream.api")

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
        self._read: tuple | None = None  # (the file's stat, its keys) as last read

    def _keys(self) -> dict:
        """The file's keys, read again whenever it changed (a revoke in another process ends a key
        at the next request; a burst of requests does not read and parse it each time). Not to be
        changed: ``_load`` gives a copy."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._read = None
            return {}
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._read is None or self._read[0] != seen:
            self._read = (seen, json.loads(self.path.read_text()))
        return self._read[1]

    def _load(self) -> dict:
        return copy.deepcopy(self._keys())

    @contextlib.contextmanager
    def _changing(self):
        """The file's keys, to change and save under a lock of its own: a create and a revoke in
        two processes at once each read, change and write the file, and the last write won (a
        revoked key came back)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self._load()

    def _save(self, keys: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".api-keys-")
        with os.fdopen(fd, "w") as f:  # mkstemp made it 0600
            json.dump(keys, f, indent=2)
        os.replace(tmp, self.path)

    def create(self, name: str, *, tenant: str | None = None, expires_at: datetime | None = None) -> str:
        """A new key for ``tenant`` (None: an operator key), ending at ``expires_at`` if given;
        returns it, the only time it is shown."""
        if tenant is not None and not TENANT.fullmatch(tenant):
            raise InvalidArgument(f"a tenant is 1-63 of a-z, 0-9, '_' and '-', starting with a letter or digit, "
                                  f"not {tenant!r}")
        if expires_at is not None and (expires_at.tzinfo is None or expires_at <= datetime.now(timezone.utc)):
            raise InvalidArgument("expires_at must be a time in the future, with its offset")
        key = PREFIX + secrets.token_urlsafe(32)
        with self._changing() as keys:
            keys[_digest(key)] = {"name": name, "tenant": tenant, "created_at": datetime.now(timezone.utc).isoformat(),
                                  "expires_at": expires_at.isoformat() if expires_at else None, "revoked_at": None}
            self._save(keys)
        log.info("api key %s (%r, %s) created%s", _digest(key)[:ID_CHARS], name,
                 f"tenant {tenant}" if tenant else "operator", f", expires {expires_at.isoformat()}" if expires_at else "")
        return key

    def list(self) -> list[dict]:
        """Every key made, revoked and expired ones too, oldest first: its id, name, tenant (None:
        an operator's), when it was made, expires and was revoked, and whether it works now."""
        now = datetime.now(timezone.utc)
        out = [{"id": digest[:ID_CHARS], "name": k["name"], "tenant": k["tenant"], "created_at": k["created_at"],
                "expires_at": k.get("expires_at"), "revoked_at": k.get("revoked_at"), "active": _active(k, now)}
               for digest, k in self._load().items()]
        return sorted(out, key=lambda k: (k["created_at"], k["id"]))

    def revoke(self, key_id: str) -> dict:
        """End the key whose id is ``key_id`` (as ``list`` shows it), at once; returns it as listed."""
        with self._changing() as keys:
            found = [d for d in keys if d.startswith(key_id)] if len(key_id) >= 8 else []
            if len(found) != 1:
                raise InvalidArgument(f"no key {key_id!r}" if not found else f"{key_id!r} names {len(found)} keys")
            entry = keys[found[0]]
            if entry.get("revoked_at") is None:
                entry["revoked_at"] = datetime.now(timezone.utc).isoformat()
                self._save(keys)
                log.info("api key %s (%r) revoked", found[0][:ID_CHARS], entry["name"])
        return next(k for k in self.list() if k["id"] == found[0][:ID_CHARS])

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
        found = self._session.get(_digest(key)) or self._keys().get(_digest(key))
        if found is None or not _active(found, datetime.now(timezone.utc)):
            return None
        return Principal(found["name"], found["tenant"])


ID_CHARS = 12  # of the key's hash: names it in a listing, tells nothing of the key


def _active(entry: dict, now: datetime) -> bool:
    """Neither revoked nor expired."""
    if entry.get("revoked_at"):
        return False
    return entry.get("expires_at") is None or datetime.fromisoformat(entry["expires_at"]) > now
