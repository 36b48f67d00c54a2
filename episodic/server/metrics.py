"""Prometheus metrics of the HTTP API: requests by route template, method and status, and
their latency. Each app has its own registry (two apps in one process do not collide)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

#: what the request observer reports for each request: route template, method, status, seconds
Observe = Callable[[str, str, int, float], None]


@dataclass(frozen=True, slots=True)
class Meters:
    """What the middlewares report to: ``observe`` each request (the access log's
    middleware: one middleware observes each request once), ``refused`` each request the
    in-flight limit turned away."""

    observe: Observe
    refused: Callable[[], None]


def instrument(app: FastAPI) -> Meters:
    """Serve the figures at ``/metrics``; returns what counts them."""
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
    refusals = Counter(
        "episodic_http_overloaded",
        "Requests refused with 503 because the in-flight limit was reached",
        registry=registry,
    )

    def observe(route: str, method: str, status: int, elapsed: float) -> None:
        requests.labels(route, method, str(status)).inc()
        seconds.labels(route, method).observe(elapsed)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Meters(observe, refusals.inc)
