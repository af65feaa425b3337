"""The HTTP API: append turns and commands, read a context, search, see, correct and forget
memories, export a user, and (operators) the pipeline's status. OpenAPI at ``/docs``.

Every route names its user in the path and is authorised by an API key (``Authorization:
Bearer <key>`` or ``X-API-Key``) that reaches that user (``memstream.api.keys``): another
tenant's user is 403 before anything is read or appended. Errors are RFC 9457 problem details
(``application/problem+json``); request bodies are bounded (``max_body_bytes``, 413 past it).
"""
from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from memstream.api.keys import ApiKeys, Principal
from memstream.config import Settings
from memstream.schemas import LogPosition, TurnRecorded, decode_event
from memstream.schemas.errors import InvalidArgument, InvalidEvent
from memstream.schemas.events import new_event_id
from memstream.schemas.read_models import AsOf, FactVersion, MemoryContext, MemoryPage, SearchResult

log = logging.getLogger("memstream.api")

MAX_BODY_BYTES = 256 * 1024


class Problem(Exception):
    def __init__(self, status: int, title: str, detail: str):
        self.status, self.title, self.detail = status, title, detail


def _problem(status: int, title: str, detail: str) -> JSONResponse:
    slug = title.lower().replace(" ", "-")
    return JSONResponse({"type": f"https://memstream.dev/problems/{slug}", "title": title, "status": status,
                         "detail": detail}, status_code=status, media_type="application/problem+json")


