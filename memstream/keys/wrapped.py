"""Where wrapped data keys live: the ``WrappedKeys`` contract and its two stores, in memory (tests,
single processes) and in Postgres (the key store's own schema, apart from the projections: a
rebuild never touches it). The one state the log cannot rebuild: back it up."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Protocol, Sequence
import logging

from memstream.keys.kek import KekRefused

log = logging.getLogger("memstream.keys")


@dataclasses.dataclass(frozen=True)
class WrappedKey:
    """A data key as stored, for a rotation: wrapped under ``kek_id``, bound to the user's digest
    or, when ``bound_to_user``, to the user id (before the digest was keyed)."""

    user: bytes
    generation: int
    kek_id: str
    wrapped: bytes
    bound_to_user: bool


class WrappedKeys(Protocol):
    """Where wrapped data keys live: the one state the log cannot rebuild (back it up).

    ``current(user)``: ``(generation, kek_id, wrapped)`` of the user's live key, or None.
    ``key(user, generation)``: ``(kek_id, wrapped)`` of that generation while it is not
    destroyed (live or retired), else None.
    ``create(user, kek_id, wrapped)``: makes ``wrapped`` the user's live key under the next
    generation unless another caller made one first; returns the live one either way (None only
    when a forget retired it meanwhile: ask again).
    ``destroy(user, generation)``: destroys that generation and every older one (None: every key
    the user has).
    ``stamp(user, forget, at)``: the generation the user's forget ``forget`` (its 16-byte event id:
    unique per user, not across users) is of —
    the first time it is asked, the newest not destroyed (the live one, which it retires, or one a
    forget retired before: that forget may never have reached the log; 0: none), the same ever
    after, so a forget sealed again (a retried append, a restarted ingress) never covers a key the
    user got after it; ``at`` (Unix seconds, default the store's clock) is when it was said, kept
    from the first time too.
    ``last_forgets(users)``: when each of ``users`` that has one said their last forget.
    ``holds_keys()``: whether any key was ever stored.
    ``user`` is ``digest(secret, user_id)``.

    The digest secret: ``secret()`` is ``(kek_id, wrapped)`` or None; ``adopt_secret(kek_id,
    wrapped, rekey)`` stores it unless one is, first re-keying every row named by ``user_key``
    to ``rekey(that)``, and returns the stored one.

    Rotation: ``rotating()``: an async context held by one rotation at a time (another waits);
    ``refuse(kek_ids)``: no key is created under them from then on (``create`` raises
    ``KekRefused``: wrap again); ``refused()``: every id refused so far; ``stale(kek_id, limit,
    after)``: up to ``limit`` keys not destroyed that are wrapped under another KEK or bound to
    the user id, in (user, generation) order after ``after``; ``rewrapped(key, kek_id, wrapped)`` stores
    ``key`` wrapped again (bound to the digest) unless it changed meanwhile (destroyed);
    ``rewrap_secret(old_kek_id, kek_id, wrapped)`` likewise for the secret; ``vacuum()`` leaves
    no copy of a destroyed or replaced key in the store's own files.

    ``sealing_since()``: when the first data key was made (Unix seconds; None: never) — from
    then on the deployment seals its records."""

    async def current(self, user: bytes) -> tuple[int, str, bytes] | None: ...

    async def key(self, user: bytes, generation: int) -> tuple[str, bytes] | None: ...

    async def create(self, user: bytes, kek_id: str, wrapped: bytes) -> tuple[int, str, bytes] | None: ...

    async def destroy(self, user: bytes, generation: int | None = None) -> None: ...

    async def stamp(self, user: bytes, forget: bytes, at: float | None = None) -> int: ...

    async def stamped(self, user: bytes, forget: bytes) -> int | None:
        """The generation ``stamp`` gave the forget, without stamping it (None: never stamped)."""
        ...

    async def last_forgets(self, users: Sequence[bytes]) -> dict[bytes, float]: ...

    async def holds_keys(self) -> bool: ...

    async def secret(self) -> tuple[str, bytes] | None: ...

    async def adopt_secret(self, kek_id: str, wrapped: bytes, rekey) -> tuple[str, bytes]: ...

    def rotating(self): ...

    async def refuse(self, kek_ids: Sequence[str]) -> None: ...

    async def refused(self) -> list[str]: ...

    async def stale(self, kek_id: str, limit: int, after: tuple[bytes, int] | None = None) -> list[WrappedKey]: ...

    async def rewrapped(self, key: WrappedKey, kek_id: str, wrapped: bytes) -> bool: ...

    async def rewrap_secret(self, old_kek_id: str, kek_id: str, wrapped: bytes) -> bool: ...

    async def vacuum(self) -> None: ...

    async def sealing_since(self) -> float | None: ...


class MemoryWrappedKeys:
    """A process's own store (tests, one-off tools): lost with the process."""

    def __init__(self) -> None:
        self._keys: dict[tuple[bytes, int], tuple[str, bytes]] = {}  # not destroyed
        self._live: dict[bytes, int] = {}
        self._last: dict[bytes, int] = {}
        self._stamps: dict[tuple[bytes, bytes], int] = {}  # (user, forget) -> generation
        self._stamped_at: dict[bytes, float] = {}
        self._secret: tuple[str, bytes] | None = None
        self._refused: set[str] = set()
        self._by_user: set[tuple[bytes, int]] = set()  # keys bound to the user id
        self._first: float | None = None
        self._rotation = asyncio.Lock()

    async def current(self, user: bytes):
        return None if (g := self._live.get(user)) is None else (g, *self._keys[user, g])

    async def key(self, user: bytes, generation: int):
        return self._keys.get((user, generation))

    async def create(self, user: bytes, kek_id: str, wrapped: bytes):
        if kek_id in self._refused:
            raise KekRefused(f"{kek_id} was retired by a rotation")
        if user not in self._live:
            self._first = self._first or time.time()
            self._last[user] = g = self._last.get(user, 0) + 1
            self._live[user], self._keys[user, g] = g, (kek_id, wrapped)
        return await self.current(user)

    async def destroy(self, user: bytes, generation: int | None = None) -> None:
        for u, g in [k for k in self._keys if k[0] == user and (generation is None or k[1] <= generation)]:
            del self._keys[u, g]
            if self._live.get(user) == g:
                del self._live[user]

    async def stamp(self, user: bytes, forget: bytes, at: float | None = None) -> int:
        if (user, forget) not in self._stamps:
            self._stamped_at[user] = max(self._stamped_at.get(user, 0.0), time.time() if at is None else at)
            self._live.pop(user, None)
            self._stamps[user, forget] = max((g for u, g in self._keys if u == user), default=0)
        return self._stamps[user, forget]

    async def stamped(self, user: bytes, forget: bytes) -> int | None:
        return self._stamps.get((user, forget))

    async def last_forgets(self, users: Sequence[bytes]) -> dict[bytes, float]:
        return {u: self._stamped_at[u] for u in users if u in self._stamped_at}

    async def holds_keys(self) -> bool:
        return bool(self._last)

    async def secret(self):
        return self._secret

    async def adopt_secret(self, kek_id: str, wrapped: bytes, rekey):
        if self._secret is None:
            if self._last:  # a store from before the keyed digest: bound to user ids
                self._keys = {(rekey(u), g): v for (u, g), v in self._keys.items()}
                self._by_user = set(self._keys)
                self._live = {rekey(u): g for u, g in self._live.items()}
                self._last = {rekey(u): g for u, g in self._last.items()}
                self._stamps = {(rekey(u), f): g for (u, f), g in self._stamps.items()}
                self._stamped_at = {rekey(u): t for u, t in self._stamped_at.items()}
            self._secret = kek_id, wrapped
        return self._secret

    def rotating(self):
        return self._rotation

    async def refuse(self, kek_ids) -> None:
        self._refused.update(kek_ids)

    async def refused(self) -> list[str]:
        return sorted(self._refused)

    async def stale(self, kek_id: str, limit: int, after: tuple[bytes, int] | None = None) -> list[WrappedKey]:
        return [WrappedKey(u, g, k, w, (u, g) in self._by_user) for (u, g), (k, w) in sorted(self._keys.items())
                if (after is None or (u, g) > after) and (k != kek_id or (u, g) in self._by_user)][:limit]

    async def rewrapped(self, key: WrappedKey, kek_id: str, wrapped: bytes) -> bool:
        if self._keys.get((key.user, key.generation)) != (key.kek_id, key.wrapped) or kek_id in self._refused:
            return False
        self._keys[key.user, key.generation] = kek_id, wrapped
        self._by_user.discard((key.user, key.generation))
        return True

    async def rewrap_secret(self, old_kek_id: str, kek_id: str, wrapped: bytes) -> bool:
        if self._secret is None or self._secret[0] != old_kek_id:
            return False
        self._secret = kek_id, wrapped
        return True

    async def vacuum(self) -> None:
        pass

    async def sealing_since(self) -> float | None:
        return self._first


class PostgresWrappedKeys:
    """Wrapped keys in a table of their own schema (never a projection's: those are rebuilt
    from the log, this cannot be). ``migrate`` creates it, or brings an older one up to date
    in place (one row per user and generation, and a key's retirement)."""

    def __init__(self, pool, schema: str = "memstream_keys"):
        from memstream.projections.schema_names import check_schema_name

        self._pool, self._schema = pool, check_schema_name(schema)
        self._k = f'"{self._schema}"'

    async def migrate(self) -> None:
        k = self._k
        async with self._pool.acquire() as conn, conn.transaction():
            # Every process migrates on start: IF NOT EXISTS alone races on the catalog.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"memstream-keys:{self._schema}")
            await conn.execute(
                f"CREATE SCHEMA IF NOT EXISTS {k}; "
                f"CREATE TABLE IF NOT EXISTS {k}.data_keys (user_key bytea NOT NULL, generation int NOT NULL, "
                "kek_id text NOT NULL, wrapped bytea, created_at timestamptz NOT NULL DEFAULT now(), "
                "retired_at timestamptz, destroyed_at timestamptz, PRIMARY KEY (user_key, generation)); "
                f"CREATE TABLE IF NOT EXISTS {k}.forgets (forget bytea NOT NULL, "
                "user_key bytea NOT NULL, generation int NOT NULL, stamped_at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (user_key, forget))")
            # A forget is its user's and its id together: event ids are unique per user only, and
            # keyed by the id alone, a second user's forget took the first one's generation.
            by_forget = await conn.fetchval(
                "SELECT c.conname FROM pg_constraint c WHERE c.conrelid = $1::regclass AND c.contype = 'p' "
                "AND array_length(c.conkey, 1) = 1", f"{k}.forgets")
            if by_forget:
                await conn.execute(f'ALTER TABLE {k}.forgets DROP CONSTRAINT "{by_forget}", '
                                   "ADD PRIMARY KEY (user_key, forget)")
            # Before retirement a user had one row, keyed by the user alone. Looked up first: an
            # ALTER, even one with nothing to do, waits for every reader of the table (a backup).
            old = await conn.fetchrow(
                "SELECT c.conname, array_length(c.conkey, 1) = 1 AS by_user, NOT EXISTS (SELECT FROM pg_attribute "
                "WHERE attrelid = c.conrelid AND attname = 'retired_at' AND NOT attisdropped) AS unretiring "
                "FROM pg_constraint c WHERE c.conrelid = $1::regclass AND c.contype = 'p'", f"{k}.data_keys")
            if old["by_user"] or old["unretiring"]:
                await conn.execute(f"ALTER TABLE {k}.data_keys ADD COLUMN IF NOT EXISTS retired_at timestamptz")
                # A forget stamped that formation has not applied yet: its key seals nothing new.
                await conn.execute(f"UPDATE {k}.data_keys d SET retired_at = f.stamped_at FROM {k}.forgets f "
                                   "WHERE f.user_key = d.user_key AND f.generation = d.generation "
                                   "AND d.wrapped IS NOT NULL AND d.retired_at IS NULL")
            if old["by_user"]:
                await conn.execute(f'ALTER TABLE {k}.data_keys DROP CONSTRAINT "{old["conname"]}", '
                                   "ADD PRIMARY KEY (user_key, generation)")
            if await conn.fetchval("SELECT to_regclass($1) IS NULL", f"{k}.data_keys_live"):
                await conn.execute(f"CREATE UNIQUE INDEX data_keys_live ON {k}.data_keys (user_key) "
                                   "WHERE wrapped IS NOT NULL AND retired_at IS NULL")
            # Keyed digests and rotation. A key wrapped before is bound to the user id.
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {k}.secrets (name text PRIMARY KEY, kek_id text NOT NULL, "
                "wrapped bytea NOT NULL); "
                f"CREATE TABLE IF NOT EXISTS {k}.refused_keks (kek_id text PRIMARY KEY, "
                "refused_at timestamptz NOT NULL DEFAULT now())")
            if not await conn.fetchval("SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = $1::regclass "
                                       "AND attname = 'bound_to_user' AND NOT attisdropped)", f"{k}.data_keys"):
                await conn.execute(f"ALTER TABLE {k}.data_keys ADD COLUMN bound_to_user boolean NOT NULL DEFAULT true")
                # No default from here: a process of before (which names users by the unkeyed
                # digest) fails to make a key instead of making a second one the others never find.
                await conn.execute(f"ALTER TABLE {k}.data_keys ALTER COLUMN bound_to_user DROP DEFAULT")

    async def current(self, user: bytes):
        r = await self._pool.fetchrow(f"SELECT generation, kek_id, wrapped FROM {self._k}.data_keys "
                                      "WHERE user_key = $1 AND wrapped IS NOT NULL AND retired_at IS NULL", user)
        return None if r is None else (r["generation"], r["kek_id"], bytes(r["wrapped"]))

    async def key(self, user: bytes, generation: int):
        r = await self._pool.fetchrow(f"SELECT kek_id, wrapped FROM {self._k}.data_keys "
                                      "WHERE user_key = $1 AND generation = $2 AND wrapped IS NOT NULL", user, generation)
        return None if r is None else (r["kek_id"], bytes(r["wrapped"]))

    async def create(self, user: bytes, kek_id: str, wrapped: bytes):
        # A second creator conflicts on the live key (the partial index) or on the generation.
        # A KEK a rotation refused wraps nothing new (``refuse`` locks the table out meanwhile).
        r = await self._pool.fetchrow(
            f"INSERT INTO {self._k}.data_keys (user_key, generation, kek_id, wrapped, bound_to_user) "
            f"SELECT $1, coalesce(max(generation), 0) + 1, $2, $3, false FROM {self._k}.data_keys WHERE user_key = $1 "
            f"HAVING NOT EXISTS (SELECT FROM {self._k}.refused_keks WHERE kek_id = $2) "
            "ON CONFLICT DO NOTHING RETURNING generation, kek_id, wrapped", user, kek_id, wrapped)
        if r is None and await self._pool.fetchval(f"SELECT EXISTS (SELECT FROM {self._k}.refused_keks "
                                                   "WHERE kek_id = $1)", kek_id):
            raise KekRefused(f"{kek_id} was retired by a rotation")
        return await self.current(user) if r is None else (r["generation"], r["kek_id"], bytes(r["wrapped"]))

    async def destroy(self, user: bytes, generation: int | None = None) -> None:
        done = await self._pool.execute(
            f"UPDATE {self._k}.data_keys SET wrapped = NULL, destroyed_at = now() "
            "WHERE user_key = $1 AND wrapped IS NOT NULL AND ($2::int IS NULL OR generation <= $2)", user, generation)
        if done != "UPDATE 0":
            # The row's old version, wrapped key and all, stays in the heap until vacuumed: a
            # copy of the disk taken then could still unwrap it. Only pages with dead rows are
            # visited (the visibility map), so this costs the forget, not the table's size.
            await self._pool.execute(f"VACUUM {self._k}.data_keys")

    async def stamp(self, user: bytes, forget: bytes, at: float | None = None) -> int:
        k = self._k
        found = await self._pool.fetchval(
            f"WITH newest AS (SELECT coalesce((SELECT max(generation) FROM {k}.data_keys WHERE user_key = $1 "
            "AND wrapped IS NOT NULL), 0) AS g), "
            f"made AS (INSERT INTO {k}.forgets (forget, user_key, generation, stamped_at) "
            "SELECT $2, $1, g, coalesce(to_timestamp($3::float8), now()) FROM newest "
            "ON CONFLICT (user_key, forget) DO NOTHING RETURNING generation), "
            f"retired AS (UPDATE {k}.data_keys SET retired_at = now() WHERE user_key = $1 "
            "AND generation = (SELECT generation FROM made) AND retired_at IS NULL) "
            f"SELECT generation FROM made UNION ALL SELECT generation FROM {k}.forgets WHERE user_key = $1 "
            "AND forget = $2 LIMIT 1", user, forget, at)
        if found is None:  # stamped by another process since this statement began
            found = await self._pool.fetchval(f"SELECT generation FROM {k}.forgets WHERE user_key = $1 AND forget = $2",
                                              user, forget)
        return found

    async def stamped(self, user: bytes, forget: bytes) -> int | None:
        return await self._pool.fetchval(f"SELECT generation FROM {self._k}.forgets WHERE user_key = $1 AND forget = $2",
                                         user, forget)

    async def last_forgets(self, users: Sequence[bytes]) -> dict[bytes, float]:
        rows = await self._pool.fetch(f"SELECT user_key, extract(epoch FROM max(stamped_at))::float8 AS at "
                                      f"FROM {self._k}.forgets WHERE user_key = ANY($1::bytea[]) GROUP BY user_key",
                                      list(users))
        return {bytes(r["user_key"]): r["at"] for r in rows}

    async def holds_keys(self) -> bool:
        return await self._pool.fetchval(f"SELECT EXISTS (SELECT FROM {self._k}.data_keys)")

    async def secret(self):
        r = await self._pool.fetchrow(f"SELECT kek_id, wrapped FROM {self._k}.secrets WHERE name = 'digest'")
        return None if r is None else (r["kek_id"], bytes(r["wrapped"]))

    async def adopt_secret(self, kek_id: str, wrapped: bytes, rekey):
        k = self._k
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"memstream-keys:{self._schema}")
            if (r := await conn.fetchrow(f"SELECT kek_id, wrapped FROM {k}.secrets WHERE name = 'digest'")) is not None:
                return r["kek_id"], bytes(r["wrapped"])
            olds = [bytes(u) for u in await conn.fetchval(
                f"SELECT array(SELECT user_key FROM {k}.data_keys UNION SELECT user_key FROM {k}.forgets)")]
            if olds:
                log.info("key store %s: naming %d users by a keyed digest", self._schema, len(olds))
                news = [rekey(u) for u in olds]
                for table in ("data_keys", "forgets"):
                    await conn.execute(f"UPDATE {k}.{table} t SET user_key = m.new FROM "
                                       "unnest($1::bytea[], $2::bytea[]) AS m(old, new) WHERE t.user_key = m.old",
                                       olds, news)
            await conn.execute(f"INSERT INTO {k}.secrets (name, kek_id, wrapped) VALUES ('digest', $1, $2)",
                               kek_id, wrapped)
        if olds:
            await self.vacuum()  # the unkeyed digests' rows
        return kek_id, wrapped

    async def refuse(self, kek_ids: Sequence[str]) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            # Waits for keys being created to be stored (and ``stale`` to see them); creates after
            # it see the refusal.
            await conn.execute(f"LOCK TABLE {self._k}.data_keys IN SHARE ROW EXCLUSIVE MODE")
            await conn.execute(f"INSERT INTO {self._k}.refused_keks (kek_id) SELECT unnest($1::text[]) "
                               "ON CONFLICT DO NOTHING", list(kek_ids))

    @contextlib.asynccontextmanager
    async def rotating(self):
        lock = f"memstream-rotate:{self._schema}"
        while True:  # a waiter holds no connection of the pool: the holder needs one to work with
            conn = await self._pool.acquire()
            if await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", lock):
                break
            await self._pool.release(conn)
            await asyncio.sleep(0.5)
        try:
            yield
        finally:
            try:
                await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", lock)
            finally:
                await self._pool.release(conn)

    async def refused(self) -> list[str]:
        return [r["kek_id"] for r in await self._pool.fetch(f"SELECT kek_id FROM {self._k}.refused_keks ORDER BY 1")]

    async def stale(self, kek_id: str, limit: int, after: tuple[bytes, int] | None = None) -> list[WrappedKey]:
        # In primary-key order from ``after``: one pass over the table, however many pages.
        rows = await self._pool.fetch(f"SELECT user_key, generation, kek_id, wrapped, bound_to_user FROM "
                                      f"{self._k}.data_keys WHERE wrapped IS NOT NULL AND (kek_id <> $1 OR bound_to_user) "
                                      "AND ($3::bytea IS NULL OR (user_key, generation) > ($3, $4)) "
                                      "ORDER BY user_key, generation LIMIT $2", kek_id, limit,
                                      *(after or (None, 0)))
        return [WrappedKey(bytes(r["user_key"]), r["generation"], r["kek_id"], bytes(r["wrapped"]), r["bound_to_user"])
                for r in rows]

    async def rewrapped(self, key: WrappedKey, kek_id: str, wrapped: bytes) -> bool:
        # Never under a KEK a rotation is retiring: a process that still sees the old one (a
        # lagging file system, KMS's alias) would leave a key behind the rotation's scan.
        return await self._pool.execute(
            f"UPDATE {self._k}.data_keys SET kek_id = $3, wrapped = $4, bound_to_user = false WHERE user_key = $1 "
            "AND generation = $2 AND kek_id = $5 AND wrapped = $6 "
            f"AND NOT EXISTS (SELECT FROM {self._k}.refused_keks WHERE kek_id = $3)", key.user, key.generation,
            kek_id, wrapped, key.kek_id, key.wrapped) == "UPDATE 1"

    async def rewrap_secret(self, old_kek_id: str, kek_id: str, wrapped: bytes) -> bool:
        return await self._pool.execute(f"UPDATE {self._k}.secrets SET kek_id = $2, wrapped = $3 WHERE name = 'digest' "
                                        "AND kek_id = $1", old_kek_id, kek_id, wrapped) == "UPDATE 1"

    async def sealing_since(self) -> float | None:
        return await self._pool.fetchval(f"SELECT extract(epoch FROM min(created_at))::float8 FROM {self._k}.data_keys")

    async def vacuum(self) -> None:
        """Rewrite the tables holding wrapped keys (the old files are emptied at once), then end
        the WAL segment and checkpoint so the segments holding what was replaced are dropped
        (recycled in place unless ``wal_recycle`` is off; archives and replicas keep theirs: the
        KEK rotation is what makes those copies useless). Needs the rights to checkpoint; without
        them, the rewrite alone is done."""
        for table in ("data_keys", "secrets"):
            await self._pool.execute(f"VACUUM FULL {self._k}.{table}")
        import asyncpg

        try:
            await self._pool.execute("SELECT pg_switch_wal()")
            await self._pool.execute("CHECKPOINT")
        except asyncpg.InsufficientPrivilegeError as exc:
            log.warning("key store vacuumed, but this role cannot end the WAL segment or checkpoint (%s): "
                        "the replaced keys' old WAL stays until the server's next checkpoint", exc)
