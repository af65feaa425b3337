"""memstream: long-term memory for conversational agents, rebuilt from a durable log.

``from memstream import connect`` is the front door for a host (``memstream.memory``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from memstream.config import Settings
    from memstream.memory import Memory, connect
    from memstream.schemas import TurnRecorded

__all__ = ["Memory", "Settings", "TurnRecorded", "connect"]


def __getattr__(name: str):
    # Lazily: importing a submodule (memstream.schemas, a worker's) need not load the host's stack.
    if name in ("Memory", "connect"):
        import memstream.memory

        return getattr(memstream.memory, name)
    if name == "Settings":
        from memstream.config import Settings

        return Settings
    if name == "TurnRecorded":
        from memstream.schemas import TurnRecorded

        return TurnRecorded
    raise AttributeError(f"module 'memstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
