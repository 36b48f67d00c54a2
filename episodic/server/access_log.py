"""The one middleware that observes each request: its metrics (``observe``) and its access
log line, one JSON object on the ``episodic.access`` logger with what an operator filters on
(route template, status, latency, tenant, key, request id).
The request id comes from ``X-Request-ID`` when the client (or a proxy) sends one, and is
echoed back either way, so a client's report and the server's log line can be matched."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response

from episodic.server.metrics import Observe

logger = logging.getLogger("episodic.access")
REQUEST_ID = "X-Request-ID"
#: a client's request id is kept only when it is this short (it goes into every log line)
MAX_REQUEST_ID = 200


def request_id_of(request: Request) -> str | None:
    """The id :func:`observe_requests` gave the request (None before it ran)."""
    found = getattr(request.state, "request_id", None)
    return found if isinstance(found, str) else None


def observe_requests(app: FastAPI, observe: Observe) -> None:
    """Observe every request of ``app``: its metrics, its access log line, and its id (left
    on ``request.state`` for the error handlers, echoed in ``X-Request-ID``)."""

    @app.middleware("http")
    async def access(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        given = request.headers.get(REQUEST_ID, "")
        request_id = given if 0 < len(given) <= MAX_REQUEST_ID else uuid.uuid4().hex
        request.state.request_id = request_id
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            response.headers[REQUEST_ID] = request_id
            return response
        finally:
            elapsed = time.perf_counter() - started
            # the template, not the path: one series per route, not per conversation
            route = getattr(request.scope.get("route"), "path", None)
            observe(route or "unmatched", request.method, status, elapsed)
            if logger.isEnabledFor(logging.INFO):
                key = getattr(request.state, "api_key", None)
                record = {
                    "request_id": request_id,
                    "method": request.method,
                    "route": route,
                    "path": request.url.path,
                    "status": status,
                    "ms": round(elapsed * 1000, 2),
                    "tenant": key.tenant_id if key is not None else None,
                    "key": key.key_id if key is not None else None,
                    "client": request.client.host if request.client is not None else None,
                }
                logger.info(json.dumps(record, separators=(",", ":")))
