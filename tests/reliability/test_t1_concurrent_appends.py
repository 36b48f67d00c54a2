"""T1, concurrent appends with readers (RELIABILITY.md), on PostgreSQL.

Scenario: W writer *processes*, each with its own store holding one connection
(``pool_min_size=pool_max_size=1``), make M appends each (batches of 1 to 3 small messages)
to random conversations among C. 5% of the appends pass a deliberately stale ``expected_seq``
(below the head the writer has just read) and 5% pass the head just read. Two reader processes
call ``load_context`` and ``read_events`` in a loop until the writers are done. All processes
are released together by a ``multiprocessing.Barrier``. CI: W=8, M=250, C=4 (2,000 appends), 3
seeds; nightly (``EPISODIC_TEST_NIGHTLY=1``): W=16, M=500, C=4 (8,000 appends), 20 seeds.

Pass criteria, each counted: in each conversation ``seq`` = 1..n with 0 gaps and 0
duplicates; the stored messages are exactly the acknowledged ones, at the seqs their appends
returned; each writer's appends appear in its program order; every ``read_events`` is a prefix
of the final log and every ``load_context`` equals the final log up to its ``last_seq``; every
``ConflictError`` came with an ``expected_seq`` the head had really moved past, and every stale
``expected_seq`` produced one; 0 unexpected exceptions.

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
    .venv/bin/pytest tests/reliability/test_t1_concurrent_appends.py -q -s
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from episodic import EpisodicStore, Message
from tests.conftest import isolated_settings
from tests.reliability.sizes import seeds, size
from tests.reliability.writers import Children, check_log

pytestmark = pytest.mark.postgres_only

WRITERS = size(8, 16)
APPENDS = size(250, 500)
CONVERSATIONS = 4
READERS = 2


@pytest.fixture(scope="module")
def children() -> Iterator[Children]:
    """The writer and reader processes, spawned once for every seed of the module."""
    started = Children(WRITERS + READERS, parties=WRITERS + READERS + 1)
    try:
        yield started
    finally:
        started.close()


async def read_all(store: EpisodicStore, conversation: UUID) -> list[Any]:
    events: list[Any] = []
    while True:
        page = await store.read_events(
            conversation, after_seq=events[-1].seq if events else 0, limit=10_000
        )
        events += page
        if len(page) < 10_000:
            return events


@pytest.mark.parametrize("seed", seeds(3, 20))
async def test_t1_concurrent_appends_with_readers(
    postgres_url: str, children: Children, seed: int, record_property: Any
) -> None:
    store = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    try:
        conversations: list[UUID] = []
        seeded: list[list[tuple[int, str, str]]] = []
        for conv in range(CONVERSATIONS):
            # one message first, so a stale expected_seq (below the head) always exists
            cid = await store.create_conversation()
            [event] = await store.append(cid, [Message.user(f"s{seed}c{conv}seed")])
            conversations.append(cid)
            seeded.append([(event.seq, "user", f"s{seed}c{conv}seed")])
        common = {
            "url": postgres_url,
            "seed": seed,
            "conversations": [str(c) for c in conversations],
        }
        try:
            for writer in range(WRITERS):
                children.submit(
                    writer, {"kind": "t1_writer", "writer": writer, "appends": APPENDS, **common}
                )
            for n in range(READERS):
                children.submit(WRITERS + n, {"kind": "reader", "reader": n, **common})
            await children.wait_barrier()
            started = time.monotonic()
            writers = [await children.result(w) for w in range(WRITERS)]
            elapsed = time.monotonic() - started
            children.stop.set()
            readers = [await children.result(WRITERS + n) for n in range(READERS)]
        finally:
            await children.settle()
        final = [await read_all(store, cid) for cid in conversations]
    finally:
        await store.close()

    report = check_log(final, seeded, writers, readers)
    stale = sum(r["mode"] == "stale" for w in writers for r in w["records"])
    fresh = sum(r["mode"] == "fresh" for w in writers for r in w["records"])
    summary = (
        f"T1 seed {seed}: {report.appends} appends by {WRITERS} writers in {elapsed:.1f} s "
        f"({report.acknowledged} acknowledged, {report.messages} messages in "
        f"{CONVERSATIONS} conversations), {report.gaps} gaps, {report.duplicates} duplicates; "
        f"stale expected_seq {stale} -> {report.conflicts_stale} ConflictError; fresh "
        f"expected_seq {fresh} -> {report.fresh_ok} ok, {report.conflicts_fresh} ConflictError "
        f"(head moved); reads all prefixes: {report.reads_context} load_context + "
        f"{report.reads_events} read_events; {len(report.unexpected)} unexpected exceptions, "
        f"{len(report.violations)} violations"
    )
    print(summary)
    record_property("t1", summary)
    assert not report.violations, f"seed {seed}:\n" + "\n".join(report.violations)
    assert not report.unexpected, f"seed {seed}: unexpected exceptions:\n" + "\n".join(
        report.unexpected[:30]
    )
    assert report.appends == WRITERS * APPENDS, f"seed {seed}"
    # every append was answered: acknowledged, or refused for a stale or overtaken expectation
    assert report.acknowledged + report.conflicts_stale + report.conflicts_fresh == report.appends
    assert report.conflicts_stale == stale, f"seed {seed}: a stale expected_seq was accepted"
    assert report.fresh_ok + report.conflicts_fresh == fresh, f"seed {seed}"
    assert report.gaps == report.duplicates == 0, f"seed {seed}"
    assert stale > 0, f"seed {seed}: the scenario drew no stale expected_seq"
    assert report.reads_context > 0, f"seed {seed}: no load_context"
    assert report.reads_events > 0, f"seed {seed}: no read_events"
