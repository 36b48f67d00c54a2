"""T13, timeouts (PostgreSQL): lock_timeout and idle_in_transaction_session_timeout.

Scenario (a), lock contention. A second, raw asyncpg connection holds the conversation's head
row lock (``SELECT ... FROM episodic_conversations WHERE conversation_id = $1 FOR UPDATE``
inside an open transaction). An append through a store opened with ``lock_timeout_ms=500``
waits on that lock (seen in ``pg_stat_activity`` as ``wait_event_type = 'Lock'``). Three
forms of append: unkeyed, keyed by ``idempotency_key``, keyed by ``client_id``. The store
retries transient errors of keyed appends (``episodic/store/retry.py``) and
``LockTimeoutError`` is a ``TransientDatabaseError``, so the time the caller actually waits is
measured, and the number of lock waits the server saw is counted (until commit 739e977 a
keyed append was retried 3 times on a lock timeout: the caller waited ~1.65 s, not 0.5 s).

Pass criteria (a): the append raises ``LockTimeoutError`` (SQLSTATE 55P03, typed) within
``lock_timeout + 0.5 s`` of the call, having waited at least ``lock_timeout`` on the lock, in
exactly one statement (the store does not retry a lock timeout);
0 rows are written (full snapshot of every episodic table before and after); once the lock is
released the same append succeeds at the next seq.

Scenario (b), idle in transaction. A store is opened with ``idle_in_transaction_timeout_ms =
1000`` and claims a conversation's compaction job with ``claim_conversation`` (lease 1.5 s).
Then one of the store's own pooled sessions (so the setting the store applies is the one
tested) opens a transaction, locks the conversation's head row as a worker's commit would,
and goes idle. Concurrently an append waits on that lock. In parallel, on a second
conversation, a raw session with the same server setting claims the job inside its
transaction (raw SQL) and goes idle.

Pass criteria (b): each idle session is terminated by the server (gone from
``pg_stat_activity``) no sooner than the timeout and within ``timeout + 1 s`` of going idle;
the waiting append then succeeds (the lock died with the session); while the store claim's
lease runs ``claim_due`` returns nothing, and afterwards the job is claimed again with
``claimed_at >= lease_expires_at`` and ``attempt`` one higher; the raw claim was rolled back with
its session, so ``claim_due`` takes that job at once, with the attempt count the rolled-back
claim never committed; the store keeps working afterwards (its pool drops the dead connection).

5 repeats in CI, 50 nightly, for both (a) forms and (b).

Run:
    cd /work/main && \\
    EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/pytest tests/reliability/test_t13_timeouts.py -x -q -s
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from episodic import (
    EpisodicSettings,
    EpisodicStore,
    LockTimeoutError,
    Message,
    TransientDatabaseError,
)
from episodic.store.postgres.pool import Pool
from tests.reliability.sizes import size
from tests.support import asyncpg_dsn, snapshot

REPEATS = size(5, 50)
LOCK_TIMEOUT_MS = 500
LOCK_SLACK = 0.5
IDLE_TIMEOUT_MS = 1000
IDLE_SLACK = 1.0
LEASE_SECONDS = 1.5
POLL = 0.02

HOLD_HEAD = (
    "SELECT conversation_id FROM episodic_conversations WHERE conversation_id = $1 FOR UPDATE"
)


@dataclass
class LockWaits:
    """What pg_stat_activity showed while the append waited."""

    samples: int = 0
    #: distinct (pid, query_start) of backends waiting on a Lock: one per statement that waited
    waits: set[tuple[int, datetime]] = field(default_factory=set)


async def _watch_lock_waits(
    monitor: asyncpg.Connection, exclude_pid: int, stop: asyncio.Event
) -> LockWaits:
    """Sample ``monitor``'s view of lock waits until ``stop``. The connection is opened by the
    caller before the append is timed, so its handshake never runs inside the timed window."""
    seen = LockWaits()
    while not stop.is_set():
        rows = await monitor.fetch(
            "SELECT pid, query_start FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            "   AND pid <> $1 AND pid <> pg_backend_pid()",
            exclude_pid,
        )
        seen.samples += 1
        seen.waits.update((r["pid"], r["query_start"]) for r in rows)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL)
    return seen


# ---- (a) lock contention -------------------------------------------------------------------

KEYINGS = ["unkeyed", "idempotency_key", "client_id"]


@pytest.fixture
async def lock_store(postgres_url: str) -> AsyncIterator[EpisodicStore]:
    settings = EpisodicSettings(
        _env_file=None, pool_min_size=1, pool_max_size=2, lock_timeout_ms=LOCK_TIMEOUT_MS
    )
    store = await EpisodicStore.open(postgres_url, settings=settings)
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.parametrize("keying", KEYINGS)
async def test_t13_append_waiting_on_a_held_row_lock_times_out(
    keying: str, postgres_url: str, lock_store: EpisodicStore, record_property: Any
) -> None:
    store = lock_store
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("before")])
    waited: list[float] = []
    lock_waits: list[int] = []
    holder = await asyncpg.connect(asyncpg_dsn(postgres_url))
    monitor = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        for repeat in range(REPEATS):
            message = Message.user(
                f"{keying} repeat {repeat}",
                client_id=f"cid-{repeat}" if keying == "client_id" else None,
            )
            key = f"key-{repeat}" if keying == "idempotency_key" else None
            head = repeat + 1  # last seq before this repeat's append

            transaction = holder.transaction()
            await transaction.start()
            try:
                assert await holder.fetchval(HOLD_HEAD, conv) == conv
                before = await snapshot(postgres_url)
                stop = asyncio.Event()
                watcher = asyncio.create_task(
                    _watch_lock_waits(monitor, holder.get_server_pid(), stop)
                )
                started = time.monotonic()
                try:
                    with pytest.raises(LockTimeoutError) as raised:
                        # bounded, so a lock_timeout that is not applied fails, not hangs
                        await asyncio.wait_for(
                            store.append(conv, [message], idempotency_key=key),
                            LOCK_TIMEOUT_MS / 1000 * 10,
                        )
                finally:
                    elapsed = time.monotonic() - started
                    stop.set()
                    seen = await watcher
                after = await snapshot(postgres_url)
            finally:
                await transaction.rollback()
            waited.append(elapsed)
            lock_waits.append(len(seen.waits))
            context = (
                f"{keying} repeat {repeat}: waited {elapsed:.3f} s, "
                f"{len(seen.waits)} lock waits seen in pg_stat_activity"
            )
            assert isinstance(raised.value, TransientDatabaseError), context
            assert "55P03" in repr(raised.value.__cause__) or isinstance(
                raised.value.__cause__, asyncpg.LockNotAvailableError
            ), context
            assert after == before, f"rows changed while the lock was held: {context}"
            assert seen.waits, f"the append never waited on the lock: {context}"
            # A lock timeout is not retried by the store, keyed or not (episodic/store/retry.py):
            # the server saw exactly one statement wait on the lock.
            assert len(seen.waits) == 1, f"the store retried the lock wait: {context}"
            assert elapsed >= LOCK_TIMEOUT_MS / 1000 - 0.05, f"gave up too early: {context}"
            assert elapsed <= LOCK_TIMEOUT_MS / 1000 + LOCK_SLACK, (
                f"LockTimeoutError came later than lock_timeout + {LOCK_SLACK} s: {context}"
            )
            # The lock is free again: the same append goes through, at the next seq, once.
            [event] = await store.append(conv, [message], idempotency_key=key)
            assert event.seq == head + 1, context
    finally:
        summary = (
            f"T13a {keying}: {len(waited)} lock timeouts, lock_timeout={LOCK_TIMEOUT_MS} ms, "
            f"caller waited min {min(waited, default=0):.3f} s / "
            f"max {max(waited, default=0):.3f} s "
            f"(bound {LOCK_TIMEOUT_MS / 1000 + LOCK_SLACK:.1f} s), lock waits per append "
            f"{sorted(set(lock_waits))}, 0 rows written while held"
        )
        print(summary)
        record_property(f"t13a_{keying}", summary)
        await holder.close()
        await monitor.close()


# ---- (b) idle in transaction -----------------------------------------------------------------


def _pool_of(store: EpisodicStore) -> Pool:
    """The store's own connection pool (a private attribute: the point is to hold one of the
    store's sessions, with the server settings the store applies, idle in a transaction)."""
    pool = getattr(getattr(store, "_backend", None), "_pool", None)
    assert isinstance(pool, Pool), "EpisodicStore._backend._pool is no longer the pool"
    return pool


