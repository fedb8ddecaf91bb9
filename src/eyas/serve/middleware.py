"""Plain ASGI middleware (no BaseHTTPMiddleware, which can end a slow reader's stream early):
trailing slashes, the API key check, and request ids with one structured log line per request."""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
import uuid

from .api_errors import error_body

access_log = logging.getLogger("eyas.serve.requests")

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


async def send_json(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


ALWAYS_OPEN = frozenset({"/health", "/dashboard"})  # probes; a static page that holds no data (it reads /metrics)


def open_paths(metrics_require_key: bool) -> frozenset[str]:
    """The paths that answer without the API key; every other path, route or not, needs it."""
    return ALWAYS_OPEN if metrics_require_key else ALWAYS_OPEN | {"/metrics"}


class TrailingSlash:
    """``POST /v1/chat/completions/`` is ``POST /v1/chat/completions``: a trailing slash is dropped before routing.

    Starlette would answer 307 to the slash-less path, and a client that POSTs does not always follow a 307 with
    its body. Outermost, so the API key check and the log see the path the route does."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await self.app(scope, receive, send)


class HeadAsGet:
    """``HEAD`` wherever ``GET`` answers (RFC 9110; uptime probes send it): the request goes on as ``GET`` and the
    body is dropped on the way out, its headers (``Content-Length`` included) kept. The method a 405 names is the
    one sent (``scope["eyas.method"]``)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message):
            if message["type"] == "http.response.body":
                if message.get("more_body"):
                    return
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET", "eyas.method": "HEAD"}, receive, headers_only)


class ApiKey:
    """401 unless ``Authorization: Bearer KEY``, on every path but the exact ``open_paths``.

    An allow-list rather than a list of guarded prefixes: a route added later is guarded
    without anyone remembering to list it."""

    def __init__(self, app, key: str, open_paths: frozenset[str]):
        self.app = app
        self.expected = key.encode()
        self.open = open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.open:
            scheme, _, given = dict(scope.get("headers") or []).get(b"authorization", b"").strip().partition(b" ")
            # the scheme is case-insensitive (RFC 9110: "bearer KEY" is the same credentials); the key is not
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                body = error_body("invalid or missing API key: send 'Authorization: Bearer <key>' with the key "
                                  "the server was started with (--api-key)", code="invalid_api_key")
                return await send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])
        await self.app(scope, receive, send)


class RequestLog:
    """``X-Request-Id`` on every response (a client's safe id is kept) and exactly one JSON log line per
    request: when its last byte is sent, streams included, or else when the app is done with it (a
    client that left mid-stream, an app that raised). ``outcome`` says how it ended, in the words of
    ``eyas:requests_total``: ok, invalid (4xx), rejected (503), timeout (408), abort (the client left),
    error (5xx, or a stream an engine error ended: its route says so). Routes add token counts and
    acceptance to ``request.state.log``; prompt and output text stay out unless ``with_text``."""

    QUIET = ("/metrics", "/health")  # scraped and probed every few seconds

    def __init__(self, app, with_text: bool = False):
        self.app = app
        self.with_text = with_text

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if REQUEST_ID.match(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        state["client_request_id"] = rid if rid == given else None  # a client's own id: names its response too
        state["log"] = fields = {}
        start = time.perf_counter()
        status = 0

        logged = False

        async def tagged_send(message):
            nonlocal status, logged
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                logged = True
                self.emit(scope, rid, status, start, fields)

        raised = True
        try:
            await self.app(scope, receive, tagged_send)
            raised = False
        finally:
            if not logged:  # the last byte never went out
                if raised and not status:  # the app failed before answering (the error handler answers 500)
                    status, fields["outcome"] = 500, "error"
                fields.setdefault("outcome", "abort")  # else the client left mid-way
                self.emit(scope, rid, status, start, fields)

    def emit(self, scope, rid: str, status: int, start: float, fields: dict) -> None:
        if scope["path"] in self.QUIET and status < 400 and "outcome" not in fields:
            return
        if not self.with_text:
            fields = {k: v for k, v in fields.items() if k not in ("prompt", "output")}
        line = {"event": "request", "request_id": rid, "method": scope["method"], "path": scope["path"],
                "status": status, "outcome": outcome_of(status), "latency_s": round(time.perf_counter() - start, 4),
                **fields}
        access_log.info(json.dumps(line, ensure_ascii=False))


def outcome_of(status: int) -> str:
    """How a request that answered ``status`` ended, in ``eyas:requests_total``'s words."""
    if status < 400:
        return "ok"
    return {408: "timeout", 499: "abort", 503: "rejected"}.get(status, "invalid" if status < 500 else "error")
