"""The HTTP API's ASGI middleware and errors: a key checked before anything else, bounded
bodies, the user a path names, security headers, RFC 9457 problems, and access-log lines that
name no user."""
from __future__ import annotations

import logging
import re
from pathlib import Path
from urllib.parse import quote, unquote

from fastapi.responses import JSONResponse

log = logging.getLogger("memstream.api")
UNAUTHORIZED = "send a memstream API key: Authorization: Bearer <key>"
MAX_BODY_BYTES = 256 * 1024
STATIC = Path(__file__).parent / "static"
# The inspector runs only its own script and talks only to this server: remembered text that
# looks like HTML or script is shown as text (inspector.js), and this stops it running if not.
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                           "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
                                           "base-uri 'none'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
                "X-Frame-Options": "DENY"}
# What the API answers is a person's memory: no browser or proxy keeps it (an export included).
API_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


class Problem(Exception):
    def __init__(self, status: int, title: str, detail: str):
        self.status, self.title, self.detail = status, title, detail


def problem_response(status: int, title: str, detail: str) -> JSONResponse:
    slug = title.lower().replace(" ", "-")
    return JSONResponse({"type": f"https://memstream.dev/problems/{slug}", "title": title, "status": status,
                         "detail": detail}, status_code=status, media_type="application/problem+json")


def _route_path(scope) -> str:
    """The path the routes match: without the root path the app is mounted under (servers put it
    in ``path`` too, or not, as the ASGI spec has changed its mind)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class BoundedBodies:
    """ASGI middleware: a body past ``limit`` bytes is 413 before the route sees it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await problem_response(413, "Body too large", f"request bodies are at most {self.limit} bytes")(
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
            await problem_response(exc.status, exc.title, exc.detail)(scope, receive, send)


def presented_key(headers) -> str | None:
    """The API key a request presents: ``Authorization: Bearer <key>`` or ``X-API-Key``."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key")


class KeyFirst:
    """ASGI middleware: a ``/v1`` request without a valid key is 401 before its body is read (a
    malformed body would otherwise be told apart to anyone, 422 before the route's key check)."""

    def __init__(self, app, keys):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        from starlette.datastructures import Headers

        if (scope["type"] == "http" and _route_path(scope).startswith("/v1/")
                and self.keys.principal(presented_key(Headers(scope=scope))) is None):
            return await problem_response(401, "Unauthorized", UNAUTHORIZED)(scope, receive, send)
        return await self.app(scope, receive, send)


class SecurityHeaders:
    """ASGI middleware: ``headers`` on every response under ``prefix``."""

    def __init__(self, app, prefix: str, headers: dict[str, str]):
        self.app, self.prefix = app, prefix
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _route_path(scope).startswith(self.prefix):
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, with_headers)


class UserSegment:
    """ASGI middleware: the user id of a ``/v1/users/<id>/...`` path taken from the raw path, so a
    user id holding "/" (the log takes it; sent as "%2F") names that user, not a route. Routing
    sees it quoted, one path segment; the ``user`` dependency takes it from ``USER_ID``."""

    PREFIX = b"/v1/users/"

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        root = scope.get("root_path", "") if raw else ""
        if root and raw.startswith(root.encode()):  # mounted under a root path: the routes see past it
            raw = raw[len(root.encode()):]
        if raw and raw.startswith(self.PREFIX) and len(raw) > len(self.PREFIX):
            segment, slash, rest = raw[len(self.PREFIX):].split(b"?", 1)[0].partition(b"/")
            user_id = unquote(segment.decode("utf-8", "replace"))
            path = "/v1/users/" + quote(user_id, safe="") + slash.decode() + unquote(rest.decode("utf-8", "replace"))
            scope = {**scope, USER_ID: user_id, "path": (root if scope["path"].startswith(root) else "") + path}
        return await self.app(scope, receive, send)


USER_ID = "memstream.user_id"


# A user's routes, whatever the user id holds (a decoded "%2F" is a slash in the path).
_USER_IN_PATH = re.compile(r"^/v1/users/.+?((?:/(?:graph|turns|events|context|search|memories|forget|export|"
                           r"facts/[^/]+/(?:history|correct|episodes)))?)$", re.DOTALL)


class Unexpected:
    """What no handler took, answered here: a store that did not answer as 503, anything else as
    500, each logged once. (A handler for ``Exception`` answers too, but the server's error
    middleware raises it again after, and uvicorn logs a traceback at ERROR for every 503 of an
    outage.)"""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:  # a response under way cannot become another
                raise
            from memstream.schemas.errors import Retryable
            from memstream.streams.log.errors import as_retryable

            if isinstance(as_retryable(exc), Retryable):  # a store down (Postgres, Kafka, a socket), not a bug
                log.warning("a store is unavailable: %s", type(exc).__name__)
                response = problem_response(503, "Unavailable", "a store memstream needs did not answer; retry")
            else:
                log.error("unexpected error on %s %s", scope.get("method"), route_of(_route_path(scope)),
                          exc_info=exc)
                response = problem_response(500, "Internal error", "an unexpected error; it is logged")
            await response(scope, receive, send)


def route_of(path: str) -> str:
    """A request's path as logs may keep it: without the user id it names, or its query."""
    return _USER_IN_PATH.sub(r"/v1/users/{user_id}\1", path.split("?", 1)[0])


class RedactedAccessLog(logging.Filter):
    """uvicorn's access log lines with ``route_of`` their paths: user ids are often e-mail
    addresses, and a log outlives every forget."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) >= 3 and isinstance(record.args[2], str):
            record.args = (*record.args[:2], route_of(record.args[2]), *record.args[3:])
        return True
