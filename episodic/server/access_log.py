"""The one middleware that observes each request: its metrics (``observe``) and its access
log line, one JSON object on the ``episodic.access`` logger with what an operator filters on
(route template, status, latency, tenant, key, request id, and the serving process: one
of several with ``episodic serve --workers``).
The request id comes from ``X-Request-ID`` when the client (or a proxy) sends one, and is
echoed back either way, so a client's report and the server's log line can be matched.

A pure ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: that one runs the app in a
task group and passes the response through memory streams, about a third of a ``/healthz``
answer's time (measured with cProfile on a live server, issue 35)."""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import orjson
from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from episodic.server.metrics import Observe

logger = logging.getLogger("episodic.access")
REQUEST_ID = "X-Request-ID"
_REQUEST_ID_HEADER = REQUEST_ID.lower().encode()
#: a client's request id is kept only when it is this short (it goes into every log line)
MAX_REQUEST_ID = 200


def request_id_of(request: Request) -> str | None:
    """The id :class:`ObservedRequests` gave the request (None before it ran)."""
    found = getattr(request.state, "request_id", None)
    return found if isinstance(found, str) else None


class ObservedRequests:
    """Observe every HTTP request: its metrics, its access log line, and its id (left in the
    request's state for the error handlers, echoed in ``X-Request-ID``)."""

    def __init__(self, app: ASGIApp, *, observe: Observe) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _request_id(scope["headers"])
        # Starlette's request.state is this dict: the error handlers find the id there, and
        # the key's dependency leaves the key there for this log line
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = 500
        echoed = (_REQUEST_ID_HEADER, request_id.encode("latin-1"))

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                kept = [h for h in message.get("headers", ()) if h[0] != _REQUEST_ID_HEADER]
                message["headers"] = [*kept, echoed]
            await send(message)

        try:
            await self.app(scope, receive, answer)
        finally:
            elapsed = time.perf_counter() - started
            # the template, not the path: one series per route, not per conversation
            route = getattr(scope.get("route"), "path", None)
            self.observe(route or "unmatched", scope["method"], status, elapsed)
            if logger.isEnabledFor(logging.INFO):
                _log(scope, state, request_id, route, status, elapsed)


def _request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-ID`` when it is short enough and printable, else a new one."""
    for name, value in headers:
        if name == _REQUEST_ID_HEADER:
            given = value.decode("latin-1")
            if 0 < len(given) <= MAX_REQUEST_ID:
                return given
            break
    return uuid.uuid4().hex


def _log(
    scope: Scope,
    state: dict[str, Any],
    request_id: str,
    route: str | None,
    status: int,
    elapsed: float,
) -> None:
    key = state.get("api_key")
    client = scope.get("client")
    record = {
        "request_id": request_id,
        "method": scope["method"],
        "route": route,
        "path": scope.get("root_path", "") + scope["path"],
        "status": status,
        "ms": round(elapsed * 1000, 2),
        "tenant": key.tenant_id if key is not None else None,
        "key": key.key_id if key is not None else None,
        "client": client[0] if client else None,
        "pid": os.getpid(),
    }
    logger.info(orjson.dumps(record).decode())
