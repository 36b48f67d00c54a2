"""T2, non-interleaving batches (RELIABILITY.md), on PostgreSQL.

Scenario: two writer processes, each with its own store holding one connection, are released
by a ``multiprocessing.Barrier`` and each append one batch of N small user messages (a few
dozen bytes each, far below ``max_message_bytes``; ``append`` has no batch-length limit) to
the same fresh conversation, in one ``store.append`` call. Repeated R times, one conversation
per repeat. CI: 2 x 1,000 items, 5 repeats; nightly (``EPISODIC_TEST_NIGHTLY=1``): 2 x 5,000, 20
repeats.

Pass criteria, each counted: the conversation holds exactly 2N events with seqs 1..2N; each
batch occupies one contiguous block of seqs, in its own order (as eventsourcing's
NonInterleaving test), and the seqs each ``append`` returned are that block. How often the two
calls overlapped in time is reported (the barrier makes them start together; the head row
lock is what must keep them apart).

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
    .venv/bin/pytest tests/reliability/test_t2_batches.py -q -s
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID

import pytest

from episodic import EpisodicStore
from tests.conftest import isolated_settings
from tests.reliability.sizes import size
from tests.reliability.writers import Children

pytestmark = pytest.mark.postgres_only

ITEMS = size(1_000, 5_000)
REPEATS = size(5, 20)


async def test_t2_concurrent_batches_never_interleave(
    postgres_url: str, record_property: Any
) -> None:
    store = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    children = Children(2, parties=2)
    try:
        assert store.max_message_bytes > ITEMS * 64  # items stay small
        conversations = [str(await store.create_conversation()) for _ in range(REPEATS)]
        try:
            for writer in range(2):
                children.submit(
                    writer,
                    {
                        "kind": "batch",
                        "url": postgres_url,
                        "writer": writer,
                        "items": ITEMS,
                        "conversations": conversations,
                    },
                )
            results = [await children.result(w) for w in range(2)]
        finally:
            await children.settle()
        finals = []
        for conversation in conversations:
            events = await store.read_events(UUID(conversation), limit=10_000)
            finals.append([(e.seq, e.message.text) for e in events])  # type: ignore[union-attr]
    finally:
        children.close()
        await store.close()

    violations: list[str] = []
    contiguous = overlapped = 0
    for repeat, final in enumerate(finals):
        seqs = [seq for seq, _ in final]
        if seqs != list(range(1, 2 * ITEMS + 1)):
            violations.append(f"repeat {repeat}: {len(seqs)} events, not seqs 1..{2 * ITEMS}")
        by_seq = dict(final)
        blocks = []
        for result in results:
            batch = result["rounds"][repeat]
            first = batch["seqs"][0]
            block = list(range(first, first + ITEMS))
            stored = [by_seq.get(seq) for seq in block]
            if batch["seqs"] != block or stored != batch["texts"]:
                violations.append(
                    f"repeat {repeat}, writer {result['writer']}: batch not one contiguous "
                    f"block in order (returned {batch['seqs'][0]}..{batch['seqs'][-1]})"
                )
            else:
                contiguous += 1
            blocks.append((batch["started"], batch["ended"]))
        (a_start, a_end), (b_start, b_end) = blocks
        overlapped += a_start < b_end and b_start < a_end
    summary = (
        f"T2: {REPEATS} repeats x 2 batches of {ITEMS} items: {contiguous}/{2 * REPEATS} "
        f"batches one contiguous block, events per conversation "
        f"{dict(Counter(len(f) for f in finals))}, the two append "
        f"calls overlapped in time in {overlapped}/{REPEATS} repeats; "
        f"{len(violations)} violations"
    )
    print(summary)
    record_property("t2", summary)
    assert not violations, "\n".join(violations)
    assert contiguous == 2 * REPEATS
    assert all(len(f) == 2 * ITEMS for f in finals)