class _BoundedBodies:
    """ASGI middleware: a body past ``limit`` bytes is 413 before the route sees it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _problem(413, "Body too large", f"request bodies are at most {self.limit} bytes")(
                scope, receive, send)
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise Problem(413, "Body too large", f"request bodies are at most {self.limit} bytes")
            return message

        try:
            await self.app(scope, bounded, send)
        except Problem as exc:
            await _problem(exc.status, exc.title, exc.detail)(scope, receive, send)


class Position(BaseModel):
    topic: str
    partition: int
    offset: int


class Appended(BaseModel):
    position: Position


class TurnIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    conversation_id: str
    user_message: str
    assistant_message: str
    occurred_at: datetime | None = None
    metadata: dict[str, Any] | None = None


class ContextIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    conversation_id: str
    message: str
    k: int = 5
    k_facts: int = 10
    k_edges: int = 8
    as_of: AsOf | None = None
    after: Position | None = Field(None, description="read your writes: a position an append returned")
    wait_timeout: float = 5.0


class SearchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str
    kinds: list[Literal["facts", "episodes", "edges"]] = ["facts", "episodes", "edges"]
    k: int = 10
    as_of: AsOf | None = None


class CorrectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str
    text: str | None = None
    actor: Literal["user", "host", "operator"] = "host"
    reason: str = ""


class ForgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fact_id: uuid.UUID | None = None
    episode_id: uuid.UUID | None = None
    edge_id: uuid.UUID | None = None
    actor: Literal["user", "host", "operator"] = "host"
    reason: str = ""


def _position(p: LogPosition) -> Appended:
    return Appended(position=Position(topic=p.topic, partition=p.partition, offset=p.offset))


def create_app(settings: Settings, *, keys: ApiKeys | None = None, dsn: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, embedder=None) -> FastAPI:
    """The API over ``settings``' deployment; ``keys`` default to ``<home>/api-keys.json``."""
    keys = keys or ApiKeys(Path(settings.home) / "api-keys.json")
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        import asyncpg

        from memstream.read_client import MemoryReader
        from memstream.streams.log_topics import live_log
        from memstream.streams.producer import TurnLog

        where = dsn or settings.dsn()
        conn = await asyncpg.connect(where)
        try:
            state["settings"] = await live_log(settings, conn)
        finally:
            await conn.close()
        state["dsn"] = where
        state["reader"] = await MemoryReader.connect(settings, where, embedder=embedder)
        state["log"] = TurnLog(settings)
        await state["log"].start()
        try:
            yield
        finally:
            await state["log"].stop()
            await state["reader"].close()

    app = FastAPI(title="memstream", version="1", lifespan=lifespan,
                  description=__doc__.split("\n\n", 1)[1].replace("\n", " "))
    app.add_middleware(_BoundedBodies, limit=max_body_bytes)

    @app.exception_handler(Problem)
    async def problem(request, exc: Problem):
        return _problem(exc.status, exc.title, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request, exc: RequestValidationError):
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return _problem(422, "Invalid request", where)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, Problem):  # FastAPI wraps what reading the body raised (a body too large)
            return _problem(exc.__cause__.status, exc.__cause__.title, exc.__cause__.detail)
        return _problem(exc.status_code, "Not found" if exc.status_code == 404 else "HTTP error", str(exc.detail))

    @app.exception_handler(InvalidArgument)
    @app.exception_handler(InvalidEvent)
    async def invalid(request, exc: Exception):
        return _problem(400, "Invalid argument", str(exc))

    def caller(request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        key = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else request.headers.get("x-api-key")
        who = keys.principal(key)
        if who is None:
            raise Problem(401, "Unauthorized", "send a memstream API key: Authorization: Bearer <key>")
        return who

    def user(user_id: str, who: Principal = Depends(caller)) -> str:
        if not who.reaches(user_id):
            raise Problem(403, "Forbidden", f"this key reaches the users of tenant {who.tenant!r} only "
                                            f"(user ids '{who.tenant}:...')")
        return user_id

    def operator(who: Principal = Depends(caller)) -> Principal:
        if not who.operator:
            raise Problem(403, "Forbidden", "an operator key is needed for this route")
        return who

    def actor(asked: str, who: Principal) -> str:
        if asked == "operator" and not who.operator:
            raise Problem(403, "Forbidden", "only an operator key acts as the operator")
        return asked

    async def appended(coro):
        from memstream.control import NotFound
        from memstream.streams.errors import BrokerUnavailable

        try:
            return _position(await coro)
        except NotFound as exc:
            raise Problem(404, "Not found", str(exc)) from None
        except BrokerUnavailable as exc:
            raise Problem(503, "Log unavailable", str(exc)) from None

    @app.get("/healthz", include_in_schema=False)
    async def healthz():
        return {"ok": True}

    @app.post("/v1/users/{user_id}/turns", status_code=202, response_model=Appended, tags=["log"])
    async def append_turn(body: TurnIn, user_id: str = Depends(user)):
        """Append a conversation turn; returns its position on the log (``after`` for reads)."""
        turn = TurnRecorded.new(user_id=user_id, conversation_id=body.conversation_id, user_message=body.user_message,
                                assistant_message=body.assistant_message, metadata=body.metadata,
                                occurred_at=body.occurred_at or datetime.now(timezone.utc))
        return await appended(state["log"].append(turn))

    @app.post("/v1/users/{user_id}/events", status_code=202, response_model=Appended, tags=["log"])
    async def append_event(body: dict[str, Any], user_id: str = Depends(user), who: Principal = Depends(caller)):
        """Append an event of any type of the log's contract (``memstream jsonschema``), e.g. a
        ``ReminderScheduled`` or ``PersonIdentitySet``; ``user_id`` and ``event_id`` are set here."""
        if "actor" in body:
            actor(str(body["actor"]), who)
        event = decode_event(json.dumps({**body, "user_id": user_id, "event_id": str(new_event_id())}).encode())
        return await appended(state["log"].append(event))

    @app.post("/v1/users/{user_id}/context", response_model=MemoryContext, tags=["read"])
    async def context(body: ContextIn, user_id: str = Depends(user)):
        """The memory context for a message (``MemoryReader.read``): no LLM on this path."""
        after = None if body.after is None else LogPosition(body.after.topic, body.after.partition, body.after.offset)
        return await state["reader"].read(user_id, body.conversation_id, body.message, after=after, k=body.k,
                                          k_facts=body.k_facts, k_edges=body.k_edges, as_of=body.as_of,
                                          wait_timeout=body.wait_timeout)

    @app.post("/v1/users/{user_id}/search", response_model=SearchResult, tags=["read"])
    async def search(body: SearchIn, user_id: str = Depends(user)):
        """The best memories of each kind for a query (``MemoryReader.search``)."""
        return await state["reader"].search(user_id, body.query, kinds=tuple(body.kinds), k=body.k, as_of=body.as_of)

    @app.get("/v1/users/{user_id}/memories", response_model=MemoryPage, tags=["memories"])
    async def memories(kind: Literal["facts", "episodes", "edges"] = "facts", include_history: bool = False,
                       limit: int = 50, cursor: str | None = None, user_id: str = Depends(user)):
        """One page of what memstream holds about the user, oldest first."""
        return await state["reader"].memories(user_id, kind, include_history=include_history, limit=limit, cursor=cursor)

    @app.get("/v1/users/{user_id}/facts/{fact_id}/history", response_model=list[FactVersion], tags=["memories"])
    async def history(fact_id: uuid.UUID, user_id: str = Depends(user)):
        """Every version of the fact's lineage, oldest first, with why each began and ended."""
        from memstream.control import NotFound, _own

        try:
            await _own(state["reader"], "facts", user_id, fact_id)
        except NotFound as exc:
            raise Problem(404, "Not found", str(exc)) from None
        return await state["reader"].fact_history(user_id, fact_id)

    @app.post("/v1/users/{user_id}/facts/{fact_id}/correct", status_code=202, response_model=Appended,
              tags=["memories"])
    async def correct(fact_id: uuid.UUID, body: CorrectIn, user_id: str = Depends(user),
                      who: Principal = Depends(caller)):
        """Correct a fact: a new, explicit version (applied once the facts projection catches up)."""
        from memstream.control import correct_fact

        return await appended(correct_fact(state["log"], state["reader"], user_id, fact_id, body.value, text=body.text,
                                           actor=actor(body.actor, who), reason=body.reason))

    @app.post("/v1/users/{user_id}/forget", status_code=202, response_model=Appended, tags=["memories"])
    async def forget(body: ForgetIn, user_id: str = Depends(user), who: Principal = Depends(caller)):
        """Forget one fact, episode or edge (exactly one of the ids)."""
        from memstream.control import forget_edge, forget_episode, forget_fact

        named = [(k, v) for k, v in (("fact_id", body.fact_id), ("episode_id", body.episode_id),
                                     ("edge_id", body.edge_id)) if v is not None]
        if len(named) != 1:
            raise Problem(400, "Invalid argument", "name exactly one of fact_id, episode_id, edge_id")
        act = {"fact_id": forget_fact, "episode_id": forget_episode, "edge_id": forget_edge}[named[0][0]]
        return await appended(act(state["log"], state["reader"], user_id, named[0][1], actor=actor(body.actor, who),
                                  reason=body.reason))

    @app.delete("/v1/users/{user_id}", status_code=202, response_model=Appended, tags=["memories"])
    async def forget_user(user_id: str = Depends(user), who: Principal = Depends(caller), reason: str = ""):
        """Forget everything memstream holds about the user: rows, caches and, by crypto-shredding, the log."""
        from memstream.control import forget_user as forget

        return await appended(forget(state["log"], user_id, actor="operator" if who.operator else "host", reason=reason))

    @app.get("/v1/users/{user_id}/export", tags=["memories"], response_class=FileResponse)
    async def export(user_id: str = Depends(user)):
        """The user's log (events and decisions, opened) as a versioned JSONL archive."""
        from memstream.portability import export_user
        from memstream.read_client.arguments import check_user

        check_user(user_id)
        path = Path(tempfile.mkdtemp(prefix="memstream-export-")) / "export.jsonl"
        await export_user(state["settings"], user_id, path)
        return FileResponse(path, media_type="application/x-ndjson", filename="export.jsonl",
                            background=BackgroundTask(lambda: (path.unlink(), path.parent.rmdir())))

    @app.get("/v1/status", tags=["operations"], dependencies=[Depends(operator)])
    async def status():
        """Positions and lag of every step per partition, dead letters, worker groups (operators)."""
        from memstream.streams.status import pipeline_status

        return (await pipeline_status(state["settings"], state["dsn"])).as_dict()

    return app
