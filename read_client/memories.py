"""What memstream holds about a user, page by page and in numbers: the view a person (or the
host acting for them) needs to see, correct and forget their memory. Bounded: a page holds at
most ``MAX_PAGE`` items, walked by keyset cursors, so a heavy user's memory is never one query."""
from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime, timezone

from memstream.projections.episodes import query as episodes_q
from memstream.projections.facts import query as facts_q
from memstream.projections.graph import query as graph_q
from memstream.read_client.arguments import check_user, storable
from memstream.schemas.errors import InvalidArgument
from memstream.schemas.events import in_range
from memstream.schemas.read_models import (AsOf, Edge, Episode, FactVersion, Graph, GraphEdge, GraphNode, KindStats,
                                           MemoryPage, MemoryStats, RankedEdge, RefusedFact, UserPage)

KINDS = ("facts", "episodes", "edges", "refused", "archived")
MAX_PAGE = 500
_START = (datetime.min.replace(tzinfo=timezone.utc), uuid.UUID(int=0))


def _cursor(kind: str, at: datetime, key: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(json.dumps([kind, at.isoformat(), str(key)]).encode()).decode()


def _after(kind: str, cursor: str | None) -> tuple[datetime, uuid.UUID]:
    if cursor is None:
        return _START
    try:
        if len(cursor) > 256:
            raise ValueError("too long")
        was, at, key = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        after = datetime.fromisoformat(at), uuid.UUID(key)
        if not in_range(after[0]):  # as a page writes it (aware, storable), or Postgres refuses it
            raise ValueError("not a time a page returns")
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise InvalidArgument(f"cursor is not one a page of memories returned ({exc})") from None
    if was != kind:
        raise InvalidArgument(f"cursor belongs to a page of {was}, not of {kind}")
    return after


def fact_version(r) -> FactVersion:
    return FactVersion(**{k: r[k] for k in FactVersion.model_fields if k in r})


def _episode(r) -> Episode:
    return Episode(**{**{k: r[k] for k in Episode.model_fields},
                      "metadata": json.loads(r["metadata"]) if isinstance(r["metadata"], str) else r["metadata"]})


def check_page(user_id, kind, limit, cursor) -> None:
    check_user(user_id)
    if kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {KINDS}, not {kind!r}")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_PAGE}, not {limit!r}")
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidArgument(f"cursor must be the string a page returned, not {type(cursor).__name__}")


async def memory_page(conn, user_id: str, kind: str, include_history: bool, limit: int, cursor: str | None) -> MemoryPage:
    after = _after(kind, cursor)
    if kind in ("facts", "archived"):
        rows = await (facts_q.page(conn, user_id, include_history, after, limit + 1) if kind == "facts"
                      else facts_q.archived_page(conn, user_id, after, limit + 1))
        items = [fact_version(r) for r in rows[:limit]]
        keys = [(r["recorded_at"], r["fact_id"]) for r in rows[:limit]]
    elif kind == "episodes":
        rows = await episodes_q.page(conn, user_id, after, limit + 1)
        items = [_episode(r) for r in rows[:limit]]
        keys = [(r["occurred_at"], r["episode_id"]) for r in rows[:limit]]
    elif kind == "refused":
        rows = await facts_q.refused_page(conn, user_id, after, limit + 1)
        items = [RefusedFact(**dict(r)) for r in rows[:limit]]
        keys = [(r["recorded_at"], r["decision_id"]) for r in rows[:limit]]
    else:
        rows = await graph_q.page(conn, user_id, include_history, after, limit + 1)
        items = [Edge(**{k: r[k] for k in Edge.model_fields if k in r}, source=r["source_name"], target=r["target_name"])
                 for r in rows[:limit]]
        keys = [(r["recorded_at"], r["edge_id"]) for r in rows[:limit]]
    more = len(rows) > limit
    return MemoryPage(kind=kind, items=items, next_cursor=_cursor(kind, *keys[-1]) if more else None)


async def fact_episodes(conn, user_id: str, fact_id) -> list[Episode]:
    """The remembered turns the user's fact was read from, in time order."""
    found = await episodes_q.by_source(conn, user_id, await facts_q.turns(conn, user_id, fact_id))
    return [_episode(r) for r in sorted(found.values(), key=lambda r: (r["occurred_at"], r["episode_id"]))]


