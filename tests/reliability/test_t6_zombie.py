"""T6, zombie fencing (RELIABILITY.md), PostgreSQL.

Scenario: LANES worker processes A1..An (concurrency 1, lease 1 s) and one worker B
(concurrency n, lease 20 s), all real CompactionWorker processes forked from
tests/reliability/worker_child.py. B starts stopped (SIGSTOP). Each round creates n due
conversations; each A claims one and enters its fake summarizer, which answers only once a
release file exists. The moment an A reports it is inside the call it gets SIGSTOP. B gets
SIGCONT, claims each conversation once its A's lease has expired, and completes it; B is
stopped again. When every A has been stopped for at least 2 x lease, the release files are
written and the A's get SIGCONT: each tries to write its boundary with its stale lease.
One repeat = one A's stop/continue cycle; rounds run the lanes side by side.

Pass criteria (every repeat, seed-free: the races are driven by signals and files):
- A's write is refused with LeaseLostError (the exception the worker saw, reported by the
  child) in 100% of repeats, and A's attempt is recorded as ``lease_lost`` with no boundary.
- 0 duplicate boundaries: exactly one boundary per conversation, B's, covering the log.
- the attempt count reflects both claims: A's claim was attempt 1, B's attempt 2, and the
  ledger holds exactly those two attempts (A lease_lost, B succeeded).
- A was stopped for >= 2 x lease; the raw log is unchanged.

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
    .venv/bin/pytest tests/reliability/test_t6_zombie.py -x -q -s
(EPISODIC_TEST_NIGHTLY=1 for 200 repeats.)
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from episodic import EpisodicStore
from episodic.policy import EpisodicCompactionConfig
from tests.conftest import isolated_settings
from tests.integration.worker_processes import create_due_conversation
from tests.reliability.sizes import size
from tests.reliability.worker_child import Fleet, fleet

pytestmark = pytest.mark.postgres_only

REPEATS = size(20, 200)
LANES = 5
ROUNDS = -(-REPEATS // LANES)
LEASE = 1.0


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[EpisodicStore]:
    opened = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    opened.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
    try:
        yield opened
    finally:
        await opened.close()


async def _raw(db: asyncpg.Connection, cid: UUID) -> list[tuple[Any, ...]]:
    rows = await db.fetch(
        "SELECT * FROM episodic_events WHERE conversation_id = $1 AND kind <> 'boundary' "
        "ORDER BY seq",
        cid,
    )
    return [tuple(row.values()) for row in rows]


async def test_t6_a_stopped_worker_is_fenced_off(
    postgres_url: str, store: EpisodicStore, db: asyncpg.Connection, tmp_path: Path
) -> None:
    started = time.monotonic()
    gates = tmp_path / "gates"
    gates.mkdir()
    a_names = [f"A{lane}" for lane in range(LANES)]
    results: list[dict[str, Any]] = []
    async with fleet(postgres_url, tmp_path) as workers:
        for name in a_names:
            await workers.spawn(
                {
                    "name": name,
                    "lease": LEASE,
                    "poll": 0.05,
                    "concurrency": 1,
                    "summarizer_timeout": 60.0,  # A's call must not time out while stopped
                    "llm": {"mode": "gate", "dir": str(gates)},
                }
            )
        await workers.spawn(
            {
                "name": "B",
                "lease": 20.0,
                "poll": 0.05,
                "concurrency": LANES,
                "summarizer_timeout": 10.0,
                "llm": {"mode": "fixed", "delay": 0.0},
            }
        )
        workers.signal("B", signal.SIGSTOP)  # only the A's may claim at first
        try:
            for round_ in range(ROUNDS):
                lanes = min(LANES, REPEATS - round_ * LANES)
                results += await _round(workers, store, db, gates, a_names[:lanes], round_)
        finally:
            for name in [*a_names, "B"]:
                with contextlib.suppress(ProcessLookupError):
                    workers.signal(name, signal.SIGCONT)
        crashed = workers.named("crashed")
        extra_llm_calls = len(workers.named("llm_enter")) - 2 * REPEATS

    assert not crashed, crashed
    refused = [r for r in results if r["a_error"] == "LeaseLostError"]
    paused = [r["paused"] for r in results]
    print(
        f"\nT6: {len(results)} repeats ({ROUNDS} rounds x {LANES} lanes), lease {LEASE:g} s, "
        f"A stopped {min(paused):.2f}-{max(paused):.2f} s; A's write refused with "
        f"LeaseLostError in {len(refused)}/{len(results)}; A recorded lease_lost in "
        f"{sum(r['a_outcome'] == 'lease_lost' for r in results)}/{len(results)}; "
        f"duplicate boundaries {sum(r['boundaries'] - 1 for r in results)}; "
        f"claims counted (A attempt 1, B attempt 2) in "
        f"{sum(r['attempts'] == (1, 2) for r in results)}/{len(results)}; "
        f"total {time.monotonic() - started:.1f} s"
    )
    assert len(results) == REPEATS
    assert len(refused) == REPEATS, [r for r in results if r["a_error"] != "LeaseLostError"]
    assert extra_llm_calls == 0, f"{extra_llm_calls} summarizer calls beyond A's and B's"


async def _round(
    workers: Fleet,
    store: EpisodicStore,
    db: asyncpg.Connection,
    gates: Path,
    a_names: list[str],
    round_: int,
) -> list[dict[str, Any]]:
    mark = len(workers.events)
    cids = [
        await create_due_conversation(store, f"round {round_} #{n}") for n in range(len(a_names))
    ]
    raw_before = {cid: await _raw(db, cid) for cid in cids}
    # Each A claims one conversation and is stopped as soon as it is inside the call.
    stopped_at: dict[str, float] = {}
    held: dict[str, str] = {}
    while len(stopped_at) < len(a_names):
        entered = await workers.wait_for(
            lambda e: e["ev"] == "llm_enter" and e["name"] in a_names and e["name"] not in held,
            within=20,
            what=f"round {round_}: every A inside a summarizer call",
            start=mark,
        )
        workers.signal(entered["name"], signal.SIGSTOP)
        stopped_at[entered["name"]] = time.monotonic()
        held[entered["name"]] = entered["cid"]
    assert sorted(held.values()) == sorted(map(str, cids)), (held, cids)
    for name, cid in held.items():
        head = await db.fetchrow(
            "SELECT lease_owner, compaction_attempts FROM episodic_conversations "
            "WHERE conversation_id = $1",
            UUID(cid),
        )
        assert (head["lease_owner"], head["compaction_attempts"]) == (name, 1), (round_, head)

    # B takes each over once A's lease has expired, and completes it.
    workers.signal("B", signal.SIGCONT)
    for cid in held.values():
        await workers.wait_for(
            workers.report_of("B", "written", cid=cid),
            within=20,
            what=f"round {round_}: B's boundary on {cid}",
            start=mark,
        )
    workers.signal("B", signal.SIGSTOP)
    # A stays stopped for at least twice its lease.
    wait = max(stopped_at.values()) + 2 * LEASE - time.monotonic()
    if wait > 0:
        await asyncio.sleep(wait)
    resumed_at = time.monotonic()
    for name, cid in held.items():
        (gates / f"release-{cid}").touch()
        workers.signal(name, signal.SIGCONT)
    results = []
    for name, cid in held.items():
        error = await workers.wait_for(
            workers.report_of(name, "write_error", "written"),
            within=20,
            what=f"round {round_}: {name}'s late write",
            start=mark,
        )
        ended = await workers.wait_for(
            workers.report_of(name, "ended"),
            within=20,
            what=f"round {round_}: {name}'s attempt record",
            start=mark,
        )
        a_claim = [e for e in workers.of(name, "claimed") if e["cid"] == cid]
        b_claim = [e for e in workers.of("B", "claimed") if e["cid"] == cid]
        boundaries = await db.fetch(
            "SELECT seq, (payload::jsonb ->> 'covers_through_seq')::int AS covers, "
            "payload::jsonb ->> 'summary' AS summary FROM episodic_events "
            "WHERE conversation_id = $1 AND kind = 'boundary'",
            UUID(cid),
        )
        ledger = await db.fetch(
            "SELECT worker, outcome, boundary_seq, error FROM episodic_compaction_attempts "
            "WHERE conversation_id = $1 ORDER BY finished_at",
            UUID(cid),
        )
        outcomes = {row["worker"]: row for row in ledger}
        result = {
            "round": round_,
            "a": name,
            "cid": cid,
            "paused": resumed_at - stopped_at[name],
            "a_error": error["error"] if error["ev"] == "write_error" else "written!",
            "a_outcome": ended["recorded"],
            "boundaries": len(boundaries),
            "attempts": (
                a_claim[0]["attempt"] if len(a_claim) == 1 else None,
                b_claim[0]["attempt"] if len(b_claim) == 1 else None,
            ),
        }
        results.append(result)
        context = f"round {round_}, {name} on {cid}: {result}, ledger {[dict(r) for r in ledger]}"
        assert result["paused"] >= 2 * LEASE, context
        assert result["a_error"] == "LeaseLostError", context
        assert result["a_outcome"] == "lease_lost", context
        assert len(boundaries) == 1, context
        assert "written by B on attempt 2" in boundaries[0]["summary"], context
        assert (boundaries[0]["covers"], boundaries[0]["seq"]) == (4, 5), context
        assert result["attempts"] == (1, 2), context
        assert len(ledger) == 2, context
        assert set(outcomes) == {name, "B"}, context
        assert outcomes[name]["outcome"] == "lease_lost", context
        assert outcomes[name]["boundary_seq"] is None, context
        assert outcomes["B"]["outcome"] == "succeeded", context
        assert outcomes["B"]["boundary_seq"] == boundaries[0]["seq"], context
        assert await _raw(db, UUID(cid)) == raw_before[UUID(cid)], context
    return results
