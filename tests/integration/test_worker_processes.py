"""Real ``episodic worker`` processes on PostgreSQL: sharing a queue, SIGKILL, SIGSTOP past the
lease (zombie fencing), no idle-in-transaction session while a summarizer call runs, and SIGTERM.

RELIABILITY.md T4, T6 and T7 in spirit, at CI sizes that fit a 2-core machine.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from episodic import EpisodicStore
from episodic.policy import EpisodicCompactionConfig
from tests.conftest import isolated_settings
from tests.integration.worker_processes import (
    TimedOpenAIServer,
    WorkerProcess,
    WorkerProcesses,
    boundaries_of,
    create_due_conversation,
    message_rows,
    wait_until,
)
from tests.support_openai import Reply, chat_completion

pytestmark = pytest.mark.postgres_only

#: EPISODIC_* settings for workers that call the fake OpenAI server
OPENAI = {"summarizer": "openai", "summarizer_model": "fake-model", "summarizer_api_key": "k"}


@pytest.fixture
def workers(postgres_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    """Starts workers on the test database; kills every one of them afterwards (before the
    database is dropped)."""
    started = WorkerProcesses(postgres_url, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[EpisodicStore]:
    """A store whose appends make a conversation due after two user messages."""
    opened = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    opened.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
    try:
        yield opened
    finally:
        await opened.close()


async def _head(db: asyncpg.Connection, conversation: UUID) -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT *, now() AS database_now FROM episodic_conversations WHERE conversation_id = $1",
        conversation,
    )
    assert row is not None
    return row


async def _attempts(db: asyncpg.Connection, conversation: UUID) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT * FROM episodic_compaction_attempts WHERE conversation_id = $1 "
            "ORDER BY finished_at",
            conversation,
        )
    )


def _pid_of(worker_id: str) -> int:
    """A worker id is ``host:pid:random``."""
    return int(worker_id.rsplit(":", 2)[1])


# ---- 1. three processes share 200 due conversations ------------------------------------------


async def test_three_workers_compact_200_conversations_exactly_once(
    postgres_url: str, workers: WorkerProcesses, store: EpisodicStore, db: asyncpg.Connection
) -> None:
    procs = [
        workers.start(f"worker-{n}", worker_concurrency=4, poll_interval_seconds=0.2)
        for n in range(3)
    ]
    for proc in procs:
        await proc.wait_started()
    # Made due while all three run: every append's NOTIFY wakes all of them at once.
    semaphore = asyncio.Semaphore(8)

    async def create(n: int) -> UUID:
        async with semaphore:
            return await create_due_conversation(store, f"conversation {n}")

    conversations = await asyncio.gather(*(create(n) for n in range(200)))
    assert len(set(conversations)) == 200

    async def drained() -> bool:
        status = await store.compaction_status()
        return status.due == 0 and status.leased == 0

    await wait_until(drained, within=60, what="all 200 to be compacted", describe=workers.logs)
    status = await store.compaction_status()
    assert (status.due, status.leased, status.failing, status.dead) == (0, 0, 0, 0)

    per_conversation = {
        row["conversation_id"]: row["boundaries"]
        for row in await db.fetch(
            "SELECT conversation_id, count(*) AS boundaries FROM episodic_events "
            "WHERE kind = 'boundary' GROUP BY conversation_id"
        )
    }
    assert set(per_conversation) == set(conversations)
    duplicated = {cid: n for cid, n in per_conversation.items() if n != 1}
    assert not duplicated, f"conversations with more than one boundary: {duplicated}"
    same_cut = await db.fetch(
        "SELECT conversation_id, payload::jsonb ->> 'covers_through_seq' AS covers, count(*) "
        "FROM episodic_events WHERE kind = 'boundary' GROUP BY 1, 2 HAVING count(*) > 1"
    )
    assert not same_cut, f"boundaries written twice: {same_cut}"
    cuts = Counter(
        row["covers"]
        for row in await db.fetch(
            "SELECT (payload::jsonb ->> 'covers_through_seq')::int AS covers, "
            "payload::jsonb ->> 'summary' AS summary FROM episodic_events WHERE kind = 'boundary'"
        )
        if row["summary"].strip()
    )
    assert cuts == {4: 200}  # a non-empty summary through the last message, everywhere

    attempts = await db.fetch(
        "SELECT conversation_id, outcome, worker, boundary_seq FROM episodic_compaction_attempts"
    )
    outcomes = Counter(row["outcome"] for row in attempts)
    assert outcomes == {"succeeded": 200}, outcomes
    succeeded = Counter(row["conversation_id"] for row in attempts if row["outcome"] == "succeeded")
    assert set(succeeded) == set(conversations)
    assert set(succeeded.values()) == {1}
    assert all(row["boundary_seq"] == 5 for row in attempts)

    by_worker = Counter(row["worker"] for row in attempts)
    pids = {proc.pid for proc in procs}
    assert {_pid_of(worker) for worker in by_worker} <= pids
    assert len(by_worker) >= 2, f"one worker did everything: {by_worker}"
    print(f"\nconversations per worker: {sorted(by_worker.values(), reverse=True)}")


# ---- 2. SIGKILL while the summarizer call is in flight ---------------------------------------


async def test_a_worker_killed_mid_call_is_taken_over_after_its_lease(
    workers: WorkerProcesses, store: EpisodicStore, db: asyncpg.Connection
) -> None:
    async with TimedOpenAIServer(default=chat_completion("B's handoff: quarterly sales")) as server:
        server.add(Reply(200, chat_completion("A's handoff, never delivered"), delay=60))
        conversation = await create_due_conversation(store, "killed")
        raw_before = await message_rows(db, conversation)

        a = workers.start(
            "A",
            **OPENAI,
            summarizer_base_url=server.base_url,
            # A is killed inside its call: a timeout it cannot reach first, however long the
            # (loaded) test takes between seeing the request and the kill.
            summarizer_timeout=60,
            lease_seconds=3,
            poll_interval_seconds=0.1,
        )
        a_id = await a.wait_started()
        await wait_until(
            lambda: len(server.requests) == 1,
            within=15,
            what="A's summarizer request",
            describe=workers.logs,
        )
        a.send(signal.SIGKILL)
        assert await a.wait_exit(within=5) == -signal.SIGKILL
        held = await _head(db, conversation)
        assert held["lease_owner"] == a_id
        assert held["due_since"] is not None

        b = workers.start(
            "B",
            **OPENAI,
            summarizer_base_url=server.base_url,
            summarizer_timeout=5,
            lease_seconds=20,
            poll_interval_seconds=0.1,
        )
        b_id = await b.wait_started()

        async def compacted() -> bool:
            return bool(await boundaries_of(db, conversation))

        await wait_until(compacted, within=20, what="B's boundary", describe=workers.logs)

    [boundary] = await boundaries_of(db, conversation)
    assert boundary["created_at"] >= held["lease_expires_at"], "taken over before the lease ended"
    assert boundary["summary"].strip()
    assert "B's handoff: quarterly sales" in boundary["summary"]
    assert "never delivered" not in boundary["summary"]
    assert boundary["covers_through_seq"] == 4
    assert len(server.requests) == 2
    [attempt] = await _attempts(db, conversation)  # A was killed before recording anything
    assert (attempt["worker"], attempt["outcome"]) == (b_id, "succeeded")
    assert attempt["boundary_seq"] == boundary["seq"]
    head = await _head(db, conversation)
    assert head["lease_token"] is None
    assert head["due_since"] is None
    assert await message_rows(db, conversation) == raw_before


# ---- 3. zombie fencing: SIGSTOP past the lease, SIGCONT after the takeover -------------------


async def test_a_worker_paused_past_its_lease_has_its_late_write_refused(
    workers: WorkerProcesses, store: EpisodicStore, db: asyncpg.Connection
) -> None:
    """Two variants, alternated: B has already written its boundary when A resumes (A's write
    is refused on the boundary it expected), or B still holds the lease (refused on the lease).
    Either way A's attempt is recorded as ``lease_lost`` and there is exactly one boundary."""
    lease = 2.0
    async with TimedOpenAIServer(default=chat_completion("unexpected extra request")) as server:
        a = workers.start(
            "A",
            **OPENAI,
            summarizer_base_url=server.base_url,
            summarizer_timeout=30,  # A's call must not time out while it is stopped
            lease_seconds=lease,
            poll_interval_seconds=0.1,
            worker_concurrency=1,
        )
        b = workers.start(
            "B",
            **OPENAI,
            summarizer_base_url=server.base_url,
            # B's answer may be held until A's late attempt is recorded: room for a slow A.
            summarizer_timeout=20,
            lease_seconds=45,
            poll_interval_seconds=0.1,
            worker_concurrency=1,
        )
        await a.wait_started()
        await b.wait_started()
        b.send(signal.SIGSTOP)  # only A may claim at first
        try:
            for repeat in range(ZOMBIE_REPEATS):
                await _zombie_round(
                    server, a, b, store, db, repeat=repeat, lease=lease, b_holds=repeat % 2 == 1
                )
        finally:
            a.send(signal.SIGCONT)
            b.send(signal.SIGCONT)
        assert len(server.requests) == 2 * ZOMBIE_REPEATS  # no extra request: nobody retried


