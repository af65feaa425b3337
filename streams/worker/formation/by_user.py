"""Rows keyed by ``(user_id, id)``, held per user and copied on write.

Formation's in-memory views (``MemoryView``, ``GraphView``) hold every user of a backfill
(``reform``), and live formation decides each turn on a fork of its views (a turn that fails half
way is retried as if never begun). A decision reads and changes its own user's rows only, so its
lookups and its fold see that user's rows alone, and a fork shares every user's rows and copies
one user's only when they change: a turn costs what its user holds, not what the whole view holds.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Iterator, Mapping, TypeVar

K = TypeVar("K", bound=tuple)
V = TypeVar("V")
_NONE: dict = {}


class ByUser(Mapping[K, V]):
    def __init__(self) -> None:
        self._users: dict[str, dict[K, V]] = {}
        self._own: set[str] = set()  # users whose rows no fork shares: changed in place

    def _holding(self, key: object) -> dict[K, V]:
        """The rows of the user ``key`` names (none for a key that is no ``(user_id, id)``)."""
        return self._users.get(key[0], _NONE) if isinstance(key, tuple) and key else _NONE

    def __getitem__(self, key: K) -> V:
        return self._holding(key)[key]

    def __contains__(self, key: object) -> bool:
        return key in self._holding(key)

    def __iter__(self) -> Iterator[K]:
        for rows in self._users.values():
            yield from rows

    def __len__(self) -> int:
        return sum(map(len, self._users.values()))

    def of(self, user_id: str) -> Mapping[K, V]:
        """One user's rows, read-only (a fork may share them)."""
        return MappingProxyType(self._users.get(user_id, _NONE))

    def mine(self, user_id: str) -> dict[K, V]:
        """One user's rows, to change: copied first if a fork shares them."""
        if user_id not in self._own:
            self._users[user_id] = dict(self._users.get(user_id, {}))
            self._own.add(user_id)
        return self._users[user_id]

    def fork(self) -> "ByUser[K, V]":
        """The same rows, shared (rows are frozen) until either side changes a user's."""
        other: ByUser[K, V] = ByUser()
        other._users = dict(self._users)
        self._own.clear()
        return other
