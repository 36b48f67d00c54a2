"""T4, worker kill matrix (RELIABILITY.md), PostgreSQL.

Scenario: C conversations of 50 to 200 messages each are seeded through the store and made due
(trigger_unfinished_turns=2). W=3 worker slots each run one real CompactionWorker process
(forked from tests/reliability/worker_child.py; lease 5 s, poll 0.1 s, concurrency 1, a fake
summarizer). K crash points are drawn uniformly (seeded) from: after claim; during the LLM
call; after the LLM, before the write; during the boundary write (variant "planned": head and
tail read and the boundary planned, the conditional write not sent; variant "in_flight": the
write statement executing at the server, blocked on a row lock, so it may finish after the
process died); after the write, before the attempt is acknowledged. The child reports when it
reaches its point and blocks; the test SIGKILLs it there and respawns a worker in that slot
(the three slots kill concurrently). After the K-th kill, three workers run with no fault.

Pass criteria (all asserted, with the seed in every message):
- 0 partial boundaries: every boundary has a non-empty summary, covers exactly the
  conversation's messages (covers_through_seq = last message seq, boundary seq right after it,
  seqs 1..n+1 without a gap) and a ``succeeded`` attempt naming its seq; every succeeded
  attempt has its boundary; a worker killed before its write committed left no attempt row.
- 0 lost messages: per conversation the raw (non-boundary) rows' count and md5 are unchanged.
- 0 duplicate boundaries per (conversation, covers_through_seq): exactly one per conversation.
- every due conversation compacted within 30 s of the last kill; 0 heads left leased, due or
  dead.
- the K kills were all delivered, at the drawn points (counts printed).

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
    .venv/bin/pytest tests/reliability/test_t4_kill_matrix.py -x -q -s
(EPISODIC_TEST_NIGHTLY=1 for K=500.)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from episodic import EpisodicStore, Message
from episodic.policy import EpisodicCompactionConfig
from tests.conftest import isolated_settings
from tests.reliability.sizes import seeded, seeds, size
from tests.reliability.worker_child import POINTS, WRITE_VARIANTS, fleet, plain_dsn

pytestmark = pytest.mark.postgres_only

WORKERS = 3
KILLS = size(50, 500)
CONVERSATIONS = size(70, 420)
LEASE = 5.0
DRAIN_BOUND = 30.0  # lease + backoff(attempt <= 3) + 2 x poll, RELIABILITY.md T4
BEFORE_COMMIT = {"after_claim", "during_llm", "after_llm", "during_write/planned"}

RAW = """
SELECT conversation_id, count(*) AS n, max(seq) AS last,
       md5(string_agg(seq::text || '|' || kind || '|' || token_estimate::text || '|' ||
                      created_at::text || '|' || payload || '|' || coalesce(client_id, ''),
                      E'\\n' ORDER BY seq)) AS digest
  FROM episodic_events
 WHERE kind <> 'boundary'
 GROUP BY conversation_id
"""

BOUNDARIES = """
SELECT conversation_id, seq, (payload::jsonb ->> 'covers_through_seq')::bigint AS covers,
       payload::jsonb ->> 'summary' AS summary
  FROM episodic_events
 WHERE kind = 'boundary'
