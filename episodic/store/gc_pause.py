"""Pausing Python's cyclic garbage collector while a load builds its objects.

Decoding a tail makes thousands of objects that live on (a message and its dict per row).
Each few hundred of them trigger a collection that scans them and frees nothing (they hold no
cycles; reference counting frees them when they go), and those that survive a scan are scanned
again by the older generations' collections, up to a full collection of the process's heap:
measured on a 5,000-message load, ~10 ms of collection per load on average (``python -m
bench.peers``'s process), a third of the load.

The pause never spans an await: while a load waits for the database, other tasks run with
the collector on, so a busy server that always has a load in flight still collects its cycles.
Pauses nest (threads decoding at once): the collector runs again when the last one ends, and
only if it was running when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """The pauses in flight, process-wide like the collector itself."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.resume = False


_PAUSES = _Pauses()


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection in this block (see the module's docstring)."""
    pauses = _PAUSES
    with pauses.lock:
        if pauses.count == 0:
            pauses.resume = gc.isenabled()
            gc.disable()
        pauses.count += 1
    try:
        yield
    finally:
        with pauses.lock:
            pauses.count -= 1
            if pauses.count == 0 and pauses.resume:
                gc.enable()


__all__ = ["collection_paused"]
