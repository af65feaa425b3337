"""KEK rotation: a new key-encryption key, every data key that still exists wrapped again under
it, the old KEK retired. What makes a destroyed data key left in an old WAL segment, a replica
or a backup useless: it was wrapped under a KEK that no longer exists (docs/erasure.md)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import AsyncIterable

from memstream.sealing.keys import SECRET_CONTEXT, DataKeys, bound

log = logging.getLogger("memstream.sealing")

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
    """Rotate ``keys``' KEK. ``user_ids``: the users whose keys may still be bound to their id
    (wrapped before keys were bound to the digest); without it, or when one is missing, the old
    KEK is kept and ``left`` says how many keys hold it back (running again finishes the job)."""
    await keys.ready()
    kek, store = keys.kek, keys.store
    old = await asyncio.to_thread(kek.rotate)
    await store.refuse(old)  # from here, nothing new is wrapped under them
    log.info("key-encryption key %s is current; wrapping %d earlier ones' keys again", kek.kek_id, len(old))
    found = await store.secret()
    if found is not None and found[0] != kek.kek_id:
        kek_id, wrapped = await asyncio.to_thread(kek.rewrap, found[1], SECRET_CONTEXT, found[0])
        await store.rewrap_secret(found[0], kek_id, wrapped)
    named: dict[bytes, str] = {}
    if user_ids is not None:
        async for u in user_ids:
            named[keys.digest(u)] = u
    done, skipped = 0, set()
    while batch := [k for k in await store.stale(kek.kek_id, BATCH + len(skipped))
                    if (k.user, k.generation) not in skipped]:
        for key in batch:
            if key.bound_to_user and key.user not in named:
                skipped.add((key.user, key.generation))
                continue
            if key.bound_to_user:  # bound anew: the data key passes through this process
                data_key = await asyncio.to_thread(kek.unwrap, key.wrapped, named[key.user], key.kek_id)
                kek_id, wrapped = await asyncio.to_thread(kek.wrap, data_key, bound(key.user))
            else:
                kek_id, wrapped = await asyncio.to_thread(kek.rewrap, key.wrapped, bound(key.user), key.kek_id)
            done += await store.rewrapped(key, kek_id, wrapped)
    if skipped:
        log.warning("%d data keys are bound to user ids this rotation was not given: %s kept", len(skipped),
                    ", ".join(old))
        return Rotation(kek.kek_id, [], done, len(skipped))
    await asyncio.to_thread(kek.retire, old)
    await store.vacuum()
    log.info("key-encryption key rotated to %s: %d keys wrapped again, %s retired", kek.kek_id, done, ", ".join(old))
    return Rotation(kek.kek_id, old, done, 0)