ZOMBIE_REPEATS = 4


async def _zombie_round(
    server: TimedOpenAIServer,
    a: WorkerProcess,
    b: WorkerProcess,
    store: EpisodicStore,
    db: asyncpg.Connection,
    *,
    repeat: int,
    lease: float,
    b_holds: bool,
) -> None:
    """A claims and is stopped mid-call (B is stopped meanwhile); B resumes, claims after A's
    lease and, unless ``b_holds``, completes; A resumes and must be refused. The replies are
    released by the test, not by timers, so the order holds on a loaded machine too."""
    assert a.worker_id is not None
    assert b.worker_id is not None
    a_id, b_id = a.worker_id, b.worker_id

    def describe() -> str:
        return f"{a.log_tail()}\n{b.log_tail()}"

    # A's answer is released once A is stopped (A reads it when it resumes); B's, when B must
    # still hold the lease as A resumes, only once A's late attempt is recorded.
    a_answer, b_answer = asyncio.Event(), asyncio.Event()
    server.add(Reply(200, chat_completion(f"A's late handoff {repeat}"), hold=a_answer))
    server.add(
        Reply(200, chat_completion(f"B's handoff {repeat}"), hold=b_answer if b_holds else None)
    )
    seen = len(server.requests)
    conversation = await create_due_conversation(store, f"zombie {repeat}")
    raw_before = await message_rows(db, conversation)

    async def boundary_written() -> bool:
        return bool(await boundaries_of(db, conversation))

    async def a_recorded() -> bool:
        return any(row["worker"] == a_id for row in await _attempts(db, conversation))

    await wait_until(
        lambda: len(server.requests) == seen + 1,
        within=15,
        what="A's request",
        describe=describe,
    )
    a.send(signal.SIGSTOP)
    stopped_at = time.monotonic()
    a_answer.set()
    held = await _head(db, conversation)
    assert held["lease_owner"] == a_id

    b.send(signal.SIGCONT)
    await wait_until(
        lambda: len(server.requests) == seen + 2,
        within=15,
        what="B's request after A's lease",
        describe=describe,
    )
    if b_holds:
        taken = await _head(db, conversation)
        assert taken["lease_owner"] == b_id
        assert taken["compaction_attempts"] == 2  # both claims counted
        assert not await boundaries_of(db, conversation)
    else:
        await wait_until(boundary_written, within=15, what="B's boundary")
    # A's lease runs on the database's clock from A's claim (before the test could stop A),
    # so "paused past its lease" is judged there: the database's now() as A resumes.
    resuming = await _head(db, conversation)
    assert resuming["database_now"] >= held["lease_expires_at"], (resuming, held)
    paused = time.monotonic() - stopped_at
    a.send(signal.SIGCONT)
    await wait_until(a_recorded, within=15, what="A's attempt row", describe=a.log_tail)
    b_answer.set()
    await wait_until(boundary_written, within=15, what="B's boundary", describe=b.log_tail)
    b.send(signal.SIGSTOP)

    [boundary] = await boundaries_of(db, conversation)
    assert f"B's handoff {repeat}" in boundary["summary"]
    rows = await _attempts(db, conversation)
    by_worker = {row["worker"]: row for row in rows}
    assert len(rows) == 2, rows
    assert set(by_worker) == {a_id, b_id}, rows
    assert by_worker[a_id]["outcome"] == "lease_lost"
    assert by_worker[a_id]["boundary_seq"] is None
    # Whether B still holds the lease or has already written, A is refused on the lease
    # (LeaseLostError): plan_boundary checks the lease before anything else.
    error = by_worker[a_id]["error"]
    assert "expired or was taken over" in error, error
    refusal = "lease"
    assert by_worker[b_id]["outcome"] == "succeeded"
    assert by_worker[b_id]["boundary_seq"] == boundary["seq"]
    assert await message_rows(db, conversation) == raw_before
    print(f"\nround {repeat}: A paused {paused:.2f} s (lease {lease:g} s); refused: {refusal}")