"""


@pytest.fixture
async def pool(postgres_url: str) -> AsyncIterator[asyncpg.Pool]:
    created = await asyncpg.create_pool(plain_dsn(postgres_url), min_size=1, max_size=4)
    assert created is not None
    try:
        yield created
    finally:
        await created.close()


async def _seed(store: EpisodicStore, seed: int) -> dict[UUID, int]:
    """CONVERSATIONS conversations of 50-200 messages, appended in batches of up to 50, each
    ending with an answer (so its last run is at rest and a boundary may cover all of it)."""
    rng = seeded(seed)
    sizes = [2 * rng.randint(25, 100) for _ in range(CONVERSATIONS)]
    words = ("files", "report", "sales", "deploy", "schema", "index", "lease", "worker")
    semaphore = asyncio.Semaphore(6)

    async def one(index: int, count: int) -> tuple[UUID, int]:
        async with semaphore:
            cid = await store.create_conversation()
            texts = [
                f"c{index} m{n} " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
                for n in range(count)
            ]
            messages = [
                Message.user(text) if n % 2 == 0 else Message.assistant(text)
                for n, text in enumerate(texts)
            ]
            for start in range(0, count, 50):
                await store.append(cid, messages[start : start + 50])
            return cid, count

    return dict(await asyncio.gather(*(one(i, n) for i, n in enumerate(sizes))))


def _spec(name: str, pause: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "name": name,
        "lease": LEASE,
        "poll": 0.1,
        "concurrency": 1,
        "summarizer_timeout": 30.0,
        "backoff_base": 0.2,
        "backoff_max": 2.0,
        "llm": {"mode": "fixed", "delay": 0.01},
        "pause": pause,
    }


@pytest.mark.parametrize("seed", seeds(1, 1))
async def test_t4_sigkill_at_every_crash_point(
    seed: int, postgres_url: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    started = time.monotonic()
    store = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
    try:
        sizes = await _seed(store, seed)
    finally:
        await store.close()
    seeded_at = time.monotonic()
    raw_before = {row["conversation_id"]: row for row in await pool.fetch(RAW)}
    due = await pool.fetchval(
        "SELECT count(*) FROM episodic_conversations WHERE due_since IS NOT NULL"
    )
    assert due == CONVERSATIONS, f"seed {seed}: only {due} of {CONVERSATIONS} due"

    rng = seeded(seed * 7919)
    plan: list[dict[str, Any]] = []
    for _ in range(KILLS):
        point = rng.choice(POINTS)
        variant = rng.choice(WRITE_VARIANTS) if point == "during_write" else None
        plan.append({"point": point, "variant": variant, "job": rng.choice((0, 1))})
    drawn = Counter(_label(p) for p in plan)
    pending = list(reversed(plan))
    kills: list[dict[str, Any]] = []
    problems: list[str] = []

    async with fleet(postgres_url, tmp_path) as workers:

        async def slot(index: int) -> None:
            while pending:
                pause = pending.pop()
                name = f"s{index}-k{KILLS - len(pending)}"
                mark = len(workers.events)
                await workers.spawn(_spec(name, pause))
                paused = await workers.wait_for(
                    workers.report_of(name, "paused", "pause_failed", "crashed"),
                    within=60,
                    what=f"{name} to reach {_label(pause)} (seed {seed})",
                    start=mark,
                )
                assert paused["ev"] == "paused", f"seed {seed}: {paused}\n{workers.log_tail()}"
                await workers.kill(name)
                killed_at = time.monotonic()
                cid = UUID(paused["cid"])
                label = _label({"point": paused["point"], "variant": paused["variant"]})
                assert label == _label(pause), (paused, pause)
                kills.append({"label": label, "cid": cid, "name": name, "at": killed_at})
                # What a kill at this point may leave, checked the moment the process is gone.
                boundaries = await pool.fetchval(
                    "SELECT count(*) FROM episodic_events WHERE conversation_id = $1 "
                    "AND kind = 'boundary'",
                    cid,
                )
                ledger = await pool.fetch(
                    "SELECT outcome, boundary_seq FROM episodic_compaction_attempts "
                    "WHERE conversation_id = $1 AND worker = $2",
                    cid,
                    name,
                )
                if label in BEFORE_COMMIT and (boundaries or ledger):
                    problems.append(f"{name} killed {label} on {cid}: {boundaries} boundaries")
                if label == "after_write" and (
                    boundaries != 1 or [r["outcome"] for r in ledger] != ["succeeded"]
                ):
                    problems.append(f"{name} killed after its write on {cid}: {ledger}")

        await asyncio.gather(*(slot(i) for i in range(WORKERS)))
        last_kill = max(kill["at"] for kill in kills)
        for index in range(WORKERS):
            await workers.spawn(_spec(f"final-{index}", None))

        async def undone() -> int:
            return int(
                await pool.fetchval(
                    "SELECT count(*) FROM episodic_conversations WHERE due_since IS NOT NULL "
                    "OR lease_token IS NOT NULL OR boundary_seq IS NULL OR dead_since IS NOT NULL"
                )
            )

        left = await undone()
        while left and time.monotonic() - last_kill < DRAIN_BOUND + 15:
            await asyncio.sleep(0.1)
            left = await undone()
        drained_in = time.monotonic() - last_kill
        crashed = workers.named("crashed", "pause_failed")

    assert not crashed, f"seed {seed}: {crashed}"
    assert not problems, f"seed {seed}: {problems}"
    assert left == 0, f"seed {seed}: {left} conversations not compacted {drained_in:.1f} s on"
    assert drained_in <= DRAIN_BOUND, f"seed {seed}: drained {drained_in:.1f} s after last kill"
    delivered = Counter(kill["label"] for kill in kills)
    assert len(kills) == KILLS, (seed, len(kills))
    assert delivered == drawn, (seed, delivered, drawn)

    # ---- the log after the storm --------------------------------------------------------
    raw_after = {row["conversation_id"]: row for row in await pool.fetch(RAW)}
    lost = [
        cid
        for cid, row in raw_before.items()
        if (raw_after[cid]["n"], raw_after[cid]["digest"]) != (row["n"], row["digest"])
    ]
    assert set(raw_after) == set(sizes), f"seed {seed}: conversations lost their messages"
    assert not lost, f"seed {seed}: raw log changed in {lost}"
    assert all(raw_before[cid]["n"] == n == raw_before[cid]["last"] for cid, n in sizes.items())

    boundaries = await pool.fetch(BOUNDARIES)
    per_cut = Counter((row["conversation_id"], row["covers"]) for row in boundaries)
    duplicates = {key: n for key, n in per_cut.items() if n > 1}
    assert not duplicates, f"seed {seed}: duplicate boundaries {duplicates}"
    by_cid = {row["conversation_id"]: row for row in boundaries}
    assert set(by_cid) == set(sizes), f"seed {seed}: conversations without a boundary"
    assert len(boundaries) == len(sizes), f"seed {seed}: {len(boundaries)} boundaries"
    partial = [
        (cid, row["seq"], row["covers"])
        for cid, row in by_cid.items()
        if not (row["summary"] or "").strip()
        or row["covers"] != sizes[cid]
        or row["seq"] != sizes[cid] + 1
    ]
    assert not partial, f"seed {seed}: partial or misplaced boundaries {partial}"
    gaps = await pool.fetch(
        "SELECT conversation_id, count(*) AS n, min(seq) AS lo, max(seq) AS hi "
        "FROM episodic_events GROUP BY 1 HAVING count(*) <> max(seq) OR min(seq) <> 1"
    )
    assert not gaps, f"seed {seed}: seq gaps {gaps}"
    heads = await pool.fetch(
        "SELECT conversation_id, last_seq, boundary_seq, covers_through_seq, due_since, "
        "lease_token, dead_since, compaction_attempts FROM episodic_conversations"
    )
    bad_heads = [
        dict(h)
        for h in heads
        if (h["last_seq"], h["boundary_seq"], h["covers_through_seq"])
        != (sizes[h["conversation_id"]] + 1,) * 2 + (sizes[h["conversation_id"]],)
        or h["lease_token"] is not None
        or h["due_since"] is not None
        or h["dead_since"] is not None
    ]
    assert not bad_heads, f"seed {seed}: heads {bad_heads[:3]}"

    attempts = await pool.fetch(
        "SELECT conversation_id, worker, outcome, boundary_seq FROM episodic_compaction_attempts"
    )
    outcomes = Counter(row["outcome"] for row in attempts)
    succeeded = [row for row in attempts if row["outcome"] == "succeeded"]
    assert Counter(row["conversation_id"] for row in succeeded) == Counter(set(sizes)), (
        f"seed {seed}: succeeded attempts per conversation are not exactly one: {outcomes}"
    )
    orphan = [
        dict(row)
        for row in succeeded
        if row["boundary_seq"] != by_cid[row["conversation_id"]]["seq"]
    ]
    assert not orphan, f"seed {seed}: succeeded attempts without their boundary {orphan}"
    others = [
        dict(row)
        for row in attempts
        if row["outcome"] != "succeeded"
        and (row["outcome"] not in ("lease_lost", "conflict") or row["boundary_seq"] is not None)
    ]
    assert not others, f"seed {seed}: unexpected attempts {others}"
    killed_names = {kill["name"]: kill for kill in kills}
    in_flight = [kill for kill in kills if kill["label"] == "during_write/in_flight"]
    committed_after_death = sum(
        1
        for row in succeeded
        if row["worker"] in killed_names
        and killed_names[row["worker"]]["label"] == "during_write/in_flight"
    )
    by_worker_done = Counter(row["worker"] for row in succeeded)
    print(
        f"\nT4 seed {seed}: {len(sizes)} conversations, "
        f"{sum(sizes.values())} messages (seeded in {seeded_at - started:.1f} s); "
        f"{len(kills)} SIGKILLs delivered: "
        + ", ".join(f"{label} {delivered[label]}" for label in sorted(delivered))
        + f"; in-flight writes committed after the kill {committed_after_death}/{len(in_flight)}"
        f"; drained {drained_in:.1f} s after the last kill; attempts {dict(outcomes)}; "
        f"0 partial boundaries, 0 lost messages, 0 duplicate boundaries; "
        f"{len(by_worker_done)} workers wrote boundaries; total {time.monotonic() - started:.1f} s"
    )


def _label(pause: dict[str, Any]) -> str:
    variant = pause.get("variant")
    return f"{pause['point']}/{variant}" if variant else str(pause["point"])
