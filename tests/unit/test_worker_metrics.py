"""The worker's Prometheus metrics count what its attempts did and are served over HTTP."""

from __future__ import annotations

import socket
import urllib.request

from episodic.worker import JobResult, WorkerMetrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_outcomes_latency_and_tokens_saved_are_counted() -> None:
    metrics = WorkerMetrics()
    metrics.claimed.inc(3)
    metrics.observe(JobResult("succeeded", tokens_before=10_000, tokens_after=1_500, seconds=0.4))
    metrics.observe(JobResult("failed", tokens_before=9_000, error="503", seconds=2.0))
    metrics.observe(JobResult("dead", error="401", seconds=0.1))
    value = metrics.registry.get_sample_value
    assert value("episodic_compactions_claimed_total") == 3
    assert value("episodic_compaction_attempts_total", {"outcome": "succeeded"}) == 1
    assert value("episodic_compaction_attempts_total", {"outcome": "failed"}) == 1
    assert value("episodic_compaction_attempts_total", {"outcome": "dead"}) == 1
    assert value("episodic_compaction_tokens_saved_total") == 8_500
    assert value("episodic_compaction_seconds_count") == 3


def test_metrics_are_served() -> None:
    metrics = WorkerMetrics()
    metrics.observe(JobResult("succeeded", tokens_before=100, tokens_after=40, seconds=0.1))
    port = _free_port()
    metrics.serve(port, address="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert 'episodic_compaction_attempts_total{outcome="succeeded"} 1.0' in body
    assert "episodic_compaction_tokens_saved_total 60.0" in body
