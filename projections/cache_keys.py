"""The derived caches' Redis keys: ``memstream:<schema>:e<epoch>:<tier>:<len(user)>:<user>[:<rest>]``.

The epoch is its projection's (``projection_epochs``): a switch gives the new schema an epoch past
every one a switch gave before (an undo lowers the live ones) so that no reader reads an earlier
build's keys, and then drops them (``drop_stale``);
a forget deletes a user's keys of every epoch, so none it missed outlives it (``forget``). None of
them expires: a key left behind would hold what it holds until Redis is emptied.
"""
from __future__ import annotations

import re
from typing import Iterable

TIERS = {"t0": "episodes", "t1": "profile"}  # tier -> the projection whose epoch its keys carry
_DIGITS = re.compile(r"[0-9]+")
EPOCH_FRESH_S = 1.0  # how long a reader trusts the epochs it read (a switch changes them)


def key(schema: str, epoch: int, tier: str, user_id: str, *rest: str) -> str:
    # Length-prefix the user id so "a:b" + "c" and "a" + "b:c" cannot share a key.
    return ":".join((f"memstream:{schema}:e{epoch}:{tier}:{len(user_id)}:{user_id}", *rest))


def parse(schema: str, key_: str) -> tuple[int, str, str] | None:
    """(epoch, tier, user id) of one of ``schema``'s keys; None for any other key."""
    head = f"memstream:{schema}:e"
    if not key_.startswith(head):
        return None
    parts = key_[len(head):].split(":", 3)
    if len(parts) != 4 or not all(_DIGITS.fullmatch(p) for p in (parts[0], parts[2])):
        return None
    epoch, tier, n, rest = int(parts[0]), parts[1], int(parts[2]), parts[3]
    if len(rest) < n or rest[n:n + 1] not in ("", ":"):
        return None
    return epoch, tier, rest[:n]


async def forget(redis, schema: str, tier: str, users: Iterable[str]) -> int:
    """Delete every key of ``users`` in ``tier``, whatever its epoch; returns how many."""
    gone = 0
    for user in set(users):
        pattern = _glob(f"memstream:{schema}:e") + "*" + _glob(f":{tier}:{len(user)}:{user}") + "*"
        keys = [k async for k in redis.scan_iter(match=pattern, count=1000)
                if (p := parse(schema, _text(k))) and p[1:] == (tier, user)]
        if keys:
            gone += await redis.delete(*keys)
    return gone


def older(schema: str, epoch: int, tier: str, users: Iterable[str]) -> list[str]:
    """The keys ``users`` had in ``tier`` under each epoch before ``epoch`` (of a tier whose keys
    name nothing but the user)."""
    return [key(schema, e, tier, u) for u in sorted(set(users)) for e in range(epoch)]


async def drop_stale(redis, schema: str, epochs: dict[str, int]) -> int:
    """Delete ``schema``'s keys of any epoch but their projection's in ``epochs``; returns how many."""
    stale = []
    async for k in redis.scan_iter(match=_glob(f"memstream:{schema}:e") + "*", count=1000):
        p = parse(schema, _text(k))
        if p and p[1] in TIERS and epochs.get(TIERS[p[1]]) != p[0]:
            stale.append(k)
    gone = 0
    for i in range(0, len(stale), 1000):
        gone += await redis.delete(*stale[i:i + 1000])
    return gone


def _glob(text: str) -> str:
    """``text`` as a Redis match pattern matching only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _text(k) -> str:
    return k.decode() if isinstance(k, bytes) else k
