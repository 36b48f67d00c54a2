"""T5, backend terminations (RELIABILITY.md), on PostgreSQL.

Scenario: a T1-like workload runs in child processes: W writer processes (one connection
each; the odd ones go through ``store.for_tenant``, as a multi-tenant server would) append
batches of 1 to 3 messages to C conversations, every append keyed (an idempotency key, or
client message ids) and re-sent unchanged after a ``TransientDatabaseError`` until it is
answered; 5% pass a stale ``expected_seq``, 5% the head just read. A reader process loops over
``load_context`` and ``read_events`` (half of them tenant-scoped), and a compaction worker
process (``CompactionWorker``, an instant fake summarizer, 2 s lease) compacts the
conversations as appends make them due (every 6 user messages). Meanwhile a chaos task in the
test process calls ``pg_terminate_backend`` every 200 ms on a random client backend of the
test database (``datname = current_database()``, never its own connection, never another
database). Chaos stops after D seconds; the workload goes on for 3.5 s more, then everything
stops and each writer re-sends, with the same key and batch, every acknowledged append that
met an error on the way (and 20 others). CI: D=20 s (~100 terminations), W=4, C=4; nightly
(``EPISODIC_TEST_NIGHTLY=1``): D=120 s (~600), W=8. One run, fixed seed; two tests judge it.

``test_t5_invariants_hold_under_backend_terminations``, each counted: all T1 invariants (seqs
1..n with 0 gaps and 0 duplicates, boundaries included; stored messages = acknowledged appends
exactly, so 0 lost and 0 duplicated messages; program order; every read a prefix / the context
of a prefix; every ConflictError a real change of head, every stale expected_seq refused);
every re-sent keyed append returns its original seqs; boundaries: covers strictly increasing,
0 duplicates per (conversation, covers_through_seq), non-empty summaries, each with exactly one
succeeded attempt in the ledger and vice versa; 0 leases left expired; the worker's ``run()``
did not fail; the clients' success rate from 2 s after chaos stopped is >= 99%.

``test_t5_clients_see_only_typed_errors``: writers, reader and the worker's attempts see only
typed ``TransientDatabaseError`` or ``ConflictError``, never a driver exception (asyncpg's
untyped "cannot switch to state" and "connection is closed" errors, seen here first, are now
translated). Writers re-send a keyed append after any error, so the invariants above are
judged independently of it.

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
    .venv/bin/pytest tests/reliability/test_t5_terminations.py -q -s
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from episodic import EpisodicStore, Message
from tests.conftest import isolated_settings
from tests.reliability.sizes import seeded, size
from tests.reliability.writers import Children, check_log, recovery
from tests.support import asyncpg_dsn

pytestmark = pytest.mark.postgres_only

SEED = 5
DURATION = size(20, 120)
WRITERS = size(4, 8)
CONVERSATIONS = 4
INTERVAL = 0.2
#: the workload runs on this long after chaos stops; recovery is measured from 2 s on
AFTER = 3.5
RECOVERED_WITHIN = 2.0
LEASE_SECONDS = 2.0
TENANT = "acme"

READER = WRITERS
WORKER = WRITERS + 1

UNTYPED = re.compile(r"((?:asyncpg|builtins|episodic)[\w.]*\.\w+): ")

BACKENDS = """
SELECT pid FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND backend_type = 'client backend'
 ORDER BY pid
