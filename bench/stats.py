"""Timing summaries."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Latency:
    """Per-call latencies of one measurement window, in seconds."""

    samples: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] * 1000

    @property
    def per_second(self) -> float:
        """Calls per second if run back to back (1 / mean latency)."""
        return len(self.samples) / sum(self.samples)


@dataclass(frozen=True, slots=True)
class Throughput:
    messages: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds

    @staticmethod
    def total(runs: list[Throughput]) -> Throughput:
        return Throughput(sum(r.messages for r in runs), sum(r.seconds for r in runs))


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal positive pieces (fewer when ``total`` is small)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
