"""T16: the primary dies under load and its streaming standby is promoted.

The test owns a primary and a hot standby streaming from it (``pg_basebackup -R``, two local
clusters: tests/support_cluster.py). episodic connects through a multi-host URL naming both,
``postgresql://postgres@PRIMARY,STANDBY/postgres``, which asks for a writable host
(``target_session_attrs=read-write``, the default with several hosts: store/engine.py).
8 writers append finished turns to 8 conversations (4 with an idempotency key, each refusal
retried with its key until it is acknowledged; 4 without, an unknown outcome recorded and not
retried), while a compaction worker with the due listener compacts them. Its poll interval is
a minute, so after the failover it compacts only when the listener, listening again on the new
primary, wakes it. After a while the primary is killed (``pg_ctl -m immediate stop``), and
half a second later (a failover manager's decision) the standby is promoted.

Synchronous replication (``synchronous_standby_names='*'``, ``synchronous_commit=on``), pass
criteria: **0 acknowledged appends lost**, 0 duplicated (every keyed append exactly once, an
unacknowledged one 0 or 1 times); only typed errors (``TransientDatabaseError`` and its
subclasses) in the writers and in what the worker logged; every writer acknowledges an append
again, the worker writes a boundary and the listener listens on the new primary, each within
:data:`RESUME_BOUND` seconds of the promotion; per conversation seq 1..n with no gap.

Asynchronous replication (the standby confirms nothing before the commit returns): the same,
except that acknowledged appends may be lost, those the standby had not received when the
primary died. The test measures how many (printed), and checks that what survives is
consistent: gapless seqs, no duplicates, typed errors only.

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
     .venv/bin/pytest tests/reliability/test_t16_failover.py -q -s
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg
import pytest

from episodic import (
    EpisodicError,
    EpisodicStore,
    Message,
    StoredEvent,
    TransientDatabaseError,
)
from episodic.policy import EpisodicCompactionConfig
from episodic.settings import EpisodicSettings
from episodic.worker import CompactionOptions, CompactionWorker
from tests.reliability.sizes import size
from tests.reliability.strategies import FakeSummarizer
from tests.support import LoggedExceptions
from tests.support_cluster import Cluster, replicated_pair

WRITERS = 8
CONVERSATIONS = 8
#: seconds of load on the first primary before it dies
BEFORE = size(2, 10)
#: seconds the standby falls behind before the primary dies (its WAL sender stopped)
LAG = 0.5
#: seconds between the primary's death and the promotion (a failover manager deciding)
DETECTION = 0.5
#: acknowledged appends older than the lag by this much were on the standby (seconds)
LAG_SLACK = 0.2
#: seconds of load on the new primary once every writer has been acknowledged there
AFTER = size(2, 10)
#: writes, compactions and the listener are back on the new primary within this (seconds)
RESUME_BOUND = 10.0
#: how long a keyed writer keeps retrying one append
RETRY_FOR = 30.0
#: an answer long enough that a summary makes the context smaller
ANSWER = " ".join(
    f"line {n} of the answer, with the detail the next turn needs." for n in range(12)
)


@dataclass
class Run:
    #: tag -> (conversation, when), for every acknowledged append
    acked: dict[str, tuple[UUID, float]] = field(default_factory=dict)
    #: tags of appends whose outcome is unknown (an unkeyed one that failed, a keyed one
    #: abandoned after RETRY_FOR)
    unknown: set[str] = field(default_factory=set)
    keyed: set[str] = field(default_factory=set)
    errors: Counter[str] = field(default_factory=Counter)
    untyped: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    promoted_at: float | None = None
    #: per writer, when it was first acknowledged after the promotion
    resumed_at: dict[int, float] = field(default_factory=dict)
    all_resumed: asyncio.Event = field(default_factory=asyncio.Event)


async def _writer(
    index: int, store: EpisodicStore, convs: list[UUID], run: Run, stop: asyncio.Event
) -> None:
    keyed = index % 2 == 0
    number = 0
    while not stop.is_set():
        number += 1
        conv = convs[(index + number) % len(convs)]
        tag = f"w{index}.{number}"
        batch = [Message.user(f"{tag} question"), Message.assistant(f"{tag} {ANSWER}")]
        key = tag if keyed else None
        if keyed:
            run.keyed.add(tag)
        deadline = time.monotonic() + RETRY_FOR
        while True:
            try:
                await store.append(conv, batch, idempotency_key=key)
            except TransientDatabaseError as exc:
                run.errors[type(exc).__name__] += 1
                if key is None or time.monotonic() > deadline:
                    run.unknown.add(tag)
                    break
                await asyncio.sleep(0.05)
                continue
            except EpisodicError as exc:
                run.unexpected.append(f"{tag}: {type(exc).__name__}: {exc}")
                break
            except Exception as exc:
                run.untyped.append(f"{tag}: {type(exc).__name__}: {exc}")
                break
            run.acked[tag] = (conv, time.monotonic())
            if run.promoted_at is not None and index not in run.resumed_at:
                # (the first primary is dead by then: this one was the new primary's)
                run.resumed_at[index] = time.monotonic()
                if len(run.resumed_at) == WRITERS:
                    run.all_resumed.set()
            break
        if key is None and tag in run.unknown:
            await asyncio.sleep(0.05)  # no hot loop while no host takes writes


async def _watch_new_primary(standby: Cluster, since: float) -> dict[str, float]:
    """Seconds from ``since`` until the promoted standby holds a boundary written after the
    promotion, and until a session there listens for due conversations."""
    connection = await asyncpg.connect(
        f"postgresql://postgres@127.0.0.1:{standby.port}/postgres", timeout=10
    )
    try:
        boundaries_then = await connection.fetchval(
            "SELECT count(*) FROM episodic_events WHERE kind = 'boundary'"
        )
        seen: dict[str, float] = {}
        while len(seen) < 2 and time.monotonic() - since < RESUME_BOUND * 3:
            if "boundary" not in seen and boundaries_then < await connection.fetchval(
                "SELECT count(*) FROM episodic_events WHERE kind = 'boundary'"
            ):
                seen["boundary"] = time.monotonic() - since
            if "listener" not in seen and await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'"
            ):
                seen["listener"] = time.monotonic() - since
            await asyncio.sleep(0.05)
        return seen
    finally:
        await connection.close()


def _multi_host_url(primary: Cluster, standby: Cluster) -> str:
    return (
        f"postgresql+asyncpg://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
    )


@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "asynchronous"])
async def test_t16_failover_to_the_promoted_standby(synchronous: bool) -> None:
    with replicated_pair(synchronous=synchronous) as (primary, standby):
        await _failover(primary, standby, synchronous=synchronous)


async def _failover(primary: Cluster, standby: Cluster, *, synchronous: bool) -> None:
    url = _multi_host_url(primary, standby)
    settings = EpisodicSettings(
        _env_file=None, pool_min_size=1, pool_max_size=WRITERS, connect_timeout_seconds=5
    )
    store = await EpisodicStore.open(url, settings=settings)
    worker_store = await EpisodicStore.open(url, settings=settings)
    logged = LoggedExceptions(logging.WARNING)
    logging.getLogger("episodic").addHandler(logged)
    try:
        await store.migrate()
        store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=3)
        convs = [await store.create_conversation() for _ in range(CONVERSATIONS)]
        worker = CompactionWorker(
            worker_store,
            FakeSummarizer(),
            concurrency=2,
            options=CompactionOptions(backoff_base=0.2, backoff_max=1.0),
            lease_seconds=5,
            poll_interval=60,  # after the failover, only the listener wakes it
            worker_id="t16-worker",
        )
        run = Run()
        stop = asyncio.Event()
        worker_task = asyncio.create_task(worker.run())
        writers = [
            asyncio.create_task(_writer(index, store, convs, run, stop)) for index in range(WRITERS)
        ]
        try:
            await asyncio.sleep(BEFORE)
            # The standby falls behind: the primary's WAL sender stops sending. Then the
            # primary dies with it (SIGKILL works on a stopped process; the postmaster takes
            # a child's death for a crash and ends every session), and stays down.
            sender = int(primary.sql("SELECT pid FROM pg_stat_replication"))
            os.kill(sender, signal.SIGSTOP)
            lag_began = time.monotonic()
            try:
                await asyncio.sleep(LAG)
            finally:
                os.kill(sender, signal.SIGKILL)
            await asyncio.to_thread(primary.crash)
            crashed = time.monotonic()
            await asyncio.sleep(DETECTION)
            run.promoted_at = promoted = time.monotonic()
            await asyncio.to_thread(standby.promote)
            promotion = time.monotonic() - promoted
            watch = asyncio.create_task(_watch_new_primary(standby, promoted))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.all_resumed.wait(), RESUME_BOUND)
            await asyncio.sleep(AFTER)
            seen = await watch
        finally:
            stop.set()
            worker.stop()
            escaped = await asyncio.gather(*writers, worker_task, return_exceptions=True)
        run.untyped += [f"escaped: {exc!r}" for exc in escaped if exc is not None]
        run.untyped += [
            f"logged {type(exc).__name__}: {exc}"
            for exc in logged.exceptions
            if not isinstance(exc, EpisodicError)
        ]

        resumed = {index: at - promoted for index, at in run.resumed_at.items()}
        assert len(resumed) == WRITERS, (
            f"{WRITERS - len(resumed)} of {WRITERS} writers never acknowledged on the new "
            f"primary; errors {dict(run.errors)}"
        )

        # What the new primary holds.
        present: Counter[str] = Counter()
        for conv in convs:
            events: list[StoredEvent] = []
            while page := await store.read_events(conv, after_seq=len(events)):
                events += page
            seqs = [event.seq for event in events]
            assert seqs == list(range(1, len(seqs) + 1)), f"{conv}: a gap in {seqs}"
            for event in events:
                message = getattr(event, "message", None)
                if message is not None and message.role == "user":
                    present[message.text.removesuffix(" question")] += 1
        lost = [tag for tag in run.acked if present[tag] != 1]
        lost_before_lag = [tag for tag in lost if run.acked[tag][1] < lag_began - LAG_SLACK]
        in_lag = [tag for tag, (_, at) in run.acked.items() if lag_began <= at <= crashed]
        after = [tag for tag, (_, at) in run.acked.items() if at > crashed]
        duplicated = sorted(tag for tag, count in present.items() if count > 1)
        keyed_unknown = run.unknown & run.keyed
        mode = "synchronous" if synchronous else "asynchronous"
        figures = (
            f"T16 {mode}: {len(run.acked)} appends acknowledged, {len(in_lag)} of them while "
            f"the standby lagged {LAG:g} s before the crash; {len(lost)} lost, "
            f"{len(duplicated)} duplicated, {len(run.unknown)} unknown (unkeyed, 0 or 1 times "
            f"each); errors during the switch {dict(run.errors)}; promotion took "
            f"{promotion:.2f} s, after its start every writer was acknowledged again within "
            f"{max(resumed.values(), default=float('nan')):.2f} s, a boundary written in "
            f"{seen.get('boundary', float('nan')):.2f} s, the listener back in "
            f"{seen.get('listener', float('nan')):.2f} s"
        )
        print("\n" + figures)

        assert run.untyped == [], run.untyped
        assert run.unexpected == [], run.unexpected
        assert set(run.errors) <= {"TransientDatabaseError", "DatabaseUnavailableError"}, figures
        assert duplicated == [], f"{figures}: duplicated {duplicated[:5]}"
        assert keyed_unknown == set(), f"{figures}: keyed appends never acknowledged"
        assert all(present[tag] <= 1 for tag in run.unknown)
        if synchronous:
            assert lost == [], f"{figures}: acknowledged appends lost: {lost[:5]}"
        else:
            # The loss window is the lag: what the standby had before it fell behind survives.
            assert lost_before_lag == [], f"{figures}: lost from before the lag: {lost[:5]}"
        assert max(resumed.values()) < RESUME_BOUND, figures
        assert seen.get("boundary", RESUME_BOUND) < RESUME_BOUND, f"{figures}: no compaction"
        assert seen.get("listener", RESUME_BOUND) < RESUME_BOUND, f"{figures}: no listener"
        assert after, f"{figures}: nothing acknowledged on the new primary"
    finally:
        logging.getLogger("episodic").removeHandler(logged)
        await store.close()
        await worker_store.close()
