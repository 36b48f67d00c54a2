"""How long a failed compaction waits before its next attempt."""

from __future__ import annotations

import random

JITTER = 0.1


def backoff_delay(
    attempt: int, *, base: float, maximum: float, rng: random.Random | None = None
) -> float:
    """Exponential backoff with ±10% jitter: ``base * 2**(attempt-1)``, capped at
    ``maximum``. Jitter keeps workers that failed together from retrying together."""
    delay = min(base * 2.0 ** max(attempt - 1, 0), maximum)
    low, high = 1 - JITTER, 1 + JITTER
    factor = rng.uniform(low, high) if rng is not None else random.uniform(low, high)
    return delay * factor


__all__ = ["JITTER", "backoff_delay"]
