"""Prometheus metrics of a worker process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from episodic.worker.job import JobResult


class WorkerMetrics:
    """Counters and a latency histogram, in a registry of their own (so tests and several
    workers in one process do not collide). :meth:`serve` exposes them over HTTP."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.claimed = Counter(
            "episodic_compactions_claimed", "Conversations claimed", registry=self.registry
        )
        self.outcomes = Counter(
            "episodic_compaction_attempts",
            "Attempts by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "episodic_compaction_seconds",
            "Duration of an attempt",
            buckets=(0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.tokens_saved = Counter(
            "episodic_compaction_tokens_saved",
            "Estimated context tokens removed by boundaries",
            registry=self.registry,
        )

    def observe(self, result: JobResult) -> None:
        self.outcomes.labels(result.outcome).inc()
        self.latency.observe(result.seconds)
        if result.tokens_before is not None and result.tokens_after is not None:
            self.tokens_saved.inc(max(result.tokens_before - result.tokens_after, 0))

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)


__all__ = ["WorkerMetrics"]
