"""T7, summarizer failure and backoff (RELIABILITY.md), PostgreSQL.

Scenario: JOBS due conversations; W=4 real CompactionWorker processes (forked from
tests/reliability/worker_child.py, concurrency 1 each so that "this process is inside an LLM
call" is exact) with summarizer_timeout 0.5 s, max_attempts 4, backoff base 0.2 s capped at
0.6 s, lease 5 s. The fake LLM follows a seeded script per (conversation, attempt): each call
lasts 50-250 ms and then answers (p=0.64), fails transiently (p=0.30: connection reset, HTTP
503/429, an SDK-style APITimeoutError), fails permanently (p=0.02: HTTP 400/401, a KeyError),
or hangs past the timeout (p=0.02). Failures are raised as the adapters raise them, through
episodic.summarizers.classify.summarizer_error. What bounds a call is the worker's
``asyncio.wait_for(..., CompactionOptions.summarizer_timeout)``. A sampler reads
pg_stat_activity at 10 Hz for the whole run; the child processes report when each call
starts and ends (time.monotonic(), one clock for all processes).

Pass criteria (seed in every message):
- every conversation's attempts, in order, are exactly what the script implies (failed ...
  then succeeded, or dead after a permanent failure or the 4th failure); attempts <= 4.
- every scheduled retry delay (the head's next_attempt_at minus the attempt's finished_at,
  read right after the attempt ended) is within +-10% of min(0.2 * 2**(attempt-1), 0.6), and
  no retry is claimed before its next_attempt_at.
- permanently failing conversations end dead with the raw log intact and 0 boundaries; the
  others have exactly one boundary; every raw log is unchanged.
- every hung call is cut at the timeout (cancelled 0.5 s after it started, +0.5 s slack; it
  starts when the worker calls the summarizer, the origin of the worker's own timeout, see
  worker_child.FakeSummarizer.summarize) and recorded as "did not answer within 0.5 s".
- pg_stat_activity: 0 worker sessions seen 'idle in transaction' for more than 1 s, and, in
  every sample taken entirely inside a worker's LLM call, none of that worker's sessions has a
  transaction open or a statement active (but for the worker's periodic sweep, a side task
  whose one short statement belongs to no attempt and may run at any moment).

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
    .venv/bin/pytest tests/reliability/test_t7_summarizer_failure.py -x -q -s
(EPISODIC_TEST_NIGHTLY=1 for 1,000 jobs.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from episodic import EpisodicStore, Message
from episodic.policy import EpisodicCompactionConfig
from episodic.store.postgres.queries import SWEEP_DUE
from episodic.worker.backoff import JITTER
from tests.conftest import isolated_settings
from tests.reliability.sizes import seeded, seeds, size
from tests.reliability.worker_child import fleet, plain_dsn
from tests.support import FILE_LISTING

pytestmark = pytest.mark.postgres_only

JOBS = size(100, 1000)
WORKERS = 4
TIMEOUT = 0.5
MAX_ATTEMPTS = 4
BASE, CAP = 0.2, 0.6
P_PERMANENT, P_HANG, P_TRANSIENT = 0.02, 0.02, 0.30
TRANSIENT_KINDS = ("connection", "http503", "http429", "api_timeout")
PERMANENT_KINDS = ("http400", "http401", "bug")

SAMPLE = """
SELECT pid, application_name, state, xact_start IS NOT NULL AS in_transaction,
       coalesce(extract(epoch FROM clock_timestamp() - state_change), 0) AS state_seconds,
       coalesce(extract(epoch FROM clock_timestamp() - xact_start), 0) AS xact_seconds,
       left(query, 60) AS query
  FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND backend_type = 'client backend'
"""

#: The worker's sweep side task (store.mark_due_by_age), which runs beside the attempts.
SWEEP_STATEMENT = SWEEP_DUE[:60]

#: pg_stat_activity states of a session doing work or holding a transaction
BUSY = ("active", "idle in transaction", "idle in transaction (aborted)", "fastpath function call")

RAW = """
SELECT conversation_id, count(*) AS n,
       md5(string_agg(seq::text || '|' || kind || '|' || payload, E'\\n' ORDER BY seq)) AS digest
  FROM episodic_events WHERE kind <> 'boundary' GROUP BY conversation_id