# ---- 4. no session idle in transaction while the summarizer runs -----------------------------

# Not Citus's own connections (application_name "citus_internal gpid=..."): its maintenance
# daemon recovers two-phase commits over one to the coordinator itself, a transaction of its
# own at any moment. A worker's transaction would show on the worker's own session anyway.
SAMPLE = """
SELECT pid, state, xact_start IS NOT NULL AS in_transaction,
       extract(epoch FROM clock_timestamp() - state_change) AS state_seconds, query
  FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND backend_type = 'client backend'
   AND coalesce(application_name, '') NOT LIKE 'citus\\_internal gpid=%'
"""


async def test_no_session_idles_in_a_transaction_during_a_slow_summarizer(
    workers: WorkerProcesses, store: EpisodicStore, db: asyncpg.Connection
) -> None:
    calls, in_flight_samples = 4, 20
    conversations = [await create_due_conversation(store, f"slow {n}") for n in range(calls)]
    ours = {row["pid"] for row in await db.fetch(SAMPLE)}  # the test's own store
    samples: list[tuple[bool, list[asyncpg.Record]]] = []
    # The answers wait for the test: every sample taken between the last request's arrival and
    # the release is taken with all the calls in flight, however slowly the machine runs.
    release = asyncio.Event()
    async with TimedOpenAIServer(
        default=Reply(200, chat_completion("a slow handoff"), hold=release)
    ) as server:

        async def all_compacted() -> bool:
            count = await db.fetchval(
                "SELECT count(*) FROM episodic_events WHERE kind = 'boundary'"
            )
            return bool(count == calls)

        worker = workers.start(
            "slow",
            **OPENAI,
            summarizer_base_url=server.base_url,
            summarizer_timeout=60,  # the test, not a timeout, ends the calls
            lease_seconds=150,
            worker_concurrency=calls,
        )
        deadline = time.monotonic() + 60
        while not await all_compacted():
            assert time.monotonic() < deadline, workers.logs()
            all_in_flight = len(server.requests) == calls and not release.is_set()
            samples.append((all_in_flight, list(await db.fetch(SAMPLE))))
            if sum(flag for flag, _ in samples) >= in_flight_samples:
                release.set()
            await asyncio.sleep(0.1)
        assert len(server.requests) == calls

    in_flight = [rows for flag, rows in samples if flag]
    in_transaction = [row for rows in in_flight for row in rows if row["in_transaction"]]
    idle_in_transaction = [
        row for _, rows in samples for row in rows if row["state"].startswith("idle in transaction")
    ]
    longest = max((float(row["state_seconds"]) for row in idle_in_transaction), default=0.0)
    sessions = {row["pid"] for _, rows in samples for row in rows} - ours
    figures = (
        f"{len(samples)} samples, {len(in_flight)} with all {calls} calls in flight, "
        f"{len(sessions)} worker sessions seen, {len(idle_in_transaction)} idle-in-transaction "
        f"sightings (longest {longest * 1000:.1f} ms)"
    )
    print(f"\n{figures}")
    assert len(in_flight) == in_flight_samples, figures
    assert all({row["pid"] for row in rows} - ours for rows in in_flight), (
        f"the sampler saw no worker session: {figures}"
    )
    assert not in_transaction, f"transactions open during the summarizer calls: {figures}"
    # Between the statements of write_boundary's transaction a session is briefly (about a
    # millisecond) idle in transaction, and a 10 Hz sampler sometimes sees it: the bound is
    # RELIABILITY.md T7's, none for more than 1 s.
    assert longest <= 1.0, f"a session idled in a transaction: {idle_in_transaction}; {figures}"
    for conversation in conversations:
        assert len(await boundaries_of(db, conversation)) == 1
    assert worker.alive()