async def memory_stats(conn, user_id: str) -> MemoryStats:
    facts = await facts_q.counts(conn, user_id)
    episodes = await episodes_q.counts(conn, user_id)
    edges = await graph_q.counts(conn, user_id)
    newest = [t for t in (max((r["newest"] for r in facts), default=None), episodes["last_recorded"], edges["newest"])
              if t is not None]
    return MemoryStats(
        user_id=user_id,
        facts=KindStats(by_status={r["status"]: r["n"] for r in facts},
                        oldest=min((r["oldest"] for r in facts), default=None),
                        newest=max((r["newest"] for r in facts), default=None)),
        episodes=KindStats(by_status={"recorded": episodes["n"]} if episodes["n"] else {},
                           oldest=episodes["oldest"], newest=episodes["newest"]),
        edges=KindStats(by_status={k: edges[k] for k in ("current", "closed", "forgotten") if edges[k]},
                        oldest=edges["oldest"], newest=edges["newest"]),
        entities=edges["entities"], conversations=episodes["conversations"],
        last_recorded=max(newest, default=None))


MAX_NODES = 300
MAX_EDGES = 2_000  # a graph page: one user's graph is not one response's worth, however large


def _prefix_end(prefix: str) -> str | None:
    """The first string past every string starting with ``prefix``, in byte (code point) order."""
    for i in range(len(prefix) - 1, -1, -1):
        if ord(prefix[i]) < 0x10FFFF:
            # Past a surrogate's code points: Postgres text holds none.
            return prefix[:i] + chr(ord(prefix[i]) + (0x801 if ord(prefix[i]) == 0xD7FF else 1))
    return None


async def user_page(conn, prefix: str, limit: int, cursor: str | None) -> UserPage:
    if not isinstance(prefix, str):
        raise InvalidArgument(f"prefix must be a string, not {type(prefix).__name__}")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_PAGE}, not {limit!r}")
    if cursor is not None and (not isinstance(cursor, str) or not cursor.startswith(prefix)):
        raise InvalidArgument("cursor is not one a page of these users returned")
    storable("prefix", prefix)
    if cursor is not None:
        storable("cursor", cursor)
    found = await episodes_q.users(conn, prefix if cursor is None else cursor, _prefix_end(prefix), limit + 1,
                                   inclusive=cursor is None)
    return UserPage(users=found[:limit], next_cursor=found[limit - 1] if len(found) > limit else None)


def _node_id(r, side: str) -> str:
    if side == "source":
        return str(r["source_entity_id"])
    return str(r["target_entity_id"]) if r["target_entity_id"] is not None else f"value:{r['target_value']}"


async def graph_at(conn, user_id: str, as_of: AsOf) -> Graph:
    nodes = await graph_q.nodes(conn, user_id, MAX_NODES + 1)
    span = await graph_q.span(conn, user_id)
    rows = await graph_q.as_of(conn, user_id, as_of.valid_time, as_of.recorded_time, k=MAX_EDGES + 1)
    return Graph(user_id=user_id, as_of=as_of, nodes=[GraphNode(**dict(r)) for r in nodes[:MAX_NODES]],
                 edges=[GraphEdge(**{k: r[k] for k in Edge.model_fields if k in r}, source=r["source_name"],
                                  target=r["target_name"], source_id=_node_id(r, "source"),
                                  target_id=_node_id(r, "target")) for r in rows[:MAX_EDGES]],
                 earliest=span["earliest"], latest=span["latest"],
                 truncated=len(nodes) > MAX_NODES or len(rows) > MAX_EDGES)


async def with_source_turns(conn, user_id: str, versions: list[FactVersion]) -> list[FactVersion]:
    """``versions`` with the turn each was decided from, where that turn is still remembered."""
    sources = {v.source_event_id for v in versions if v.source_event_id is not None}
    turns = await episodes_q.by_source(conn, user_id, list(sources)) if sources else {}
    return [v.model_copy(update={"source_turn": _episode(turns[v.source_event_id])}) if v.source_event_id in turns
            else v for v in versions]


def ranked_edge(r, *, hop: int, score: float, similarity: float | None = None) -> RankedEdge:
    return RankedEdge(
        edge_id=r["edge_id"], fact_sentence=r["fact_sentence"], relation=r["relation"], source=r["source_name"],
        target=r["target_name"], valid_from=r["valid_from"], valid_to=r["valid_to"], recorded_at=r["recorded_at"],
        closed_at=r["closed_at"], hop=hop, score=round(score, 6),
        similarity=round(similarity if similarity is not None else 1.0 - float(r["distance"]), 6))