"""


def _script(seed: int, cids: list[UUID]) -> dict[str, list[dict[str, Any]]]:
    """Per conversation, what each attempt's call does."""
    rng = seeded(seed)
    script: dict[str, list[dict[str, Any]]] = {}
    for cid in cids:
        steps = []
        for _ in range(MAX_ATTEMPTS):
            draw = rng.random()
            step: dict[str, Any] = {"seconds": round(rng.uniform(0.05, 0.25), 3)}
            if draw < P_PERMANENT:
                step.update(kind="permanent", error=rng.choice(PERMANENT_KINDS))
            elif draw < P_PERMANENT + P_HANG:
                step.update(kind="hang")
            elif draw < P_PERMANENT + P_HANG + P_TRANSIENT:
                step.update(kind="transient", error=rng.choice(TRANSIENT_KINDS))
            else:
                step.update(kind="ok")
            steps.append(step)
        script[str(cid)] = steps
    return script


def _expected(steps: list[dict[str, Any]]) -> list[str]:
    """The attempts ledger a conversation's script implies."""
    outcomes: list[str] = []
    for attempt, step in enumerate(steps, start=1):
        if step["kind"] == "ok":
            return [*outcomes, "succeeded"]
        if step["kind"] == "permanent" or attempt == MAX_ATTEMPTS:
            return [*outcomes, "dead"]
        outcomes.append("failed")
    raise AssertionError("unreachable")


def _delay(attempt: int) -> float:
    return min(BASE * 2.0 ** (attempt - 1), CAP)