# ---- 5. SIGTERM: finish within the grace period, or release the lease ------------------------


async def _sigterm_mid_call(
    workers: WorkerProcesses,
    server: TimedOpenAIServer,
    *,
    grace: float,
    calls: int = 1,
    release: asyncio.Event | None = None,
    exit_within: float | None = None,
) -> tuple[str, int, float, float]:
    """Start a worker, wait until ``calls`` summarizer requests are in flight, SIGTERM it (and
    once it says it is stopping, set ``release``); return its id, its exit code, and when
    (``time.monotonic()``) the signal was sent and the exit seen."""
    worker = workers.start(
        "terminated",
        **OPENAI,
        summarizer_base_url=server.base_url,
        summarizer_timeout=30,
        lease_seconds=60,
        shutdown_grace_seconds=grace,
        poll_interval_seconds=0.1,
        worker_concurrency=calls,
    )
    worker_id = await worker.wait_started()
    await wait_until(
        lambda: len(server.requests) == calls,
        within=15,
        what="the summarizer requests",
        describe=workers.logs,
    )
    # Read the clock before the signal: the worker's grace period cannot start earlier, so
    # exit - sent is never less than the grace, however long the test takes to send it.
    sent = time.monotonic()
    worker.send(signal.SIGTERM)
    if release is not None:
        await wait_until(
            lambda: "stopping:" in worker.log(),
            within=15,
            what="the worker to start stopping",
            describe=worker.log_tail,
        )
        release.set()
    code = await worker.wait_exit(within=exit_within if exit_within is not None else grace + 5)
    assert "stopped" in worker.log(), worker.log_tail()
    return worker_id, code, sent, time.monotonic()


