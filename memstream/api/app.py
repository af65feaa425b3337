"""The HTTP API: append turns and host records, read a context, search, see, correct and forget
memories, export a user, and (operators) the pipeline's status. OpenAPI at ``/docs``.

Every route names its user in the path and is authorised by an API key (``Authorization:
Bearer <key>`` or ``X-API-Key``) that reaches that user (``memstream.api.keys``): another
tenant's user is 403 before anything is read or appended. Errors are RFC 9457 problem details
(``application/problem+json``); request bodies are bounded (``max_body_bytes``, 413 past it).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import fastapi_offline
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from memstream.api.keys import ApiKeys, Principal
from memstream.api.middleware import (API_HEADERS, MAX_BODY_BYTES, PAGE_HEADERS, STATIC, UNAUTHORIZED, USER_ID,
                                      BoundedBodies, KeyFirst, Problem, SecurityHeaders, Unexpected, UserSegment,
                                      presented_key,
                                      problem_response)
from memstream.api.middleware import RedactedAccessLog  # noqa: F401  (the CLI imports it from here)
from memstream.api.models import (TYPED_ROUTES, Appended, CaughtUp, CaughtUpIn, ContextIn, CorrectIn, ForgetIn, Me,
                                  Position, SearchIn, TurnIn, appended_at)
from memstream.config import Settings
from memstream.projections.redaction import redact_logs
from memstream.schemas import LogPosition, TurnRecorded, decode_event
from memstream.schemas.errors import InvalidArgument, InvalidEvent
from memstream.schemas.events import ErasureReason, new_event_id
from memstream.schemas.read_models import (AsOf, Episode, FactVersion, Graph, MemoryContext, MemoryPage, SearchResult,
                                           UserOverview, UserPage)

log = logging.getLogger("memstream.api")

LIVE_LOG_FRESH_S = 1.0  # a move of the log to more partitions is seen by then
LIVE_LOG_AGAIN_S = 0.1  # a request naming a topic not the held one asks again, but no oftener
LIVE_LOG_LOOKUP_S = 2.0  # past this the held topics serve (a Postgres that stopped answering)
READY_FRESH_S = 1.0  # /readyz asks the stores again after this


def create_app(settings: Settings, *, keys: ApiKeys | None = None, dsn: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, embedder=None) -> FastAPI:
    """The API over ``settings``' deployment; ``keys`` default to ``<home>/api-keys.json``."""
    from memstream.api.limits import Limited, Limits

    keys = keys or ApiKeys(Path(settings.home) / "api-keys.json")
    redact_logs()
    state: dict[str, Any] = {}
    limits = Limits(settings.api_limits)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        from memstream.memory import connect

        state["dsn"] = dsn or settings.dsn()
        state["exports"] = asyncio.Semaphore(2)  # each reads a user's partitions from offset 0
        state["exporting"] = set()  # the principals with one running: one at a time each
        async with connect(settings, dsn=state["dsn"], embedder=embedder) as memory:
            state["memory"], state["reader"], state["log"] = memory, memory.reader, memory.log
            yield

    app = FastAPI(title="memstream", version="1", lifespan=lifespan, docs_url=None,
                  description=(__doc__ or "").split("\n\n", 1)[-1].replace("\n", " "))
    # The API's page from a vendored Swagger UI (FastAPI's default loads it from a CDN).
    app.mount("/docs/assets", StaticFiles(directory=Path(fastapi_offline.__file__).parent / "static"),
              name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title="memstream API",
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css", swagger_favicon_url="data:,")
    app.add_middleware(BoundedBodies, limit=max_body_bytes)
    app.add_middleware(KeyFirst, keys=keys)  # added after the body bound: runs before it
    app.add_middleware(SecurityHeaders, prefix="/inspector", headers=PAGE_HEADERS)
    app.add_middleware(SecurityHeaders, prefix="/v1/", headers=API_HEADERS)
    app.add_middleware(UserSegment)  # added last: runs first, so every check sees the user it names
    app.add_middleware(Unexpected)  # outside the rest: what they raise is answered too

    @app.exception_handler(Problem)
    async def problem(request, exc: Problem):
        return problem_response(exc.status, exc.title, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request, exc: RequestValidationError):
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return problem_response(422, "Invalid request", where)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, Problem):  # FastAPI wraps what reading the body raised (a body too large)
            return problem_response(exc.__cause__.status, exc.__cause__.title, exc.__cause__.detail)
        return problem_response(exc.status_code, "Not found" if exc.status_code == 404 else "HTTP error", str(exc.detail))

    @app.exception_handler(Limited)
    async def limited(request, exc: Limited):
        response = problem_response(429, "Too many requests", f"this tenant sent {exc.what}: retry later")
        response.headers["Retry-After"] = str(max(1, round(exc.retry_after + 0.5)))
        return response

    @app.exception_handler(InvalidArgument)
    @app.exception_handler(InvalidEvent)
    async def invalid(request, exc: Exception):
        return problem_response(400, "Invalid argument", str(exc))

    def caller(request: Request) -> Principal:
        if (who := keys.principal(presented_key(request.headers))) is None:
            raise Problem(401, "Unauthorized", UNAUTHORIZED)
        limits.request(who.tenant)
        return who

    async def reading(who: Principal = Depends(caller)):
        """A request of the caller's tenant that holds the reader's pool, in flight
        (``limits.reading``): reads, waits, browsing, a correct or forget (its look-up and append)."""
        with limits.reading(who.tenant):
            yield

    def user(request: Request, user_id: str, who: Principal = Depends(caller)) -> str:
        from memstream.read_client.arguments import check_user

        user_id = request.scope.get(USER_ID, user_id)  # as the raw path said it (UserSegment)
        if not who.reaches(user_id):
            raise Problem(403, "Forbidden", f"this key reaches the users of tenant {who.tenant!r} only "
                                            f"(user ids '{who.tenant}:...')")
        check_user(user_id)
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
        from memstream.streams.log.errors import BrokerUnavailable

        try:
            return appended_at(await coro)
        except NotFound as exc:  # never whether another tenant's id exists
            raise Problem(404, "Not found", exc.public) from None
        except BrokerUnavailable as exc:  # where the brokers are, and why not, is the operator's
            log.warning("append refused: %s", exc)
            raise Problem(503, "Log unavailable", "the log cannot take appends now: retry later") from None

    @app.get("/healthz", include_in_schema=False)
    async def healthz():
        """Liveness: the process serves requests (whatever the stores do: a restart fixes none of them)."""
        return {"ok": True}

    probing = asyncio.Lock()

    @app.get("/readyz", include_in_schema=False)
    async def readyz():
        """Readiness: Postgres (reads) and Kafka (appends) answer now; 503 otherwise. Redis is
        reported, not required: reads go on without it. Asked of the stores once a second at
        most, by one request at a time: it needs no key, and each probe takes a connection of
        the pool every tenant's reads share."""
        async with probing:
            held = state.get("ready")
            if held is None or time.monotonic() - held[1] > READY_FRESH_S:
                stores, log_ok = await asyncio.gather(state["reader"].probe(), state["log"].reachable())
                checks = {**stores, "kafka": log_ok}
                state["ready"] = held = ({"ready": bool(checks["postgres"] and checks["kafka"]), "checks": checks},
                                         time.monotonic())
        return JSONResponse(held[0], status_code=200 if held[0]["ready"] else 503)

    @app.get("/inspector", include_in_schema=False)
    async def inspector():
        """The memory inspector (static: it calls the routes below with the key it is given)."""
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/inspector/assets", StaticFiles(directory=STATIC), name="inspector-assets")

    @app.get("/v1/me", response_model=Me, tags=["users"])
    async def me(who: Principal = Depends(caller)):
        """Who this key is: its name, and its tenant (none for an operator key)."""
        return Me(name=who.name, tenant=who.tenant, operator=who.operator)

    @app.get("/v1/users", response_model=UserPage, tags=["users"], dependencies=[Depends(reading)])
    async def users(prefix: str | None = None, limit: int = 50, cursor: str | None = None,
                    who: Principal = Depends(caller)):
        """The users with remembered turns that this key reaches, in byte order of their ids
        (a tenant's key: its tenant's users, whose ids start '<tenant>:')."""
        own = "" if who.operator else f"{who.tenant}:"
        if prefix is not None and not prefix.startswith(own):
            raise Problem(403, "Forbidden", f"this key reaches the users of tenant {who.tenant!r} only "
                                            f"(prefix '{own}...')")
        return await state["reader"].users(own if prefix is None else prefix, limit=limit, cursor=cursor)

    @app.get("/v1/users/{user_id}", response_model=UserOverview, tags=["users"], dependencies=[Depends(reading)])
    async def overview(user_id: str = Depends(user)):
        """The user's profile, person identity and memory in numbers."""
        return await state["reader"].overview(user_id)

    @app.get("/v1/users/{user_id}/graph", response_model=Graph, tags=["read"], dependencies=[Depends(reading)])
    async def graph(valid_time: datetime | None = None, recorded_time: datetime | None = None,
                    user_id: str = Depends(user)):
        """The relationship graph as it was: edges true at ``valid_time`` as believed at
        ``recorded_time`` (each defaults as ``AsOf``'s do; neither: now)."""
        as_of = None if valid_time is None and recorded_time is None else AsOf(valid_time=valid_time,
                                                                                recorded_time=recorded_time)
        return await state["reader"].graph(user_id, as_of)

    @app.post("/v1/caught-up", response_model=CaughtUp, tags=["log"], dependencies=[Depends(reading)])
    async def caught_up(body: CaughtUpIn, who: Principal = Depends(caller)):
        """Wait up to ``timeout`` seconds for every read projection to apply a position an append
        returned: to show a change once it is visible."""
        return CaughtUp(caught_up=await state["reader"].caught_up(await logged(body.position, "position"),
                                                                  body.timeout))

    async def logged(p: Position, name: str) -> LogPosition:
        # Positions of the log appends return, nothing else; looked up afresh before refusing
        # one (the log may have moved within the second ``live`` keeps what it found).
        if p.topic != (await live()).events_topic and p.topic != (await live(fresh=True)).events_topic:
            if state.get("live_failed"):  # the log may have moved: not the caller's mistake, maybe
                raise Problem(503, "Unavailable", "the log's topics could not be looked up: try again")
            raise Problem(400, "Invalid argument", f"{name}.topic must be the log's events topic, not {p.topic!r}")
        return LogPosition(p.topic, p.partition, p.offset)

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
        if not isinstance(body.get("type"), str):
            raise Problem(400, "Invalid argument", "type must be the name of an event type (memstream jsonschema)")
        if body["type"] in TYPED_ROUTES:
            raise Problem(400, "Invalid argument", f"{body['type']}: use {TYPED_ROUTES[body['type']]}, which checks "
                                                   "the memory named is this user's")
        event_id = new_event_id()
        if body.get("type") == "ReminderScheduled":  # reminder ids are the log's to give: no two users share one
            body = {**body, "reminder_id": str(uuid.uuid5(event_id, "reminder"))}
        event = decode_event(json.dumps({**body, "user_id": user_id, "event_id": str(event_id)}).encode())
        if unknown := sorted(set(body) - {"type", *type(event).__struct_fields__}):  # a typo would be lost silently
            raise Problem(400, "Invalid argument", f"{body['type']} has no field {', '.join(map(repr, unknown))}")
        done = await appended(state["log"].append(event))
        given = body.get("reminder_id") if body.get("type") == "ReminderScheduled" else None
        return done.model_copy(update={"reminder_id": uuid.UUID(given) if given else None})

    @app.post("/v1/users/{user_id}/context", response_model=MemoryContext, tags=["read"],
              dependencies=[Depends(reading)])
    async def context(body: ContextIn, user_id: str = Depends(user)):
        """The memory context for a message (``MemoryReader.read``): no LLM on this path."""
        after = None if body.after is None else await logged(body.after, "after")
        return await state["reader"].read(user_id, body.conversation_id, body.message, after=after, k=body.k,
                                          k_facts=body.k_facts, k_edges=body.k_edges, as_of=body.as_of,
                                          wait_timeout=body.wait_timeout, include_archived=body.include_archived)

    @app.post("/v1/users/{user_id}/search", response_model=SearchResult, tags=["read"],
              dependencies=[Depends(reading)])
    async def search(body: SearchIn, user_id: str = Depends(user)):
        """The best memories of each kind for a query (``MemoryReader.search``)."""
        return await state["reader"].search(user_id, body.query, kinds=tuple(body.kinds), k=body.k, as_of=body.as_of,
                                            since=body.since, until=body.until)

    @app.get("/v1/users/{user_id}/memories", response_model=MemoryPage, tags=["memories"],
             dependencies=[Depends(reading)])
    async def memories(kind: Literal["facts", "episodes", "edges", "refused", "archived"] = "facts", include_history: bool = False,
                       limit: int = 50, cursor: str | None = None, user_id: str = Depends(user)):
        """One page of what memstream holds about the user, oldest first."""
        return await state["reader"].memories(user_id, kind, include_history=include_history, limit=limit, cursor=cursor)

    @app.get("/v1/users/{user_id}/facts/{fact_id}/history", response_model=list[FactVersion], tags=["memories"],
             dependencies=[Depends(reading)])
    async def history(fact_id: uuid.UUID, user_id: str = Depends(user)):
        """Every version of the fact's lineage, oldest first, with why each began and ended."""
        from memstream.control import NotFound, _own

        try:
            await _own(state["reader"], "facts", user_id, fact_id)
        except NotFound as exc:
            raise Problem(404, "Not found", exc.public) from None
        return await state["reader"].fact_history(user_id, fact_id)

    @app.get("/v1/users/{user_id}/facts/{fact_id}/episodes", response_model=list[Episode], tags=["memories"],
             dependencies=[Depends(reading)])
    async def fact_episodes(fact_id: uuid.UUID, user_id: str = Depends(user)):
        """The remembered turns the fact was read from, oldest first: what forgetting it forgets
        with it, unless the forget keeps them."""
        from memstream.control import NotFound, episodes_of_fact

        try:
            return await episodes_of_fact(state["reader"], user_id, fact_id)
        except NotFound as exc:
            raise Problem(404, "Not found", exc.public) from None

    @app.post("/v1/users/{user_id}/facts/{fact_id}/correct", status_code=202, response_model=Appended,
              tags=["memories"], dependencies=[Depends(reading)])
    async def correct(fact_id: uuid.UUID, body: CorrectIn, user_id: str = Depends(user),
                      who: Principal = Depends(caller)):
        """Correct a fact: a new, explicit version (applied once the facts projection catches up)."""
        return await appended(state["memory"].correct(user_id, fact_id, body.value, text=body.text,
                                                      actor=actor(body.actor, who), reason=body.reason))

    @app.post("/v1/users/{user_id}/forget", status_code=202, response_model=Appended, tags=["memories"],
              dependencies=[Depends(reading)])
    async def forget(body: ForgetIn, user_id: str = Depends(user), who: Principal = Depends(caller)):
        """Forget one fact, episode or edge (exactly one of the ids). A fact takes the edges stating
        it and the turns it was read from (``GET .../facts/{id}/episodes``) with it, unless
        ``keep_episodes``."""
        limits.forget(who.tenant)
        return await appended(state["memory"].forget(
            user_id, fact_id=body.fact_id, episode_id=body.episode_id, edge_id=body.edge_id,
            keep_episodes=body.keep_episodes, actor=actor(body.actor, who), reason=body.reason))

    @app.delete("/v1/users/{user_id}", status_code=202, response_model=Appended, tags=["memories"])
    async def forget_user(user_id: str = Depends(user), who: Principal = Depends(caller),
                          reason: ErasureReason = "unspecified"):
        """Forget everything memstream holds about the user: rows, caches and, by crypto-shredding, the log."""
        limits.forget(who.tenant)
        return await appended(state["memory"].forget_user(user_id, actor="operator" if who.operator else "host",
                                                          reason=reason))

    looking = asyncio.Lock()

    async def live(fresh: bool = False) -> Settings:
        """The settings with the topics the log lives in now (it may have moved since start) and
        this app's database: looked up by one request at a time, at most once a second (or, for
        a request naming another topic, ``fresh``, once a tenth), and for ``LIVE_LOG_LOOKUP_S`` at
        most: then the topics held serve, so a stalled Postgres holds no request for a minute."""
        from memstream.streams.log.log_topics import live_log_at

        def held_if_fresh() -> Settings | None:
            held = state.get("live")
            if held is not None and time.monotonic() - held[1] <= (LIVE_LOG_AGAIN_S if fresh else LIVE_LOG_FRESH_S):
                return held[0]
            return None

        if (found := held_if_fresh()) is not None:
            return found
        async with looking:
            if (found := held_if_fresh()) is not None:  # another request looked meanwhile
                return found
            try:
                async with asyncio.timeout(LIVE_LOG_LOOKUP_S):
                    found = await live_log_at(settings.model_copy(update={"postgres_dsn": state["dsn"]}), state["dsn"])
            except Exception as exc:  # a failover, a refusal, a stall: the held ones serve
                if "live" not in state:
                    raise Problem(503, "Unavailable", "the log's topics could not be looked up: Postgres does not "
                                                      "answer") from None
                log.warning("the log's topics could not be looked up (%s): the ones held serve", type(exc).__name__)
                # Held as if looked up: the requests queued behind this one serve them too, not
                # each wait its own two seconds.
                state["live"], state["live_failed"] = (state["live"][0], time.monotonic()), True
                return state["live"][0]
            state["live"], state["live_failed"] = (found, time.monotonic()), False
            return found

    @app.get("/v1/users/{user_id}/export", tags=["memories"], response_class=StreamingResponse)
    async def export(user_id: str = Depends(user), who: Principal = Depends(caller)):
        """The user's log (events and decisions, opened) as a versioned JSONL archive; one at a
        time per tenant (429 while one runs), so no tenant holds every export's turn."""
        import shutil

        import memstream.portability as portability

        whose = who.tenant or who.name
        if whose in state["exporting"]:
            raise Problem(429, "Too many requests", "an export of yours is running: retry once it is done")
        if state["exports"].locked():  # refused, not queued: a queue would hold the client for every export before it
            raise Problem(429, "Too many requests", "as many exports as this server runs at once are running: retry")
        state["exporting"].add(whose)
        folder = Path(tempfile.mkdtemp(prefix="memstream-export-"))  # 0700: the archive is opened plaintext
        try:
            async with state["exports"]:
                await portability.export_user(await live(), user_id, folder / "export.jsonl")
            # Off the disk before a byte is sent: the open file is all that holds the plaintext,
            # whatever becomes of the response (a refused Range header, a client gone).
            archive = open(folder / "export.jsonl", "rb")  # closed once streamed (or dropped)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            state["exporting"].discard(whose)

        def streamed():
            with archive:
                while chunk := archive.read(1 << 20):
                    yield chunk

        return StreamingResponse(streamed(), media_type="application/x-ndjson",
                                 headers={"Content-Disposition": 'attachment; filename="export.jsonl"'})

    @app.get("/v1/status", tags=["operations"], dependencies=[Depends(operator)])
    async def status():
        """Positions and lag of every step per partition, dead letters, worker groups (operators)."""
        from memstream.streams.ops.status import pipeline_status

        return (await pipeline_status(await live(), state["dsn"])).as_dict()

    return app