@pytest.mark.parametrize("seed", seeds(1, 3))
async def test_t7_failures_backoff_and_no_transaction_during_calls(
    seed: int, postgres_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    started = time.monotonic()
    store = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
    try:
        semaphore = asyncio.Semaphore(8)

        async def create(n: int) -> UUID:
            async with semaphore:
                cid = await store.create_conversation()
                await store.append(
                    cid,
                    [
                        Message.user(f"job {n}: list the files"),
                        Message.assistant(f"job {n}: three files:\n{FILE_LISTING}"),
                        Message.user(f"job {n}: summarise the largest"),
                        Message.assistant(f"job {n}: a sales report"),
                    ],
                )
                return cid

        cids = list(await asyncio.gather(*(create(n) for n in range(JOBS))))
    finally:
        await store.close()
    script = _script(seed, cids)
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script))
    expected = {cid: _expected(script[str(cid)]) for cid in cids}
    raw_before = {row["conversation_id"]: row["digest"] for row in await db.fetch(RAW)}
    names = [f"W{n}" for n in range(WORKERS)]

    samples: list[tuple[float, float, list[asyncpg.Record]]] = []
    sampler = await asyncpg.connect(plain_dsn(postgres_url))
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        while not stop_sampling.is_set():
            t0 = time.monotonic()
            rows = await sampler.fetch(SAMPLE)
            t1 = time.monotonic()
            samples.append((t0, t1, rows))
            await asyncio.sleep(max(0.0, 0.1 - (t1 - t0)))

    async def unfinished() -> int:
        return int(
            await db.fetchval(
                "SELECT count(*) FROM episodic_conversations WHERE dead_since IS NULL "
                "AND (due_since IS NOT NULL OR lease_token IS NOT NULL)"
            )
        )

    sampling = asyncio.create_task(sample())
    try:
        async with fleet(postgres_url, tmp_path) as workers:
            for name in names:
                await workers.spawn(
                    {
                        "name": name,
                        "lease": 5.0,
                        "poll": 0.05,
                        "concurrency": 1,
                        "summarizer_timeout": TIMEOUT,
                        "max_attempts": MAX_ATTEMPTS,
                        "backoff_base": BASE,
                        "backoff_max": CAP,
                        "llm": {"mode": "script", "script": str(script_path)},
                        "probe": True,
                    }
                )
            deadline = time.monotonic() + 90
            while await unfinished():
                assert time.monotonic() < deadline, f"seed {seed}: not done\n{workers.log_tail()}"
                await asyncio.sleep(0.1)
            events = list(workers.events)
    finally:
        stop_sampling.set()
        await sampling
        await sampler.close()
    ran = time.monotonic() - started
    sampled_for = samples[-1][1] - samples[0][0] if samples else 0.0

    crashed = [e for e in events if e["ev"] == "crashed"]
    assert not crashed, f"seed {seed}: {crashed}"

    # ---- outcomes per conversation ---------------------------------------------------------
    ledger: dict[UUID, list[asyncpg.Record]] = defaultdict(list)
    for row in await db.fetch(
        "SELECT conversation_id, worker, outcome, error, boundary_seq, finished_at "
        "FROM episodic_compaction_attempts ORDER BY finished_at"
    ):
        ledger[row["conversation_id"]].append(row)
    wrong = {
        cid: ([r["outcome"] for r in ledger[cid]], want)
        for cid, want in expected.items()
        if [r["outcome"] for r in ledger[cid]] != want
    }
    assert not wrong, f"seed {seed}: ledger differs from the script: {list(wrong.items())[:5]}"
    most = max(len(rows) for rows in ledger.values())
    assert most <= MAX_ATTEMPTS, f"seed {seed}: {most} attempts"

    boundaries = Counter(
        row["conversation_id"]
        for row in await db.fetch(
            "SELECT conversation_id FROM episodic_events WHERE kind = 'boundary'"
        )
    )
    heads = {
        row["conversation_id"]: row
        for row in await db.fetch(
            "SELECT conversation_id, dead_since, due_since, lease_token, last_error "
            "FROM episodic_conversations"
        )
    }
    raw_after = {row["conversation_id"]: row["digest"] for row in await db.fetch(RAW)}
    assert raw_after == raw_before, f"seed {seed}: raw logs changed"
    dead = [cid for cid, want in expected.items() if want[-1] == "dead"]
    permanent = [
        cid for cid in dead if script[str(cid)][len(expected[cid]) - 1]["kind"] == "permanent"
    ]
    for cid, want in expected.items():
        head = heads[cid]
        if want[-1] == "dead":
            assert boundaries[cid] == 0, f"seed {seed}: dead {cid} has a boundary"
            assert head["dead_since"] is not None, (seed, head)
            assert head["lease_token"] is None, (seed, head)
        else:
            assert boundaries[cid] == 1, f"seed {seed}: {cid} has {boundaries[cid]} boundaries"
            assert (head["due_since"], head["dead_since"]) == (None, None), (seed, head)

    # ---- scheduled delays ------------------------------------------------------------------
    ended = [e for e in events if e["ev"] == "ended"]
    retries = [e for e in ended if e["requested"] == "failed"]
    assert len(retries) == sum(want.count("failed") for want in expected.values()), seed
    claims = {(e["cid"], e["attempt"]): e for e in events if e["ev"] == "claimed"}
    off = []
    early = []
    for e in retries:
        formula = _delay(e["attempt"])
        low, high = formula * (1 - JITTER) - 1e-3, formula * (1 + JITTER) + 1e-3
        if not (low <= e["db_delay"] <= high and abs(e["retry_in"] - e["db_delay"]) < 1e-3):
            off.append((e["cid"], e["attempt"], e["retry_in"], e["db_delay"], formula))
        claimed = claims[(e["cid"], e["attempt"] + 1)]
        if datetime.fromisoformat(claimed["claimed_at"]) < datetime.fromisoformat(
            e["next_attempt_at"]
        ):
            early.append((e["cid"], e["attempt"]))
    assert not off, f"seed {seed}: delays off the formula: {off[:5]}"
    assert not early, f"seed {seed}: retried before next_attempt_at: {early[:5]}"
    finals = [e for e in ended if e["requested"] == "dead"]
    assert all(e["dead"] and e["recorded"] == "dead" for e in finals), seed

    # ---- hung calls ------------------------------------------------------------------------
    hangs = [
        (cid, a) for cid in cids for a, s in enumerate(script[str(cid)], 1) if s["kind"] == "hang"
    ]
    hangs = [(cid, a) for cid, a in hangs if a <= len(expected[cid])]
    cut = [e for e in events if e["ev"] == "llm_exit" and e["how"] == "cancelled"]
    assert sorted((UUID(e["cid"]), e["attempt"]) for e in cut) == sorted(hangs), seed
    late = [e for e in cut if not TIMEOUT - 0.02 <= e["elapsed"] <= TIMEOUT + 0.5]
    assert not late, f"seed {seed}: hung calls not cut at {TIMEOUT} s: {late}"
    for cid, attempt in hangs:
        error = ledger[cid][attempt - 1]["error"]
        assert f"did not answer within {TIMEOUT:g} s" in error, (seed, error)

    # ---- pg_stat_activity ------------------------------------------------------------------
    calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
    entered: dict[tuple[str, str, int], float] = {}
    for e in events:
        key = (e["name"], e.get("cid", ""), e.get("attempt", 0))
        if e["ev"] == "llm_enter":
            entered[key] = e["t"]
        elif e["ev"] == "llm_exit":
            calls[e["name"]].append((entered.pop(key), e["t"]))
    assert not entered, f"seed {seed}: calls that never ended {entered}"
    workers_rows = [
        (t0, t1, [r for r in rows if r["application_name"] in names]) for t0, t1, rows in samples
    ]
    idle_long = [
        dict(r)
        for _, _, rows in workers_rows
        for r in rows
        if (r["state"] or "").startswith("idle in transaction") and r["state_seconds"] > 1.0
    ]
    idle_seen = [
        r
        for _, _, rows in workers_rows
        for r in rows
        if (r["state"] or "").startswith("idle in trans")
    ]
    in_transaction = [r for _, _, rows in workers_rows for r in rows if r["in_transaction"]]
    longest = max(in_transaction, key=lambda r: r["xact_seconds"], default=None)
    longest_xact = longest["xact_seconds"] if longest is not None else 0.0
    longest_what = f" ({longest['state']}: {longest['query']!r})" if longest is not None else ""
    checked = 0
    during_call = []
    for t0, t1, rows in workers_rows:
        for name in names:
            if any(start <= t0 and t1 <= end for start, end in calls[name]):
                checked += 1
                busy = [
                    dict(r)
                    for r in rows
                    if r["application_name"] == name
                    and (r["in_transaction"] or r["state"] in BUSY)
                    and not (r["query"] or "").startswith(SWEEP_STATEMENT)
                ]
                during_call += busy
    sessions = {r["pid"] for _, _, rows in workers_rows for r in rows}
    outcome_counts = Counter(o for want in expected.values() for o in want)
    kinds = Counter(s["kind"] for cid in cids for s in script[str(cid)][: len(expected[cid])])
    print(
        f"\nT7 seed {seed}: {JOBS} jobs, {sum(kinds.values())} LLM calls {dict(kinds)}; "
        f"attempts {dict(outcome_counts)} (max {most} per job, limit {MAX_ATTEMPTS}); "
        f"{len(dead)} dead ({len(permanent)} permanent, {len(dead) - len(permanent)} exhausted), "
        f"0 boundaries and raw log intact for each; {len(retries)} retry delays within "
        f"+-{JITTER:.0%} of min({BASE:g}*2^(n-1), {CAP:g}); {len(cut)} hung calls cut at "
        f"{min((e['elapsed'] for e in cut), default=0):.3f}-"
        f"{max((e['elapsed'] for e in cut), default=0):.3f} s; pg_stat_activity: "
        f"{len(samples)} samples ({len(samples) / max(sampled_for, 1e-9):.1f}/s over "
        f"{sampled_for:.1f} s), "
        f"{len(sessions)} worker sessions, {checked} (sample, worker-in-LLM-call) checks with "
        f"{len(during_call)} sessions busy, {len(idle_seen)} idle-in-transaction sightings, "
        f"{len(idle_long)} over 1 s, longest open transaction {longest_xact * 1000:.1f} ms"
        f"{longest_what}; "
        f"total {ran:.1f} s"
    )
    assert permanent, f"seed {seed}: the script drew no permanent failure"
    assert hangs, f"seed {seed}: the script drew no hang"
    assert checked >= 20, f"seed {seed}: only {checked} samples fell inside LLM calls"
    assert not during_call, f"seed {seed}: transactions open during LLM calls: {during_call[:5]}"
    assert not idle_long, f"seed {seed}: idle in transaction over 1 s: {idle_long[:5]}"
