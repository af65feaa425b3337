"""KEK rotation: a new key-encryption key, every data key that still exists wrapped again under
it, the old KEK retired. What makes a destroyed data key left in an old WAL segment, a replica
or a backup useless: it was wrapped under a KEK that no longer exists (docs/erasure.md)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import AsyncIterable

from memstream.keys.data_keys import SECRET_CONTEXT, DataKeys, bound

log = logging.getLogger("memstream.keys")

BATCH = 500


@dataclasses.dataclass
class Rotation:
    """What a rotation did: the KEK now current, those it retired, how many keys it wrapped
    again, and how many it could not (bound to a user id it was not given: the old KEK stays)."""

    kek_id: str
    retired: list[str]
    rewrapped: int
    left: int


async def rotate(keys: DataKeys, user_ids: AsyncIterable[str] | None = None) -> Rotation:
    """Rotate ``keys``' KEK, one rotation of the store at a time. ``user_ids``: the users whose
    keys may still be bound to their id (wrapped before keys were bound to the digest); without
    it, or when one is missing, the old KEKs are kept and ``left`` says how many keys hold them
    back (running again, with the ids, finishes the job and retires every KEK refused so far)."""
    await keys.ready()
    kek, store = keys.kek, keys.store
    async with store.rotating():
        old = await asyncio.to_thread(kek.rotate)
        await store.refuse(old)  # from here, nothing new is wrapped under them
        log.info("key-encryption key %s is current; wrapping the earlier ones' keys again", kek.kek_id)
        for _ in range(3):  # the secret every digest depends on: under the new KEK before any old one goes
            found = await store.secret()
            if found is None or found[0] == kek.kek_id:
                break
            kek_id, wrapped = await asyncio.to_thread(kek.rewrap, found[1], SECRET_CONTEXT, found[0])
            await store.rewrap_secret(found[0], kek_id, wrapped)
        else:
            raise RuntimeError("the key store's digest secret could not be wrapped under the new KEK")
        named: dict[bytes, str] = {}
        if user_ids is not None:
            async for u in user_ids:
                named[keys.digest(u)] = u
        done, left, after = 0, 0, None
        while batch := await store.stale(kek.kek_id, BATCH, after):
            for key in batch:
                if key.bound_to_user and key.user not in named:
                    left += 1
                    continue
                if key.bound_to_user:  # bound anew: the data key passes through this process
                    data_key = await asyncio.to_thread(kek.unwrap, key.wrapped, named[key.user], key.kek_id)
                    kek_id, wrapped = await asyncio.to_thread(kek.wrap, data_key, bound(key.user))
                else:
                    kek_id, wrapped = await asyncio.to_thread(kek.rewrap, key.wrapped, bound(key.user), key.kek_id)
                done += await store.rewrapped(key, kek_id, wrapped)
            after = batch[-1].user, batch[-1].generation
        retiring = sorted(set(old) | set(await store.refused()) - {kek.kek_id})
        if left:
            log.warning("%d data keys are bound to user ids this rotation was not given: %s kept", left,
                        ", ".join(retiring))
            return Rotation(kek.kek_id, [], done, left)
        await asyncio.to_thread(kek.retire, retiring)
        await store.vacuum()
    log.info("key-encryption key rotated to %s: %d keys wrapped again, %s retired", kek.kek_id, done,
             ", ".join(retiring))
    return Rotation(kek.kek_id, retiring, done, 0)
