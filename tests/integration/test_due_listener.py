"""The worker's wake-up survives a lost connection: when the listener's backend is
terminated, it listens again at once, and the next conversation that becomes due still wakes
a worker within a second, not a poll interval later."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg

from episodic import EpisodicStore, Message
from episodic.policy import EpisodicCompactionConfig
from tests.support import asyncpg_dsn
from tests.support_citus import nodes_of


async def _wait_for(condition: Callable[[], bool], within: float) -> float:
    """Seconds until ``condition()`` holds (fails after ``within`` seconds)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within, f"not within {within} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_a_terminated_listener_listens_again_and_still_wakes_a_worker(
    pg_store: EpisodicStore, postgres_url: str
) -> None:
    pg_store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    wakes: list[float] = []
    close = await pg_store.listen_for_due(lambda: wakes.append(time.monotonic()))
    assert close is not None
    # on Citus a listener per node (a delegated append notifies on its conversation's node)
    nodes = await nodes_of(asyncpg_dsn(postgres_url))
    admins = [await asyncpg.connect(node) for node in nodes]
    try:
        first = await pg_store.create_conversation()
        await pg_store.append(first, [Message.user("due at once")])
        await _wait_for(lambda: len(wakes) == 1, within=1.0)

        # each listener's backend: the one session of this database on its node in LISTEN
        terminated = []
        for admin in admins:
            pids = await admin.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
            )
            assert len(pids) == 1
            terminated.append(pids[0]["pid"])
            await admin.execute("SELECT pg_terminate_backend($1::integer)", pids[0]["pid"])
        # listening again wakes the worker once per listener (what became due meanwhile was
        # announced to nobody); then it hears the next conversation become due
        await _wait_for(lambda: len(wakes) == 1 + len(admins), within=1.0)
        for admin, pid in zip(admins, terminated, strict=True):
            relistened = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN%' AND pid <> $1",
                pid,
            )
            assert relistened == 1
        second = await pg_store.create_conversation()
        appended = time.monotonic()
        await pg_store.append(second, [Message.user("due after the reconnect")])
        waited = await _wait_for(lambda: len(wakes) == 2 + len(admins), within=1.0)
        assert wakes[-1] >= appended
        print(f"\nwoken {waited * 1000:.0f} ms after the append that followed the reconnect")
    finally:
        for admin in admins:
            await admin.close()
        await close()