@dataclass
class Termination:
    pid: int
    idle_since: datetime | None = None
    gone_at: datetime | None = None

    @property
    def after_idle(self) -> float:
        assert self.idle_since is not None
        assert self.gone_at is not None
        return (self.gone_at - self.idle_since).total_seconds()


async def _watch_termination(monitor: asyncpg.Connection, pid: int, deadline: float) -> Termination:
    """Poll pg_stat_activity until ``pid`` is gone; server clock for both ends."""
    seen = Termination(pid)
    while time.monotonic() < deadline:
        row = await monitor.fetchrow(
            "SELECT s.state, s.state_change, clock_timestamp() AS now FROM (SELECT 1) AS one"
            "  LEFT JOIN pg_stat_activity s ON s.pid = $1",
            pid,
        )
        if row["state"] is None:
            seen.gone_at = row["now"]
            return seen
        if row["state"] == "idle in transaction":
            seen.idle_since = row["state_change"]
        await asyncio.sleep(POLL)
    return seen


RAW_CLAIM = """
UPDATE episodic_conversations
   SET lease_owner = $2, lease_token = gen_random_uuid(),
       lease_expires_at = now() + make_interval(secs => $3),
       compaction_attempts = compaction_attempts + 1,
       due_since = COALESCE(due_since, now()), due_reason = 'manual_recovery',
       next_attempt_at = now()
 WHERE conversation_id = $1 AND (lease_expires_at IS NULL OR lease_expires_at <= now())
RETURNING compaction_attempts
"""


