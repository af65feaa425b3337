"""Per-user data keys: seal and open a user's content with AES-256-GCM under a key of their own,
and destroy it to forget them.

A sealed blob is ``b"ms1" | generation (4 bytes) | nonce (12) | ciphertext``; the user id and a
context (which record field it is) are authenticated with it, so a blob cannot be moved to
another user or field. Data keys are created on first use, kept wrapped by the ``Kek`` in a
``WrappedKeys`` store, and unwrapped into memory only while in use. A user's key goes through
three states: *live* (new content is sealed under it), *retired* by a forget (it seals nothing
new, so what the user says after the forget gets the next generation, while the decisions about
what came before are still sealed under it), and *destroyed* (blobs sealed under it open as
``Shredded`` from then on, anywhere). A generation is never reused. The store holds no user id,
only a keyed digest of it (HMAC-SHA-256 under a secret the KEK wraps, kept in the store): an
e-mail address cannot be confirmed by hashing it. A data key is wrapped bound to that digest, so
a KEK rotation can wrap it again without knowing whose it is (keys wrapped before were bound to
the user id: ``bound_to_user``, wrapped again when their user is next read, or by the rotation
given the user ids).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import struct
import time
import weakref
from collections import OrderedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.schemas.errors import MemstreamError
from memstream.keys.kek import Kek, KekRefused, KekUnavailable
from memstream.keys.wrapped import WrappedKey, WrappedKeys

log = logging.getLogger("memstream.keys")

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
    """The unkeyed digest key stores held before the keyed one (``digest``), and what it is made of."""
    return hashlib.sha256(user_id.encode()).digest()


def digest(secret: bytes, user_id: str) -> bytes:
    """What the key store names a user by: keyed, so a guess at a user id cannot be checked
    without the secret; made from ``user_key`` so a store keyed by that is re-keyed in place."""
    return hmac.digest(secret, user_key(user_id), "sha256")


SECRET_CONTEXT = "memstream:digest-secret"  # what the digest secret is bound to when wrapped


def bound(user: bytes) -> str:
    """What a data key is bound to when wrapped: the user's digest (a rotation knows it)."""
    return "digest:" + user.hex()


def generation_of(sealed: bytes) -> int:
    """The key generation a sealed blob was sealed under (readable without any key)."""
    if len(sealed) < _HEAD.size or sealed[:3] != MAGIC:
        raise NotSealed("not a sealed blob")
    return _HEAD.unpack_from(sealed)[1]


