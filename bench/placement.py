"""Where a latency workload runs: this process on one core, the database backends it talks to
on another.

A sequential append is a round trip: the client waits for its backend, the backend for its
client. On a machine whose cores the two share, the scheduler decides, per connection and per
run, whether a client and the backend it waits on sit on one core (their work then queues up)
or on two, and measured here that moves one store's round trip by ~100 µs while the other's
stays put: raw asyncpg and episodic alternating in blocks, unpinned, gave 222 vs 477 µs a
sequential append; with this process on core 0 and both backends on core 1, 247 vs 378. So
the sequential workload runs both ways: as the scheduler places it, and pinned, with both
stores' backends on the same core away from the client, as in production where the database
has a host of its own. Pinning needs the server on this machine and the right to set its
processes' affinity (root, or the server's user); elsewhere the pinned run is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import asyncpg

#: The database's client backends, to pin (those of this benchmark's throwaway database).
BACKENDS = """
SELECT pid FROM pg_stat_activity
 WHERE datname = current_database() AND backend_type = 'client backend'
"""


def cores() -> tuple[set[int], set[int]] | None:
    """(this process's core, the backends' cores), or None where there are not two cores
    to split or no affinity to set."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    return {allowed[0]}, set(allowed[1:])


async def pin_backends(url: str, server: set[int]) -> list[int] | None:
    """Pin every client backend of ``url``'s database to ``server``; the pids pinned, or
    None when the server is not on this machine or refuses."""
    conn = await asyncpg.connect(url)
    try:
        pids = [row["pid"] for row in await conn.fetch(BACKENDS)]
    finally:
        await conn.close()
    try:
        for pid in pids:
            os.sched_setaffinity(pid, server)
    except (PermissionError, ProcessLookupError):
        return None
    return pids


def unpin_backends(pids: list[int]) -> None:
    everywhere = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    for pid in pids:
        with suppress(OSError):  # gone with its connection
            os.sched_setaffinity(pid, everywhere)


@contextmanager
def client_on(core: set[int]) -> Iterator[None]:
    """This process on ``core`` for the block, then wherever it was allowed before."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, core)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