async def _idle_store_session(
    store: EpisodicStore, monitor: asyncpg.Connection, conv: UUID
) -> tuple[Termination, float, str]:
    """Hold one of the store's pooled sessions idle in a transaction that locks ``conv``'s head,
    while an append waits on it. Returns the termination, how long the append waited, and how
    the dead session's next statement failed."""
    pool = _pool_of(store)
    async with pool.acquire() as connection:
        pid = connection.get_server_pid()
        transaction = connection.transaction()
        await transaction.start()
        assert await connection.fetchval(HOLD_HEAD, conv) == conv
        deadline = time.monotonic() + IDLE_TIMEOUT_MS / 1000 + 5
        watch = asyncio.create_task(_watch_termination(monitor, pid, deadline))
        started = time.monotonic()
        waiting_append = asyncio.create_task(store.append(conv, [Message.user("after idle")]))
        termination = await watch
        await asyncio.wait_for(waiting_append, 10)
        append_waited = time.monotonic() - started
        failure = "none"
        try:
            await connection.fetchval("SELECT 1")
        except Exception as exc:
            failure = type(exc).__name__
        with contextlib.suppress(Exception):
            await transaction.rollback()
    return termination, append_waited, failure


async def _idle_raw_claim(url: str, monitor: asyncpg.Connection, conv: UUID) -> Termination:
    """A raw session claims ``conv``'s job inside its transaction and goes idle."""
    session = await asyncpg.connect(
        asyncpg_dsn(url),
        server_settings={"idle_in_transaction_session_timeout": str(IDLE_TIMEOUT_MS)},
    )
    try:
        transaction = session.transaction()
        await transaction.start()
        attempts = await session.fetchval(RAW_CLAIM, conv, "raw-worker", 60.0)
        assert attempts == 1
        deadline = time.monotonic() + IDLE_TIMEOUT_MS / 1000 + 5
        return await _watch_termination(monitor, session.get_server_pid(), deadline)
    finally:
        with contextlib.suppress(Exception):
            await session.close(timeout=1)


@pytest.fixture
async def idle_store(postgres_url: str) -> AsyncIterator[EpisodicStore]:
    settings = EpisodicSettings(
        _env_file=None,
        pool_min_size=1,
        pool_max_size=3,
        idle_in_transaction_timeout_ms=IDLE_TIMEOUT_MS,
    )
    store = await EpisodicStore.open(postgres_url, settings=settings)
    try:
        yield store
    finally:
        await store.close()