class DataKeys:
    """Seals and opens users' content. Unwrapped keys are kept for the ``keep`` most recently
    used (user, generation) pairs; ``destroy`` drops them from memory too. Another process may
    retire or destroy a key this one seals under: sealing asks the store for the live key again
    after ``fresh_s`` seconds, so what is sealed under a key retired elsewhere is at most that
    old (opening needs no such check: a record is opened once, in log order, and the forget that
    ends its key comes after it).

    Letting go: a process that only seals (a host) never reads the forget that ends a key. Its
    older generations go as soon as the store names a newer live one (at most ``fresh_s`` after
    the forget, at the user's next write), and any key unused for ``idle_s`` goes too."""

    REFUSED_TRIES = 6  # wraps refused by a rotation before giving up (a retryable KekRefused), ~5 s

    def __init__(self, kek: Kek, store: WrappedKeys, keep: int = 10_000, fresh_s: float = 5.0,
                 idle_s: float = 300.0):
        self._kek, self._store, self._keep, self._fresh_s, self._idle_s = kek, store, keep, fresh_s, idle_s
        self._secret: bytes | None = None  # the digest secret, once read (``ready``)
        # (user, generation) -> the key and when it was last used, least recently used first
        self._keys: OrderedDict[tuple[bytes, int], tuple[AESGCM, float]] = OrderedDict()
        # user -> (their live generation, when the store said so), for the ``keep`` most recent
        self._sealing: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        # Per user, while in use: one user's key lookups never wait on another's.
        self._locks: weakref.WeakValueDictionary[bytes, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, user: bytes) -> asyncio.Lock:
        if (lock := self._locks.get(user)) is None:
            self._locks[user] = lock = asyncio.Lock()
        return lock

    @property
    def kek(self) -> Kek:
        return self._kek

    @property
    def store(self) -> WrappedKeys:
        return self._store

    async def ready(self) -> "DataKeys":
        """Read the digest secret (made, wrapped by the KEK, on a store's first use)."""
        if self._secret is None:
            found = await self._store.secret()
            if found is None:
                made = AESGCM.generate_key(256)
                kek_id, wrapped = await asyncio.to_thread(self._kek.wrap, made, SECRET_CONTEXT)
                found = await self._store.adopt_secret(kek_id, wrapped, lambda old: hmac.digest(made, old, "sha256"))
            kek_id, wrapped = found
            if not self._kek.holds(kek_id):
                raise WrongKek(f"the key store's digest secret is wrapped by {kek_id}, this process has "
                               f"{self._kek.kek_id}: every process of a deployment needs the same key-encryption key")
            self._secret = await asyncio.to_thread(self._kek.unwrap, wrapped, SECRET_CONTEXT, kek_id)
        return self

    def _user(self, user_id: str) -> bytes:
        return digest(self._secret, user_id)

    def digest(self, user_id: str) -> bytes:
        """What the store names ``user_id`` by (after ``ready``)."""
        return self._user(user_id)

    async def _live(self, user_id: str) -> tuple[int, AESGCM]:
        """The user's live key for sealing (made on first use), asked again once stale."""
        await self.ready()
        user = self._user(user_id)
        held = self._sealing.get(user)
        if held is not None and time.monotonic() - held[1] < self._fresh_s and (aead := self._held(user, held[0])):
            return held[0], aead
        async with self._lock(user):
            refused = 0
            for _ in range(3 + self.REFUSED_TRIES):  # None: a forget retired the key just made: again
                found = await self._store.current(user)
                if found is None:
                    # A KMS key-encryption key is a network call: never on the event loop.
                    kek_id, wrapped = await asyncio.to_thread(self._kek.wrap, AESGCM.generate_key(256), bound(user))
                    try:
                        found = await self._store.create(user, kek_id, wrapped)
                    except KekRefused:
                        # A rotation is under way and this process has not seen its new KEK yet.
                        refused += 1
                        if refused == self.REFUSED_TRIES:
                            raise
                        await asyncio.to_thread(self._kek.refresh)
                        await asyncio.sleep(min(2.0, 0.1 * 2 ** refused))
                        continue
                if found is not None:
                    break
            else:
                raise RuntimeError("the user's key was retired by a forget as often as it was made")
            generation, kek_id, wrapped = found
            for older in range(1, generation):  # a forget retired them: nothing here seals under them again
                self._keys.pop((user, older), None)
            aead = self._held(user, generation) or await self._unwrap(user_id, user, generation, kek_id, wrapped)
            self._sealing[user] = generation, time.monotonic()
            self._sealing.move_to_end(user)
            while len(self._sealing) > self._keep:
                self._sealing.popitem(last=False)
            return generation, aead

    async def _key(self, user_id: str, generation: int) -> AESGCM | None:
        """The user's key ``generation`` while it is not destroyed (live or retired)."""
        await self.ready()
        user = self._user(user_id)
        if aead := self._held(user, generation):
            return aead
        async with self._lock(user):
            if (found := await self._store.key(user, generation)) is None:
                return None
            return self._held(user, generation) or await self._unwrap(user_id, user, generation, *found)

    def _held(self, user: bytes, generation: int) -> AESGCM | None:
        now = time.monotonic()
        while self._keys and now - next(iter(self._keys.values()))[1] > self._idle_s:
            self._keys.popitem(last=False)
        if (held := self._keys.get((user, generation))) is None:
            return None
        self._keys[user, generation] = held[0], now
        self._keys.move_to_end((user, generation))
        return held[0]

    async def _unwrap(self, user_id: str, user: bytes, generation: int, kek_id: str, wrapped: bytes) -> AESGCM:
        if not self._kek.holds(kek_id):
            raise WrongKek(f"a data key of this user is wrapped by {kek_id}, this process has {self._kek.kek_id}: "
                           "every process of a deployment needs the same key-encryption key (or the key store "
                           "was restored from before a rotation that retired it)")
        try:
            data_key = await asyncio.to_thread(self._kek.unwrap, wrapped, bound(user), kek_id)
        except KekUnavailable:
            # Wrapped before keys were bound to the digest: bound to the user id. Wrapped again
            # now that the user id is known, so a rotation can do without it.
            data_key = await asyncio.to_thread(self._kek.unwrap, wrapped, user_id, kek_id)
            new_kek, rewrapped = await asyncio.to_thread(self._kek.wrap, data_key, bound(user))
            await self._store.rewrapped(WrappedKey(user, generation, kek_id, wrapped, True), new_kek, rewrapped)
        aead = AESGCM(data_key)
        self._keys[user, generation] = aead, time.monotonic()
        while len(self._keys) > self._keep:
            self._keys.popitem(last=False)
        return aead

    async def generation(self, user_id: str) -> int:
        """The user's live key generation, 0 when they have none (a forget then ends nothing)."""
        await self.ready()
        found = await self._store.current(self._user(user_id))
        return 0 if found is None else found[0]

    async def stamp(self, user_id: str, forget: bytes, at: float | None = None) -> int:
        """The key generation the forget with event id ``forget`` is of (``WrappedKeys.stamp``),
        retired from then on: what this process seals next for the user is under a new one (under
        the user's lock: a live key being looked up meanwhile is not held on after it)."""
        await self.ready()
        user = self._user(user_id)
        async with self._lock(user):
            generation = await self._store.stamp(user, forget, at)
            if (held := self._sealing.get(user)) is not None and held[0] <= generation:
                del self._sealing[user]
        return generation

    async def stamped(self, user_id: str, forget: bytes) -> int | None:
        """The generation ``stamp`` gave the forget with event id ``forget``; None if never stamped."""
        await self.ready()
        return await self._store.stamped(self._user(user_id), forget)

    async def last_forgets(self, user_ids) -> dict[str, float]:
        """When each of ``user_ids`` that has one was last forgotten (``WrappedKeys.last_forgets``)."""
        await self.ready()
        by_key = {self._user(u): u for u in user_ids}
        return {by_key[k]: at for k, at in (await self._store.last_forgets(list(by_key))).items()}

    async def seal(self, user_id: str, plaintext: bytes, context: str, generation: int | None = None) -> bytes:
        """Seal under the user's live key (made on first use); under ``generation`` only, when
        given — live or retired, ``Shredded`` once destroyed (content derived from a record
        sealed under it is never sealed again under a newer key)."""
        if generation is None:
            generation, aead = await self._live(user_id)
        elif (aead := await self._key(user_id, generation)) is None:
            raise Shredded(f"generation {generation} of the user's key is destroyed")
        nonce = os.urandom(12)
        return _HEAD.pack(MAGIC, generation, nonce) + aead.encrypt(nonce, plaintext, _aad(user_id, context))

    async def open(self, user_id: str, sealed: bytes, context: str) -> bytes:
        generation = generation_of(sealed)
        if (aead := await self._key(user_id, generation)) is None:
            raise Shredded(f"sealed under a destroyed data key (generation {generation})")
        try:
            return aead.decrypt(sealed[7:_HEAD.size], sealed[_HEAD.size:], _aad(user_id, context))
        except InvalidTag:
            raise NotSealed("the blob does not open for this user and field (damaged, or moved)") from None

    async def sealing_since(self) -> float | None:
        """When this deployment began sealing (``WrappedKeys.sealing_since``)."""
        return await self._store.sealing_since()

    def drop(self, user_id: str, generation: int) -> None:
        """Let go of the user's keys up to ``generation`` held in memory (the store keeps them)."""
        if self._secret is not None:  # else nothing is held
            self._evict(self._user(user_id), generation)

    async def destroy(self, user_id: str, generation: int | None = None) -> None:
        """Destroy the user's key ``generation`` and every older one (None: every key they have),
        never a newer one: a forget applied twice, or after the user came back, must not destroy
        the key of what they said since."""
        await self.ready()
        user = self._user(user_id)
        async with self._lock(user):
            await self._store.destroy(user, generation)
            self._evict(user, generation)

    def _evict(self, user: bytes, generation: int | None) -> None:
        """Drop ``user``'s keys held up to ``generation`` (None: all), and the live one if among them."""
        for held in [k for k in self._keys if k[0] == user and (generation is None or k[1] <= generation)]:
            del self._keys[held]
        if (live := self._sealing.get(user)) is not None and (generation is None or live[0] <= generation):
            del self._sealing[user]


def _aad(user_id: str, context: str) -> bytes:
    return len(user_id).to_bytes(4, "big") + user_id.encode() + context.encode()