"""


async def chaos(dsn: str, seed: int, until: float) -> tuple[int, int]:
    """Every INTERVAL until ``until``: terminate one random client backend of this database
    (not this connection). Returns (attempts, terminations)."""
    rng = seeded(seed)
    conn = await asyncpg.connect(dsn)
    attempts = terminated = 0
    try:
        tick = time.monotonic()
        while True:
            tick += INTERVAL
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
            if time.monotonic() >= until:
                return attempts, terminated
            pids = [row["pid"] for row in await conn.fetch(BACKENDS)]
            if pids:
                attempts += 1
                terminated += bool(
                    await conn.fetchval("SELECT pg_terminate_backend($1)", rng.choice(pids))
                )
    finally:
        await conn.close()


async def read_all(store: EpisodicStore, conversation: UUID) -> list[Any]:
    events: list[Any] = []
    while True:
        page = await store.read_events(
            conversation, after_seq=events[-1].seq if events else 0, limit=10_000
        )
        events += page
        if len(page) < 10_000:
            return events


@dataclass
class Outcome:
    """One run of the scenario and what its checks found."""

    summary: str
    #: broken invariants (T1, boundaries, leases, re-sends, recovery)
    violations: list[str]
    #: exceptions clients (writers, reader, the worker's attempts) saw that were not typed
    #: TransientDatabaseError / ConflictError
    untyped: list[str]


_RUN: dict[str, Outcome | BaseException] = {}


async def scenario(postgres_url: str) -> Outcome:
    """The scenario, run once per module: both tests below judge the same run (and a run
    that broke down breaks both)."""
    if "run" not in _RUN:
        try:
            _RUN["run"] = await _run(postgres_url)
        except Exception as exc:
            _RUN["run"] = exc
            raise
    run = _RUN["run"]
    if isinstance(run, BaseException):
        raise AssertionError(f"the T5 scenario failed: {run!r}") from run
    return run


async def _run(postgres_url: str) -> Outcome:
    store = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    conversations: list[UUID] = []
    seeds: list[list[tuple[int, str, str]]] = []
    try:
        for conv in range(CONVERSATIONS):
            cid = await store.create_conversation(tenant_id=TENANT)
            [event] = await store.append(cid, [Message.user(f"c{conv}seed")])
            conversations.append(cid)
            seeds.append([(event.seq, "user", f"c{conv}seed")])
    finally:
        await store.close()  # no idle connection of ours for the chaos to hit

    began = time.monotonic()
    children = Children(WRITERS + 2, parties=WRITERS + 3)
    common = {"url": postgres_url, "seed": SEED, "conversations": [str(c) for c in conversations]}
    try:
        for writer in range(WRITERS):
            children.submit(
                writer,
                {
                    "kind": "t1_writer",
                    "writer": writer,
                    "keyed": True,
                    "timed": True,
                    "trigger_turns": 6,
                    # odd writers go through store.for_tenant, as a multi-tenant server would
                    "scoped": writer % 2 == 1,
                    "tenant": TENANT,
                    **common,
                },
            )
        children.submit(READER, {"kind": "reader", "reader": 0, "tenant": TENANT, **common})
        children.submit(WORKER, {"kind": "worker", "lease_seconds": LEASE_SECONDS, **common})
        try:
            await children.wait_barrier()
            started = time.monotonic()
            attempts, terminated = await chaos(asyncpg_dsn(postgres_url), SEED, started + DURATION)
            calm = time.monotonic()
            await asyncio.sleep(AFTER)
            ended = time.monotonic()
            children.stop.set()
            writers = [await children.result(w) for w in range(WRITERS)]
            reader = await children.result(READER)
            worker = await children.result(WORKER)
            collected = time.monotonic()
        finally:
            await children.settle()
    finally:
        children.close()

    store = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    conn = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        final = [await read_all(store, cid) for cid in conversations]
        attempt_rows = await conn.fetch(
            "SELECT conversation_id, attempt_id, outcome, boundary_seq "
            "FROM episodic_compaction_attempts"
        )
        expired_leases = await conn.fetchval(
            "SELECT count(*) FROM episodic_conversations "
            "WHERE lease_token IS NOT NULL AND lease_expires_at <= now()"
        )
    finally:
        await conn.close()
        await store.close()

    read_back = time.monotonic()
    # -- the T1 invariants
    report = check_log(final, seeds, writers, [reader])
    violations = list(report.violations)
    stale = sum(r["mode"] == "stale" for w in writers for r in w["records"])
    if report.conflicts_stale + report.stale_errors != stale:
        violations.append(f"{stale} stale expected_seq, {report.conflicts_stale} refused")
    if report.acknowledged + report.conflicts_stale + report.conflicts_fresh != report.appends:
        violations.append(f"{report.appends} appends, not all answered")

    # -- keyed re-sends return the original seqs
    replayed = sum(w["replays"]["checked"] for w in writers)
    for w in writers:
        for i, first, again in w["replays"]["mismatched"]:
            violations.append(
                f"writer {w['writer']} append {i}: stored at {first}, re-sent {again}"
            )
    if not replayed:
        violations.append("no keyed append was re-sent")

    # -- boundaries: contiguous, never duplicated, each with its one succeeded attempt
    succeeded = Counter(
        (row["conversation_id"], row["boundary_seq"])
        for row in attempt_rows
        if row["outcome"] in ("succeeded", "fallback")
    )
    orphan_attempts = dict(succeeded)
    for cid, events in zip(conversations, final, strict=True):
        covers = [(e.seq, e.covers_through_seq, e.summary) for e in events if e.kind == "boundary"]
        previous = 0
        for seq, through, summary in covers:
            if not previous < through < seq:
                violations.append(
                    f"{cid}: boundary {seq} covers through {through} after {previous}"
                )
            if not summary.strip():
                violations.append(f"{cid}: boundary {seq} has an empty summary")
            if succeeded[(cid, seq)] != 1:
                violations.append(
                    f"{cid}: boundary {seq} has {succeeded[(cid, seq)]} succeeded attempts"
                )
            orphan_attempts.pop((cid, seq), None)
            previous = through
        if len({through for _, through, _ in covers}) != len(covers):
            violations.append(f"{cid}: duplicate boundaries {covers}")
    for (cid, seq), count in orphan_attempts.items():
        violations.append(f"{cid}: {count} succeeded attempts name boundary {seq}, which is absent")
    if not report.boundaries:
        violations.append("the worker wrote no boundary")
    if expired_leases:
        violations.append(f"{expired_leases} conversations left with an expired lease")
    if worker["run_error"]:
        violations.append(f"the compaction worker's run() failed: {worker['run_error']}")
    if terminated < DURATION / INTERVAL * 0.5:
        violations.append(f"only {terminated} terminations in {DURATION} s")

    # -- recovery: the clients' success rate from 2 s after the chaos stopped
    calls = [call for result in [*writers, reader] for call in result["calls"]]
    total, answered, last_failure = recovery(calls, calm + RECOVERED_WITHIN, ended)
    chaos_total, chaos_answered, _ = recovery(calls, started, calm)
    rate = answered / total if total else 0.0
    if total < 20 or rate < 0.99:
        violations.append(f"{answered}/{total} calls answered from 2 s after the chaos")

    # -- what clients saw: typed errors only (the worker's attempts are clients too)
    untyped = list(report.unexpected)
    worker_types = Counter(e["type"] for e in worker["errors"] if e["type"])
    for error in worker["errors"]:
        if error["type"] and not error["type"].startswith("episodic."):
            untyped.append(f"worker ({error['message']}): {error['error']} at {error['at']}")
    untyped += [f"worker, never retrieved: {text}" for text in worker["unhandled"]]

    outcomes = Counter(r["outcome"] for w in writers for r in w["records"])
    resent = sum(bool(r["transients"] or r.get("untyped")) for w in writers for r in w["records"])
    kinds = Counter(
        match.group(1) if (match := UNTYPED.search(text)) else text[:80] for text in untyped
    )
    summary = (
        f"T5 (seed {SEED}): {DURATION} s of chaos, {terminated}/{attempts} pg_terminate_backend "
        f"calls terminated a backend; {report.appends} keyed appends by {WRITERS} writers "
        f"({dict(outcomes)}), {report.transients} TransientDatabaseError seen by writers and "
        f"re-sent; {resent} appends re-sent after an error; {report.messages} messages, "
        f"{report.boundaries} boundaries "
        f"({worker['summaries']} summaries), {report.gaps} gaps, {report.duplicates} "
        f"duplicates; all {replayed} re-sends afterwards returned the original seqs; reads all "
        f"prefixes: "
        f"{report.reads_context} load_context + {report.reads_events} read_events; during chaos "
        f"{chaos_answered}/{chaos_total} client calls answered; from {RECOVERED_WITHIN:g} s "
        f"after: {answered}/{total} = {rate:.2%} (last failure "
        f"{'none' if last_failure is None else f'{last_failure:.2f} s'} into that window); "
        f"worker logged {len(worker['errors'])} errors by type {dict(worker_types)}, "
        f"{len(worker['unhandled'])} never retrieved; {len(violations)} violations; "
        f"{len(untyped)} untyped errors reached clients: {dict(kinds)}; phases: start "
        f"{started - began:.1f} s, chaos {calm - started:.1f} s, after {ended - calm:.1f} s, "
        f"stop {collected - ended:.1f} s, read back {read_back - collected:.1f} s, checks "
        f"{time.monotonic() - read_back:.1f} s"
    )
    return Outcome(summary=summary, violations=violations, untyped=untyped)


async def test_t5_invariants_hold_under_backend_terminations(
    postgres_url: str, record_property: Any
) -> None:
    outcome = await scenario(postgres_url)
    print(outcome.summary)
    record_property("t5", outcome.summary)
    assert not outcome.violations, f"seed {SEED}:\n" + "\n".join(outcome.violations[:60])


async def test_t5_clients_see_only_typed_errors(postgres_url: str) -> None:
    outcome = await scenario(postgres_url)
    print("\n".join(["T5 untyped errors, first 10:", *outcome.untyped[:10]]))
    assert not outcome.untyped, f"seed {SEED}: {len(outcome.untyped)} untyped errors:\n" + (
        "\n".join(outcome.untyped[:30])
    )