async def test_t13_idle_in_transaction_session_is_terminated_and_job_reclaimed(
    postgres_url: str, idle_store: EpisodicStore, record_property: Any
) -> None:
    store = idle_store
    timeout = IDLE_TIMEOUT_MS / 1000
    store_kills: list[float] = []
    raw_kills: list[float] = []
    append_waits: list[float] = []
    reclaim_lags: list[float] = []
    refused_early = 0
    failures: set[str] = set()
    monitor = await asyncpg.connect(asyncpg_dsn(postgres_url))
    monitor_raw = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        for repeat in range(REPEATS):
            conv = await store.create_conversation()
            await store.append(conv, [Message.user(f"repeat {repeat}")])
            claim = await store.claim_conversation(conv, "worker-A", lease_seconds=LEASE_SECONDS)
            assert claim is not None
            assert claim.attempt == 1
            # The lease is held: nobody else can take the job now.
            assert await store.claim_due("worker-B", limit=10, lease_seconds=LEASE_SECONDS) == []
            refused_early += 1
            # A second conversation, due (8 unfinished user turns, the default trigger), for
            # the raw session to claim inside its transaction.
            raw_conv = await store.create_conversation()
            await store.append(raw_conv, [Message.user(f"turn {n}") for n in range(8)])

            (termination, append_waited, failure), raw = await asyncio.gather(
                _idle_store_session(store, monitor, conv),
                _idle_raw_claim(postgres_url, monitor_raw, raw_conv),
            )
            failures.add(failure)
            context = f"repeat {repeat}: store session {termination}, raw session {raw}"
            for seen, kills in ((termination, store_kills), (raw, raw_kills)):
                assert seen.gone_at is not None, f"session never terminated: {context}"
                assert seen.idle_since is not None, f"never seen idle in transaction: {context}"
                kills.append(seen.after_idle)
                assert timeout - 0.05 <= seen.after_idle <= timeout + IDLE_SLACK, (
                    f"terminated {seen.after_idle:.3f} s after going idle "
                    f"(timeout {timeout} s + {IDLE_SLACK} s): {context}"
                )
            append_waits.append(append_waited)
            assert append_waited <= timeout + IDLE_SLACK + 0.5, context

            # The raw claim died with its transaction: the job is free now, first attempt.
            taken: dict[UUID, Any] = {}
            polling_since = await monitor.fetchval("SELECT clock_timestamp()")
            deadline = time.monotonic() + LEASE_SECONDS + 5
            while conv not in taken and time.monotonic() < deadline:
                # B never ends these claims: a lease that outlives every repeat (50 nightly),
                # so an earlier repeat's job never turns up again in a later repeat's claims.
                for got in await store.claim_due("worker-B", limit=10, lease_seconds=3600):
                    assert got.conversation_id not in taken, context
                    taken[got.conversation_id] = got
                if conv not in taken:
                    refused_early += 1
                    await asyncio.sleep(POLL)
            assert raw_conv in taken, f"the rolled-back claim still holds: {context}"
            assert taken[raw_conv].attempt == 1, context
            assert conv in taken, f"job not claimed again after its lease: {context}"
            again = taken[conv]
            assert again.attempt == claim.attempt + 1, context
            assert again.claimed_at >= claim.lease_expires_at, (
                f"re-claimed at {again.claimed_at}, before the lease ended at "
                f"{claim.lease_expires_at}: {context}"
            )
            # How long the job waited once it could be claimed and the test was asking for it:
            # from the lease's end, or from the first poll if a slow (loaded) idle phase ran
            # past the lease; both ends on the database's clock.
            claimable = max(claim.lease_expires_at, polling_since)
            lag = (again.claimed_at - claimable).total_seconds()
            reclaim_lags.append(lag)
            assert lag <= 0.5, f"re-claimed {lag:.3f} s after it could be: {context}"
            # The store still works: the dead connection was dropped from its pool.
            [event] = await store.append(conv, [Message.user(f"after repeat {repeat}")])
            assert event.seq == 3, context
    finally:
        summary = (
            f"T13b: {len(store_kills)} store sessions + {len(raw_kills)} raw sessions idle in "
            f"transaction, idle_in_transaction_session_timeout={IDLE_TIMEOUT_MS} ms, terminated "
            f"after {min(store_kills + raw_kills, default=0):.3f}-"
            f"{max(store_kills + raw_kills, default=0):.3f} s "
            f"(bound {timeout + IDLE_SLACK:.1f} s); "
            f"appends waiting on the lock finished within {max(append_waits, default=0):.3f} s; "
            f"jobs re-claimed {min(reclaim_lags, default=0):.3f}-"
            f"{max(reclaim_lags, default=0):.3f} s after claimable ({LEASE_SECONDS} s lease), "
            f"{refused_early} claim_due calls refused while leased; dead session's next "
            f"statement raised {sorted(failures)}"
        )
        print(summary)
        record_property("t13b", summary)
        await monitor.close()
        await monitor_raw.close()