#: slack for a ">= grace" comparison of two reads of the one monotonic clock (asyncio may fire a
#: timer up to its clock resolution early; float rounding)
CLOCK_GRANULARITY = 0.001


async def test_sigterm_past_the_grace_period_releases_the_lease(
    workers: WorkerProcesses, store: EpisodicStore, db: asyncpg.Connection
) -> None:
    grace = 1.0
    conversation = await create_due_conversation(store, "terminated")
    async with TimedOpenAIServer(default=Reply(200, chat_completion("too late"), delay=30)) as srv:
        worker_id, code, sent, exited = await _sigterm_mid_call(workers, srv, grace=grace)
    assert code == 0
    print(f"\nexited {exited - sent:.2f} s after SIGTERM (grace {grace:g} s), lease released")
    # The worker waits the whole grace after the signal (sent is read before it), so >= holds
    # exactly; the upper bound is liveness: the release and exit take well under 5 s.
    assert grace - CLOCK_GRANULARITY <= exited - sent <= grace + 5, exited - sent
    head = await _head(db, conversation)
    assert head["lease_token"] is None
    assert head["lease_owner"] is None
    assert head["due_since"] is not None
    assert head["dead_since"] is None
    assert head["next_attempt_at"] <= head["database_now"]  # another worker may take it now
    assert not await boundaries_of(db, conversation)
    [attempt] = await _attempts(db, conversation)
    assert (attempt["worker"], attempt["outcome"]) == (worker_id, "released")
    assert attempt["error"] == "the worker shut down before the attempt finished"
    [claim] = await store.claim_due("probe", limit=5, lease_seconds=1)
    assert claim.conversation_id == conversation


async def test_sigterm_within_the_grace_period_lets_the_call_finish(
    workers: WorkerProcesses, store: EpisodicStore, db: asyncpg.Connection
) -> None:
    # The answer is released only once the worker says it is stopping, so it was signalled
    # mid-call whatever the load; a grace far beyond the exit bound shows that it left as soon
    # as the call finished, not when the grace ran out.
    grace, exit_within = 60.0, 20.0
    release = asyncio.Event()
    conversation = await create_due_conversation(store, "finishing")
    async with TimedOpenAIServer(default=Reply(200, chat_completion("done"), hold=release)) as srv:
        worker_id, code, sent, exited = await _sigterm_mid_call(
            workers, srv, grace=grace, release=release, exit_within=exit_within
        )
        [answered_at] = srv.answers
    assert code == 0
    print(f"\nexited {exited - sent:.2f} s after SIGTERM (grace {grace:g} s), call finished")
    assert sent < answered_at <= exited  # signalled mid-call, and it waited for the answer
    assert exited - sent < grace, exited - sent  # but not for the whole grace period
    [boundary] = await boundaries_of(db, conversation)
    assert "\ndone\n" in boundary["summary"]
    [attempt] = await _attempts(db, conversation)
    assert (attempt["worker"], attempt["outcome"]) == (worker_id, "succeeded")
    head = await _head(db, conversation)
    assert head["lease_token"] is None
    assert head["due_since"] is None


async def test_sigterm_releases_every_in_flight_lease(
    workers: WorkerProcesses, store: EpisodicStore, db: asyncpg.Connection
) -> None:
    calls = 3
    conversations = [await create_due_conversation(store, f"terminated {n}") for n in range(calls)]
    async with TimedOpenAIServer(default=Reply(200, chat_completion("too late"), delay=30)) as srv:
        _, code, _, _ = await _sigterm_mid_call(workers, srv, grace=0.5, calls=calls)
    assert code == 0
    outcomes: dict[UUID, Any] = {}
    for conversation in conversations:
        head = await _head(db, conversation)
        outcomes[conversation] = (
            head["lease_token"] is None,
            [row["outcome"] for row in await _attempts(db, conversation)],
        )
    assert all(value == (True, ["released"]) for value in outcomes.values()), outcomes
