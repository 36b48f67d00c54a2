"""Prometheus metrics of the HTTP API: requests by route template, method and status, and
their latency. Each app has its own registry (two apps in one process do not collide)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest


def instrument(app: FastAPI) -> None:
    """Count and time every request, and serve the figures at ``/metrics``."""
    registry = CollectorRegistry()
    requests = Counter(
        "episodic_http_requests",
        "HTTP requests handled, by route template, method and status",
        ("route", "method", "status"),
        registry=registry,
    )
    seconds = Histogram(
        "episodic_http_request_seconds",
        "HTTP request latency, by route template and method",
        ("route", "method"),
        registry=registry,
    )

    @app.middleware("http")
    async def measure(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            # the template, not the path: one series per route, not per conversation
            template = getattr(route, "path", "unmatched")
            requests.labels(template, request.method, str(status)).inc()
            seconds.labels(template, request.method).observe(time.perf_counter() - started)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
