"""Per-user data keys: seal and open a user's content with AES-256-GCM under a key of their own,
and destroy it to forget them.

A sealed blob is ``b"ms1" | generation (4 bytes) | nonce (12) | ciphertext``; the user id and a
context (which record field it is) are authenticated with it, so a blob cannot be moved to
another user or field. Data keys are created on first use, kept wrapped by the ``Kek`` in a
``WrappedKeys`` store, and unwrapped into memory only while in use. ``destroy`` ends the user's
current generation: blobs sealed under it open as ``Shredded`` from then on, anywhere — and a
user who comes back gets a new generation, never the old key. The store holds no user id, only
its SHA-256.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import struct
import time
from collections import OrderedDict
from typing import Protocol, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.schemas.errors import MemstreamError
from memstream.sealing.kek import Kek

MAGIC = b"ms1"
_HEAD = struct.Struct(">3sI12s")


class Shredded(MemstreamError):
    """Sealed with a data key that was destroyed (the user was forgotten): gone, by design."""


class NotSealed(MemstreamError, ValueError):
    """The bytes are not a sealed blob (or were damaged)."""


class WrongKek(MemstreamError):
    """The data keys were wrapped by another key-encryption key than this process has (a host
    started with another ``MEMSTREAM_HOME``, a KEK file replaced): nothing opens, and retrying
    will not help — fix the deployment."""


def user_key(user_id: str) -> bytes:
    return hashlib.sha256(user_id.encode()).digest()


class WrappedKeys(Protocol):
    """Where wrapped data keys live: the one state the log cannot rebuild (back it up).

    ``current(user)``: ``(generation, kek_id, wrapped)`` of the user's live key, or None.
    ``create(user, kek_id, wrapped)``: makes ``wrapped`` the user's live key under the next
    generation unless another caller made one first; returns the live one either way.
    ``destroy(user, generation)``: the user has no live key from now on (when ``generation`` is
    given: only if it is the live one); a generation is never reused.
    ``stamp(user, forget, at)``: the generation the forget ``forget`` (its 16-byte event id) ends —
    the live one (0: none) the first time it is asked, the same ever after, so a forget sealed
    again (a retried append, a restarted ingress) never ends a key the user got after it; ``at``
    (Unix seconds, default the store's clock) is when it was said, kept from the first time too.
    ``last_forgets(users)``: when each of ``users`` that has one said their last forget.
    ``holds_keys()``: whether any key was ever stored.
    ``user`` is ``user_key(user_id)``."""

    async def current(self, user: bytes) -> tuple[int, str, bytes] | None: ...

    async def create(self, user: bytes, kek_id: str, wrapped: bytes) -> tuple[int, str, bytes]: ...

    async def destroy(self, user: bytes, generation: int | None = None) -> None: ...

    async def stamp(self, user: bytes, forget: bytes, at: float | None = None) -> int: ...

    async def last_forgets(self, users: Sequence[bytes]) -> dict[bytes, float]: ...

    async def holds_keys(self) -> bool: ...


class MemoryWrappedKeys:
    """A process's own store (tests, one-off tools): lost with the process."""

    def __init__(self) -> None:
        self._live: dict[bytes, tuple[int, str, bytes]] = {}
        self._last: dict[bytes, int] = {}
        self._stamps: dict[bytes, int] = {}
        self._stamped_at: dict[bytes, float] = {}

    async def current(self, user: bytes):
        return self._live.get(user)

    async def create(self, user: bytes, kek_id: str, wrapped: bytes):
        if user not in self._live:
            self._last[user] = self._last.get(user, 0) + 1
            self._live[user] = (self._last[user], kek_id, wrapped)
        return self._live[user]

    async def destroy(self, user: bytes, generation: int | None = None) -> None:
        if user in self._live and generation in (None, self._live[user][0]):
            del self._live[user]

    async def stamp(self, user: bytes, forget: bytes, at: float | None = None) -> int:
        if forget not in self._stamps:
            self._stamped_at[user] = max(self._stamped_at.get(user, 0.0), time.time() if at is None else at)
        return self._stamps.setdefault(forget, self._live[user][0] if user in self._live else 0)

    async def last_forgets(self, users: Sequence[bytes]) -> dict[bytes, float]:
        return {u: self._stamped_at[u] for u in users if u in self._stamped_at}

    async def holds_keys(self) -> bool:
        return bool(self._last)


class PostgresWrappedKeys:
    """Wrapped keys in a table of their own schema (never a projection's: those are rebuilt
    from the log, this cannot be). ``migrate`` creates it."""

    def __init__(self, pool, schema: str = "memstream_keys"):
        from memstream.projections.schema_names import check_schema_name

        self._pool, self._schema = pool, check_schema_name(schema)

    async def migrate(self) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            # Every process migrates on start: IF NOT EXISTS alone races on the catalog.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"memstream-keys:{self._schema}")
            await conn.execute(
                f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"; '
                f'CREATE TABLE IF NOT EXISTS "{self._schema}".data_keys (user_key bytea PRIMARY KEY, '
                "generation int NOT NULL, kek_id text NOT NULL, wrapped bytea, "
                "created_at timestamptz NOT NULL DEFAULT now(), destroyed_at timestamptz); "
                f'CREATE TABLE IF NOT EXISTS "{self._schema}".forgets (forget bytea PRIMARY KEY, '
                "user_key bytea NOT NULL, generation int NOT NULL, stamped_at timestamptz NOT NULL DEFAULT now())")

    async def current(self, user: bytes):
        r = await self._pool.fetchrow(f'SELECT generation, kek_id, wrapped FROM "{self._schema}".data_keys '
                                      "WHERE user_key = $1 AND wrapped IS NOT NULL", user)
        return None if r is None else (r["generation"], r["kek_id"], bytes(r["wrapped"]))

    async def create(self, user: bytes, kek_id: str, wrapped: bytes):
        await self._pool.execute(
            f'INSERT INTO "{self._schema}".data_keys AS k (user_key, generation, kek_id, wrapped) '
            "VALUES ($1, 1, $2, $3) ON CONFLICT (user_key) DO UPDATE SET generation = k.generation + 1, "
            "kek_id = EXCLUDED.kek_id, wrapped = EXCLUDED.wrapped, created_at = now(), destroyed_at = NULL "
            "WHERE k.wrapped IS NULL", user, kek_id, wrapped)
        return await self.current(user)

    async def destroy(self, user: bytes, generation: int | None = None) -> None:
        await self._pool.execute(f'UPDATE "{self._schema}".data_keys SET wrapped = NULL, destroyed_at = now() '
                                 "WHERE user_key = $1 AND wrapped IS NOT NULL AND ($2::int IS NULL OR generation = $2)",
                                 user, generation)

    async def stamp(self, user: bytes, forget: bytes, at: float | None = None) -> int:
        k = f'"{self._schema}"'
        found = await self._pool.fetchval(
            f"WITH live AS (SELECT coalesce((SELECT generation FROM {k}.data_keys WHERE user_key = $1 "
            f"AND wrapped IS NOT NULL), 0) AS g), made AS (INSERT INTO {k}.forgets (forget, user_key, generation, "
            "stamped_at) SELECT $2, $1, g, coalesce(to_timestamp($3::float8), now()) FROM live "
            "ON CONFLICT (forget) DO NOTHING RETURNING generation) "
            f"SELECT generation FROM made UNION ALL SELECT generation FROM {k}.forgets WHERE forget = $2 LIMIT 1",
            user, forget, at)
        if found is None:  # stamped by another process since this statement began
            found = await self._pool.fetchval(f"SELECT generation FROM {k}.forgets WHERE forget = $1", forget)
        return found

    async def last_forgets(self, users: Sequence[bytes]) -> dict[bytes, float]:
        rows = await self._pool.fetch(f'SELECT user_key, extract(epoch FROM max(stamped_at))::float8 AS at '
                                      f'FROM "{self._schema}".forgets WHERE user_key = ANY($1::bytea[]) GROUP BY user_key',
                                      list(users))
        return {bytes(r["user_key"]): r["at"] for r in rows}

    async def holds_keys(self) -> bool:
        return await self._pool.fetchval(f'SELECT EXISTS (SELECT FROM "{self._schema}".data_keys)')


def generation_of(sealed: bytes) -> int:
    """The key generation a sealed blob was sealed under (readable without any key)."""
    if len(sealed) < _HEAD.size or sealed[:3] != MAGIC:
        raise NotSealed("not a sealed blob")
    return _HEAD.unpack_from(sealed)[1]


class DataKeys:
    """Seals and opens users' content. Unwrapped keys are kept for the ``keep`` most recent
    users; ``destroy`` drops the user's from memory too. Another process may destroy a key this
    one holds: sealing asks the store again after ``fresh_s`` seconds, so what is sealed under
    a key destroyed elsewhere is at most that old (opening needs no such check: a record is
    opened once, in log order, and the forget that ends its key comes after it)."""

    def __init__(self, kek: Kek, store: WrappedKeys, keep: int = 10_000, fresh_s: float = 5.0):
        self._kek, self._store, self._keep, self._fresh_s = kek, store, keep, fresh_s
        self._keys: OrderedDict[bytes, tuple[int, AESGCM, float]] = OrderedDict()
        self._locks: dict[bytes, asyncio.Lock] = {}  # per user: one user's key lookups never wait on another's

    def _lock(self, user: bytes) -> asyncio.Lock:
        return self._locks.setdefault(user, asyncio.Lock())

    async def _live(self, user_id: str, create: bool, newer_than: int = 0) -> tuple[int, AESGCM] | None:
        """The user's live key: the one held, unless it is stale for sealing (``create``) or
        older than generation ``newer_than`` + 1 (a record sealed after the user came back)."""
        user = user_key(user_id)
        if (held := self._keys.get(user)) is not None and held[0] > newer_than and (
                not create or time.monotonic() - held[2] < self._fresh_s):
            self._keys.move_to_end(user)
            return held[:2]
        async with self._lock(user):
            found = await self._store.current(user)
            if found is None and create:
                # A KMS key-encryption key is a network call: never on the event loop.
                wrapped = await asyncio.to_thread(self._kek.wrap, AESGCM.generate_key(256), user_id)
                found = await self._store.create(user, self._kek.kek_id, wrapped)
            if found is None:
                self._keys.pop(user, None)
                return None
            generation, kek_id, wrapped = found
            if kek_id != self._kek.kek_id:
                raise WrongKek(f"a data key of this user is wrapped by {kek_id}, this process has {self._kek.kek_id}: "
                               "every process of a deployment needs the same key-encryption key")
            if held is not None and held[0] == generation:
                live = held[0], held[1], time.monotonic()
            else:
                live = generation, AESGCM(await asyncio.to_thread(self._kek.unwrap, wrapped, user_id)), time.monotonic()
            self._keys[user] = live
            while len(self._keys) > self._keep:
                self._keys.popitem(last=False)
            return live[:2]

    async def generation(self, user_id: str) -> int:
        """The user's live key generation, 0 when they have none (a forget then ends nothing)."""
        found = await self._store.current(user_key(user_id))
        return 0 if found is None else found[0]

    async def stamp(self, user_id: str, forget: bytes, at: float | None = None) -> int:
        """The key generation the forget with event id ``forget`` ends (``WrappedKeys.stamp``)."""
        return await self._store.stamp(user_key(user_id), forget, at)

    async def last_forgets(self, user_ids) -> dict[str, float]:
        """When each of ``user_ids`` that has one was last forgotten (``WrappedKeys.last_forgets``)."""
        by_key = {user_key(u): u for u in user_ids}
        return {by_key[k]: at for k, at in (await self._store.last_forgets(list(by_key))).items()}

    async def seal(self, user_id: str, plaintext: bytes, context: str, generation: int | None = None) -> bytes:
        """Seal under the user's live key (made on first use); under ``generation`` only, when
        given — ``Shredded`` if that is no longer the live one (content derived from a record
        sealed under it is never sealed again under a newer key)."""
        found = await self._live(user_id, create=generation is None, newer_than=(generation or 1) - 1)
        if found is None or generation not in (None, found[0]):
            raise Shredded(f"generation {generation} is no longer the user's live key")
        generation, aead = found
        nonce = os.urandom(12)
        return _HEAD.pack(MAGIC, generation, nonce) + aead.encrypt(nonce, plaintext, _aad(user_id, context))

    async def open(self, user_id: str, sealed: bytes, context: str) -> bytes:
        generation = generation_of(sealed)
        nonce = sealed[7:_HEAD.size]
        live = await self._live(user_id, create=False, newer_than=generation - 1)
        if live is None or live[0] != generation:
            raise Shredded(f"sealed under a destroyed data key (generation {generation})")
        try:
            return live[1].decrypt(nonce, sealed[_HEAD.size:], _aad(user_id, context))
        except InvalidTag:
            raise NotSealed("the blob does not open for this user and field (damaged, or moved)") from None

    def drop(self, user_id: str, generation: int) -> None:
        """Let go of the user's key ``generation`` held in memory (the store keeps it)."""
        user = user_key(user_id)
        if (held := self._keys.get(user)) is not None and held[0] <= generation:
            del self._keys[user]

    async def destroy(self, user_id: str, generation: int | None = None) -> None:
        """End the user's live key (only ``generation``, when given: a forget applied twice, or
        after the user came back, must not end the key of what they said since)."""
        user = user_key(user_id)
        async with self._lock(user):
            await self._store.destroy(user, generation)
            if (held := self._keys.get(user)) is not None and generation in (None, held[0]):
                del self._keys[user]


def _aad(user_id: str, context: str) -> bytes:
    return len(user_id).to_bytes(4, "big") + user_id.encode() + context.encode()
