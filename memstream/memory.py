"""The front door for a host: ``connect()`` returns a ``Memory`` that writes to the log and reads
the memory built from it, and owns both connections.

    async with connect() as memory:              # MEMSTREAM_* settings, or connect(Settings(...))
        pos = await memory.remember(user_id="u1", conversation_id="c1",
                                    user_message="I live in Lisbon.", assistant_message="Nice!")
        ctx = await memory.read("u1", "c1", "where do I live?", after=pos)
        print(memory.render_prompt(ctx, "where do I live?"))

Writes return a ``LogPosition``; a read given ``after=`` that position waits until what was
written is in every section it reads (read-your-writes). The HTTP API, the MCP server and the
CLI's control calls open one of these for the log and the reader they use.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from memstream.config import Settings
from memstream.read_client import AsOf, MemoryContext, MemoryReader, render_prompt
from memstream.schemas import LogPosition, TurnRecorded
from memstream.schemas.events import Event
from memstream.schemas.read_models import FactVersion, Graph, MemoryPage, SearchResult
from memstream.streams.log.producer import TurnLog

__all__ = ["Memory", "connect"]


class Memory:
    """A host's memory: the log it writes (``TurnLog``) and the reader of what was built from it
    (``MemoryReader``), opened and closed together (``async with``). One per process is enough:
    both are safe to share between tasks."""

    def __init__(self, settings: Settings | None = None, *, dsn: str | None = None, embedder=None):
        self.settings = settings or Settings.from_env()
        self._dsn, self._embedder = dsn, embedder  # the dsn found when opened: the local stack may start later
        self._log: TurnLog | None = None
        self._reader: MemoryReader | None = None

    async def __aenter__(self) -> Memory:
        if self._reader is not None:
            raise RuntimeError("this Memory is open already: one `async with` at a time")
        self._dsn = self._dsn or self.settings.dsn()
        self._reader = await MemoryReader.connect(self.settings, self._dsn, embedder=self._embedder)
        try:
            self._log = TurnLog(self.settings.model_copy(update={"postgres_dsn": self._dsn}))
            await self._log.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        log, reader, self._log, self._reader = self._log, self._reader, None, None
        try:
            if log is not None:
                await log.stop()
        finally:
            if reader is not None:
                await reader.close()

    @property
    def log(self) -> TurnLog:
        """The log this memory appends to (for a surface that sends records of its own)."""
        if self._log is None:
            raise RuntimeError("use the Memory inside `async with connect(...)`")
        return self._log

    @property
    def reader(self) -> MemoryReader:
        """The reader of the stores built from the log (for a surface that browses them)."""
        if self._reader is None:
            raise RuntimeError("use the Memory inside `async with connect(...)`")
        return self._reader

    # Writing: the log is the only truth; every store is built from what is appended here.

    async def remember(self, turn: TurnRecorded | None = None, /, *, user_id: str | None = None,
                       conversation_id: str | None = None, user_message: str = "", assistant_message: str = "",
                       occurred_at: datetime | None = None, metadata: dict[str, Any] | None = None) -> LogPosition:
        """Append one conversation turn: a ``TurnRecorded``, or its fields (a fresh event id,
        ``occurred_at`` now by default). Returns where it is on the log."""
        if turn is not None and (user_id or conversation_id or user_message or assistant_message or metadata
                                 or occurred_at is not None):
            from memstream.schemas.errors import InvalidArgument

            raise InvalidArgument("remember takes a TurnRecorded or its fields, not both")
        if turn is None:
            turn = TurnRecorded.new(user_id=user_id, conversation_id=conversation_id, user_message=user_message,
                                    assistant_message=assistant_message, occurred_at=occurred_at, metadata=metadata)
        return await self.log.append(turn)

    async def remember_many(self, turns: Sequence[TurnRecorded]) -> list[LogPosition]:
        """Append turns (of any users) in one round trip; each user's in the order given."""
        return await self.log.append_many(turns)

    async def append(self, event: Event) -> LogPosition:
        """Append a host-written record: a reminder (``ReminderScheduled``, ``ReminderResolved``),
        an identity (``PersonIdentitySet``, ``ExpertIdentityUpserted``, ``ExpertIdentityDeleted``).
        Corrections and forgets go through ``correct``, ``forget`` and ``forget_user``, which
        check the memory they name is the user's."""
        from memstream.schemas.errors import InvalidArgument
        from memstream.schemas.events import CONTROL_TYPES

        if isinstance(event, CONTROL_TYPES):
            raise InvalidArgument(f"{type(event).__name__}: use correct, forget or forget_user")
        return await self.log.append(event)

    async def used(self, user_id: str, fact_ids: Sequence[uuid.UUID] = (),
                   episode_ids: Sequence[uuid.UUID] = ()) -> LogPosition:
        """Say which of the user's facts and episodes (ids as ``read`` returned them) an answer
        used: recall feedback that a decay sweep weighs (a fact in use is not archived, an episode
        in use stays in the hot vector index or comes back to it). Appended to the user's log
        like a turn; the read path itself never writes."""
        from datetime import timezone

        from memstream.schemas import MemoriesUsed, new_event_id
        from memstream.schemas.errors import InvalidArgument

        if not fact_ids and not episode_ids:
            raise InvalidArgument("used: name at least one fact or episode")
        return await self.log.append(MemoriesUsed(event_id=new_event_id(), user_id=user_id,
                                                  occurred_at=datetime.now(timezone.utc), fact_ids=list(fact_ids),
                                                  episode_ids=list(episode_ids)))

    # Reading: no LLM on this path.

    async def read(self, user_id: str, conversation_id: str, message: str, **options) -> MemoryContext:
        """The memory context for ``message``: profile, facts, relationships, episodes, recent
        turns, reminders and identities, ranked and within budget. ``options``: those of
        ``MemoryReader.read`` (``after``, ``k``, ``as_of``, ``budgets``, ...)."""
        return await self.reader.read(user_id, conversation_id, message, **options)

    async def search(self, user_id: str, query: str, **options) -> SearchResult:
        """The best memories of each kind for ``query`` (``MemoryReader.search``'s options)."""
        return await self.reader.search(user_id, query, **options)

    @staticmethod
    def render_prompt(context: MemoryContext, message: str) -> str:
        """``context`` as the text a model is given before ``message``."""
        return render_prompt(context, message)

    async def caught_up(self, after: LogPosition, timeout: float = 5.0) -> bool:
        """Whether every store has applied ``after``, waiting up to ``timeout`` seconds."""
        return await self.reader.caught_up(after, timeout)

    async def memories(self, user_id: str, kind: str = "facts", **options) -> MemoryPage:
        """One page of what is held about the user: ``facts``, ``episodes``, ``edges``, ...
        (``MemoryReader.memories``' options: ``include_history``, ``limit``, ``cursor``)."""
        return await self.reader.memories(user_id, kind, **options)

    async def history(self, user_id: str, fact_id: uuid.UUID) -> list[FactVersion]:
        """Every version of a fact, oldest first, with why each began and ended."""
        return await self.reader.fact_history(user_id, fact_id)

    async def graph(self, user_id: str, as_of: AsOf | datetime | None = None) -> Graph:
        """The user's relationship graph as it was at ``as_of`` (default now)."""
        return await self.reader.graph(user_id, as_of)

    # The person's control over what is remembered: requests on their log, applied in order.

    async def correct(self, user_id: str, fact_id: uuid.UUID, value: str, *, text: str | None = None,
                      actor: str = "user", reason: str = "") -> LogPosition:
        """Say ``fact_id`` is wrong: its lineage gets a new version with ``value``."""
        from memstream.control import correct_fact

        return await correct_fact(self.log, self.reader, user_id, fact_id, value, text=text, actor=actor,
                                  reason=reason)

    async def forget(self, user_id: str, *, fact_id: uuid.UUID | None = None, episode_id: uuid.UUID | None = None,
                     edge_id: uuid.UUID | None = None, keep_episodes: bool = False, actor: str = "user",
                     reason: str = "") -> LogPosition:
        """Forget one memory: a fact (and, unless ``keep_episodes``, the turns it was read from),
        an episode (a turn), or an edge. Exactly one id."""
        from memstream.control import forget_edge, forget_episode, forget_fact
        from memstream.schemas.errors import InvalidArgument

        given = [(k, v) for k, v in (("fact", fact_id), ("episode", episode_id), ("edge", edge_id)) if v is not None]
        if len(given) != 1:
            raise InvalidArgument("forget names exactly one of fact_id, episode_id, edge_id")
        if keep_episodes and fact_id is None:
            raise InvalidArgument("keep_episodes goes with fact_id")
        if fact_id is not None:
            return await forget_fact(self.log, self.reader, user_id, fact_id, actor=actor, reason=reason,
                                     keep_episodes=keep_episodes)
        if episode_id is not None:
            return await forget_episode(self.log, self.reader, user_id, episode_id, actor=actor, reason=reason)
        return await forget_edge(self.log, self.reader, user_id, edge_id, actor=actor, reason=reason)

    async def forget_user(self, user_id: str, *, actor: str = "user", reason: str = "unspecified") -> LogPosition:
        """Forget everything of the user: every row and cache key, and by destroying their data
        key, every copy of their log. ``reason``: an ``ErasureReason`` (it stays plain)."""
        from memstream.control import forget_user

        return await forget_user(self.log, user_id, actor=actor, reason=reason)

    async def export_user(self, user_id: str, path: Path) -> dict:
        """Write the user's log, opened, to ``path`` (JSON lines); returns its header."""
        from memstream.portability import export_user

        from memstream.streams.log.log_topics import live_log_at

        dsn = self._dsn or self.settings.dsn()
        # Where the log lives now: a growth of its partitions moves it to new topics.
        settings = await live_log_at(self.settings.model_copy(update={"postgres_dsn": dsn}), dsn)
        return await export_user(settings, user_id, Path(path))


def connect(settings: Settings | None = None, *, dsn: str | None = None, embedder=None) -> Memory:
    """A ``Memory`` on ``settings`` (default: the ``MEMSTREAM_*`` environment), to be used as
    ``async with connect() as memory:``. ``dsn`` defaults to ``settings.postgres_dsn``, else the
    local stack's socket."""
    return Memory(settings, dsn=dsn, embedder=embedder)
