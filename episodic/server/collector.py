"""The cyclic garbage collector, set for a serving process once its app has started.

A context load makes thousands of objects that hold no cycles and die with the response
(a message, its dict and its blocks per row). With the default first-generation threshold
(700 allocations) a 200-message load sets off several collections, each scanning objects
still alive and promoting them, and the older generations' collections then scan them again;
under wrk at 32 connections the collector took a sixth of a loading server's CPU (py-spy,
issue 35). A threshold of :data:`FIRST_GENERATION` lets most requests end, and their objects
go by reference counting, before a collection starts; :func:`gc.freeze` moves what the
startup made (the app, its schemas, the imported modules) out of every later scan."""

from __future__ import annotations

import gc

#: allocations (net of frees) between first-generation collections, above the ~3,000
#: objects of a 200-message load
FIRST_GENERATION = 10_000


def settle_for_serving() -> None:
    """Collect once, freeze what survives (the startup's objects), raise the first
    generation's threshold; the older generations keep their defaults."""
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(FIRST_GENERATION, second, third)


__all__ = ["FIRST_GENERATION", "settle_for_serving"]
