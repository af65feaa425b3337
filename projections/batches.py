"""Cutting a batch where an item must be applied on its own, in log order."""
from __future__ import annotations

from typing import Callable, Iterator, Sequence, TypeVar

from memstream.schemas import MemoryForgotten

T = TypeVar("T")


def runs(items: Sequence[T], boundary: Callable[[T], bool]) -> Iterator[tuple[list[T], T | None]]:
    """The items between boundaries, each run with the boundary that ends it (None after the
    last): e.g. a whole user's forgetting, which deletes what came before it in the batch and
    leaves what comes after."""
    run: list[T] = []
    for item in items:
        if boundary(item):
            yield run, item
            run = []
        else:
            run.append(item)
    yield run, None


def forgets_user(d) -> bool:
    return isinstance(d, MemoryForgotten) and d.kind == "user"
