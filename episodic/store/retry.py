"""Retrying transient database failures, where that is safe.

Only operations whose retry cannot change the outcome are retried: reads, and appends that
carry an idempotency key (a retry of one that did commit returns the first result). Anything
else surfaces the :class:`TransientDatabaseError` at once: the caller knows whether its write
may be repeated, the store does not. Conflicts are never retried, and neither are lock
timeouts: the session holding the lock most likely still holds it, and the caller chose how
long it would wait (``lock_timeout_ms``); nor a database that refuses new connections, which a
few milliseconds do not fix (a wrong password, a server that is down), nor one out of disk
space (until someone frees some).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from episodic.errors import (
    DatabaseUnavailableError,
    LockTimeoutError,
    StorageFullError,
    TransientDatabaseError,
)

#: Transient failures that a retry within milliseconds does not cure.
_NOT_RETRIED = (LockTimeoutError, DatabaseUnavailableError, StorageFullError)

T = TypeVar("T")

ATTEMPTS = 3
FIRST_DELAY = 0.05


async def retry_transient(operation: Callable[[], Awaitable[T]], *, safe: bool) -> T:
    """Run ``operation``; when ``safe``, retry a transient failure up to ``ATTEMPTS`` times in
    all, waiting 50 ms, then 100 ms, with ±50% jitter (a pool replaces a dropped connection
    in that time; a longer outage should reach the caller)."""
    delay = FIRST_DELAY
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await operation()
        except TransientDatabaseError as exc:
            if not safe or attempt == ATTEMPTS or isinstance(exc, _NOT_RETRIED):
                raise
        await asyncio.sleep(delay * random.uniform(0.5, 1.5))
        delay *= 2
    raise AssertionError("unreachable")


__all__ = ["ATTEMPTS", "retry_transient"]
