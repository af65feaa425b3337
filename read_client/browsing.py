"""Browsing a user's memory: pages, counts, histories, the graph at a moment, who holds an id.
The views a person (or the host acting for them) needs to see, correct and forget their memory;
unranked, unlike ``MemoryReader.read`` and ``search``."""
from __future__ import annotations

from datetime import datetime, timezone

import asyncpg

from memstream.projections.commands import query as commands_q
from memstream.projections.episodes import query as episodes_q
from memstream.projections.facts import query as facts_q
from memstream.projections.graph import query as graph_q
from memstream.read_client.arguments import check_as_of, check_user
from memstream.read_client.as_of import both_axes
from memstream.read_client.memories import KINDS as memories_kinds
from memstream.read_client.memories import (check_page, fact_episodes, fact_version, graph_at, memory_page,
                                            memory_stats, ranked_edge, user_page, with_source_turns)
from memstream.schemas.errors import InvalidArgument
from memstream.schemas.read_models import (AsOf, Episode, FactVersion, Graph, MemoryPage, MemoryStats, RankedEdge,
                                           UserOverview, UserPage)
from memstream.schemas.vocabulary import canonical


class Browsing:
    """``MemoryReader``'s browsing calls, on its pool (``_pool``) and profile (``_profile``)."""

    _pool: asyncpg.Pool

    async def timeline(self, user_id: str, source_entity_id, relation: str) -> list[RankedEdge]:
        """Every edge of one (source, relation), in world-time order."""
        rows = await graph_q.timeline(self._pool, user_id, source_entity_id, canonical(relation))
        return [ranked_edge(r, hop=0, score=0.0, similarity=0.0) for r in rows]

    async def current_facts(self, user_id: str) -> list[asyncpg.Record]:
        """Every fact currently believed about the user (for memory views and tools)."""
        return list(await facts_q.current(self._pool, user_id))

    async def memories(self, user_id: str, kind: str = "facts", *, include_history: bool = False,
                       limit: int = 50, cursor: str | None = None) -> MemoryPage:
        """One page of what memstream holds about the user, oldest first: ``kind`` is ``facts``
        (current versions, or every version with ``include_history``), ``episodes`` (every
        remembered turn), ``edges`` (current relationships, or closed ones too), ``refused`` (the
        candidates the junk guard did not keep, and why: ``RefusedFact``) or ``archived`` (facts a
        decay sweep took off the read path, still believed; a mention brings one back). At most
        ``limit`` items (1..500); pass the page's ``next_cursor`` for the next one. Bad arguments
        raise ``InvalidArgument`` before any I/O."""
        check_page(user_id, kind, limit, cursor)
        return await memory_page(self._pool, user_id, kind, include_history, limit, cursor)

    async def stats(self, user_id: str) -> MemoryStats:
        """Counts of the user's facts, episodes and edges by status, the oldest and newest of
        each, their entities and conversations, and when their memory last changed."""
        check_user(user_id)
        return await memory_stats(self._pool, user_id)

    async def holder(self, kind: str, memory_id, user_id: str) -> dict | None:
        """Whose fact, episode or edge ``memory_id`` is, with what a control request needs to
        know of it (a fact's status, slot and value; an episode's source turn): ``user_id``'s own
        when they hold it (a host that gave two users' turns one event id gave them the same
        ids), else another user's, or None if no user holds it. For control tools that must tell
        an unknown id from another user's."""
        q = {"facts": facts_q, "episodes": episodes_q, "edges": graph_q}.get(kind)
        if q is None:
            raise InvalidArgument(f"kind must be one of {tuple(memories_kinds)}, not {kind!r}")
        row = await q.holder(self._pool, memory_id, user_id)
        return None if row is None else dict(row)

    async def fact_history(self, user_id: str, fact_id) -> list[FactVersion]:
        """Every version of the fact's lineage, oldest first: what was believed, when and why, the
        decision that recorded each and the turn it was decided from (while that is remembered)."""
        check_user(user_id)
        rows = await facts_q.history(self._pool, user_id, fact_id)
        return await with_source_turns(self._pool, user_id, [fact_version(r) for r in rows])

    async def fact_episodes(self, user_id: str, fact_id) -> list[Episode]:
        """The remembered turns the fact was read from, oldest first: what forgetting it forgets
        with it (unless the forget keeps them)."""
        check_user(user_id)
        return await fact_episodes(self._pool, user_id, fact_id)

    async def users(self, prefix: str = "", *, limit: int = 50, cursor: str | None = None) -> UserPage:
        """One page of the ids of users with remembered turns that start with ``prefix``, in byte
        order; pass ``next_cursor`` for the next."""
        return await user_page(self._pool, prefix, limit, cursor)

    async def overview(self, user_id: str) -> UserOverview:
        """The user's profile, person identity and memory in numbers."""
        check_user(user_id)
        return UserOverview(user_id=user_id, profile=await self._profile(user_id),
                            person_identity=await commands_q.person_identity(self._pool, user_id),
                            stats=await memory_stats(self._pool, user_id))

    async def graph(self, user_id: str, as_of: AsOf | datetime | None = None) -> Graph:
        """The user's relationship graph as it was at ``as_of`` (default now; a bare time sets both
        axes, as ``read``'s does): the edges held then, between every end the graph ever had."""
        check_user(user_id)
        check_as_of(as_of)
        now = datetime.now(timezone.utc)
        return await graph_at(self._pool, user_id, both_axes(as_of, now) or AsOf(valid_time=now, recorded_time=now))
