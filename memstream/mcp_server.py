"""``memstream mcp``: memory as tools for agents, over the Model Context Protocol (the ``mcp`` SDK).

Tools: ``remember`` (append a turn or a note), ``recall`` (search), ``get_context`` (a read,
rendered for a prompt), ``list_memories``, ``correct_memory``, ``forget_memory``. A server is
scoped by the host, never by what the agent asks: to one user (``user``: the tools take no user
id; stdio or streamable HTTP) or to one tenant's users (``tenant``: streamable HTTP only, each
request bound to the one user ``<tenant>:...`` its host names in the ``Memstream-User`` header —
the protocol's requests carry no session of their own; a call naming another user is refused, so
a prompt-injected agent cannot reach its tenant's other users).
"""
from __future__ import annotations

import contextlib
import functools
import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from memstream.config import Settings
from memstream.schemas.errors import InvalidArgument

USER_HEADER = "memstream-user"  # the host names a tenant-mode session's user here
INSTRUCTIONS = ("Long-term memory of the conversation's user. Call get_context or recall before answering "
                "when the past may matter; remember what the user tells you; correct_memory and "
                "forget_memory when the user asks you to.")


def create_server(settings: Settings, *, user: str | None = None, tenant: str | None = None,
                  dsn: str | None = None, embedder=None) -> MCPServer:
    from memstream.api.keys import TENANT
    from memstream.read_client.arguments import check_user

    if (user is None) == (tenant is None):
        raise InvalidArgument("scope the server to one user or to one tenant's users, exactly one")
    if tenant is not None and not TENANT.fullmatch(tenant):
        raise InvalidArgument(f"{tenant!r} is not a tenant: 1-63 of a-z, 0-9, '_' and '-'")
    if user is not None:
        check_user(user)
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(server):
        from memstream.memory import connect

        async with connect(settings, dsn=dsn, embedder=embedder) as memory:
            state["memory"], state["reader"], state["log"] = memory, memory.reader, memory.log
            yield state

    mcp = MCPServer("memstream", instructions=INSTRUCTIONS, lifespan=lifespan)

    def tool(fn):
        """A tool whose refusals (a bad argument, an id not the user's) reach the agent as their message."""
        from memstream.control import NotFound
        from memstream.schemas.errors import InvalidEvent
        from memstream.streams.log.errors import BrokerUnavailable, KeyStoreUnavailable

        @functools.wraps(fn)
        async def refusing(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except NotFound as exc:  # never whether another user's id exists
                raise ToolError(exc.public) from None
            except (InvalidArgument, InvalidEvent) as exc:
                raise ToolError(str(exc)) from None
            except (BrokerUnavailable, KeyStoreUnavailable):  # its text names a store: the operator's, not the agent's
                raise ToolError("the memory log is unavailable; retry") from None

        return mcp.tool()(refusing)

    def whose(user_id: str | None, ctx: Context) -> str:
        if user is not None:
            if user_id not in (None, user):
                raise InvalidArgument("this server holds the memory of one user only: leave user_id out")
            return user
        request = ctx.request_context.request
        named = request.headers.get(USER_HEADER) if request is not None else None
        if not named:
            raise InvalidArgument("no user named for this request: the host names it in the Memstream-User header")
        if not named.startswith(f"{tenant}:"):
            raise InvalidArgument(f"this server reaches the users of tenant {tenant!r} only (user ids '{tenant}:...')")
        check_user(named)
        if user_id not in (None, named):
            raise InvalidArgument("this request reaches the memory of one user only, the one its host named: leave user_id out")
        return named

    def position(p) -> dict[str, Any]:
        return {"topic": p.topic, "partition": p.partition, "offset": p.offset}

    @tool
    async def remember(text: str, reply: str = "", conversation_id: str = "mcp", user_id: str | None = None,
                       ctx: Context = None) -> dict[str, Any]:
        """Remember what the user said (``text``) and, if any, what you answered (``reply``)."""
        from memstream.schemas import TurnRecorded

        turn = TurnRecorded.new(user_id=whose(user_id, ctx), conversation_id=conversation_id, user_message=text,
                                assistant_message=reply, occurred_at=datetime.now(timezone.utc))
        return {"remembered": position(await state["log"].append(turn))}

    @tool
    async def recall(query: str, kinds: list[Literal["facts", "episodes", "edges"]] | None = None, k: int = 5,
                     user_id: str | None = None, ctx: Context = None) -> dict[str, Any]:
        """The memories that best match ``query``: facts, past turns (episodes) and relationships (edges)."""
        found = await state["reader"].search(whose(user_id, ctx), query,
                                             kinds=("facts", "episodes", "edges") if kinds is None else tuple(kinds),
                                             k=k)
        return {"facts": [{"fact_id": str(f.fact_id), "text": f.text, "score": f.score} for f in found.facts],
                "episodes": [{"episode_id": str(e.episode_id), "when": e.occurred_at.isoformat(),
                              "user": e.user_message, "assistant": e.assistant_message} for e in found.episodes],
                "edges": [{"edge_id": str(e.edge_id), "fact": e.fact_sentence} for e in found.edges],
                "degraded": found.degraded}  # kinds that failed: empty for an outage, not for "nothing known"

    @tool
    async def get_context(message: str, conversation_id: str = "mcp", user_id: str | None = None,
                          after: dict[str, Any] | None = None, ctx: Context = None) -> str:
        """What memory holds for answering ``message``, as a block for your prompt; ``after``: a
        position ``remember`` returned, to wait (up to 5 s) until what was remembered is in it."""
        from memstream.read_client import render_prompt

        ctx = await state["reader"].read(whose(user_id, ctx), conversation_id, message,
                                         after=None if after is None else _position(after, state["log"].events_topic))
        return _noted(ctx) + render_prompt(ctx, message)

    @tool
    async def list_memories(kind: Literal["facts", "episodes", "edges", "archived"] = "facts", limit: int = 50,
                            cursor: str | None = None, user_id: str | None = None,
                            include_history: bool = False, ctx: Context = None) -> dict[str, Any]:
        """One page of what memory holds about the user, oldest first (``next_cursor`` for more);
        ``include_history``: facts' earlier versions and closed relationships too."""
        page = await state["reader"].memories(whose(user_id, ctx), kind, include_history=include_history, limit=limit,
                                              cursor=cursor)
        return page.model_dump(mode="json")

    @tool
    async def correct_memory(fact_id: str, value: str, text: str | None = None, reason: str = "",
                             user_id: str | None = None, ctx: Context = None) -> dict[str, Any]:
        """Correct a fact the user says is wrong: its new ``value`` (and sentence ``text``)."""
        return {"appended": position(await state["memory"].correct(whose(user_id, ctx), _id(fact_id), value, text=text,
                                                                   actor="user", reason=reason))}

    @tool
    async def forget_memory(fact_id: str | None = None, episode_id: str | None = None, edge_id: str | None = None,
                            reason: str = "", user_id: str | None = None, ctx: Context = None) -> dict[str, Any]:
        """Forget one fact, past turn or relationship the user asks you to forget (exactly one id).
        A fact goes with the relationship stating it and the past turns it was read from."""
        ids = {k: None if v is None else _id(v) for k, v in
               (("fact_id", fact_id), ("episode_id", episode_id), ("edge_id", edge_id))}
        return {"appended": position(await state["memory"].forget(whose(user_id, ctx), **ids, actor="user",
                                                                  reason=reason))}

    return mcp


def _noted(ctx) -> str:
    """What the agent must know to tell an outage or a write not yet visible from "nothing remembered"."""
    notes = ([f"[memory unavailable: {', '.join(ctx.degraded)}]"] if ctx.degraded else []) + (
        [] if ctx.caught_up else ["[memory may not hold what was just remembered yet]"])
    return "".join(n + "\n" for n in notes)


def _id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument("that is not a memory id (a UUID)") from None


def _position(after: dict[str, Any], events_topic: str):
    """``after`` as the log position ``remember`` returned, or ``InvalidArgument``."""
    from memstream.schemas import LogPosition

    if (set(after) != {"topic", "partition", "offset"} or after["topic"] != events_topic
            or not all(type(after[k]) is int and 0 <= after[k] < bound
                       for k, bound in (("partition", 2**31), ("offset", 2**63)))):  # the API's bounds
        raise InvalidArgument("after must be a position remember returned: {topic, partition, offset}")
    return LogPosition(after["topic"], after["partition"], after["offset"])
