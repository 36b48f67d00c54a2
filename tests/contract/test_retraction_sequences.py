"""Random interleavings of appends, tool calls and results, run completions, boundaries,
retractions and clears, on both backends: after every step the stored head is the fold of
the log (the PostgreSQL function, the conditional write of a retraction and the Python fold
agree), the context holds no retracted message and nothing from before a clear, and a tool
result is accepted exactly when the store says its call waits.
"""

from __future__ import annotations

import random
from uuid import UUID

import pytest

from episodic import BoundaryRequest, Context, EpisodicStore, Message, ToolCall, Usage
from episodic.errors import OrphanToolResultError
from episodic.models import ClearEvent, MessageEvent, RetractionEvent, StoredEvent
from episodic.policy import safe_cut
from episodic.store.projection import rebuild_head
from tests.support import counters_of

SEEDS = range(24)
STEPS = 30


async def _check(store: EpisodicStore, conv: UUID) -> list[StoredEvent]:
    events = await store.read_events(conv, limit=10_000)
    head = await store.get_conversation(conv)
    assert counters_of(head) == rebuild_head(events)
    gone = {e.retracted_seq for e in events if isinstance(e, RetractionEvent)}
    clears = [e.seq for e in events if isinstance(e, ClearEvent)]
    for seq in _logged(await store.load_context(conv)):
        assert seq not in gone
        assert seq > max(clears, default=0)
    return events


def _logged(context: Context) -> list[int]:
    """The seqs of the context's messages that are messages of the log (not the handoff,
    which carries its boundary's seq, nor a retained text or a synthetic result)."""
    handoff = context.boundary.seq if context.boundary is not None else None
    return [m.seq for m in context.messages if m.seq is not None and m.seq != handoff]


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_sequences_keep_the_head_the_fold_of_the_log(
    store: EpisodicStore, seed: int
) -> None:
    rng = random.Random(seed)
    conv = await store.create_conversation()
    calls = 0
    events = await _check(store, conv)
    for step in range(STEPS):
        op = rng.choice(
            ["user", "user", "assistant", "call", "result", "retract", "retract", "run", "cut"]
            + ["clear"] * (step % 10 == 9)
        )
        waiting = dict((await store.get_conversation(conv)).open_tool_calls)
        if op == "user":
            usage = Usage(input_tokens=rng.randint(1, 5_000)) if rng.random() < 0.3 else None
            await store.append(conv, [Message.user(f"u{step}")], usage=usage)
        elif op == "assistant":
            await store.append(conv, [Message.assistant(f"a{step}")])
        elif op == "call":
            calls += 1
            ids = [f"c{calls}-{i}" for i in range(rng.randint(1, 2))]
            tool_calls = [ToolCall(id=i, name="run", args={}) for i in ids]
            await store.append(conv, [Message.assistant(None, tool_calls=tool_calls)])
        elif op == "result":
            call_id = rng.choice([*waiting, f"c{calls}-0", "never-made"])
            result = Message.tool_result(call_id, f"r{step}", name="run")
            if call_id in waiting:
                await store.append(conv, [result])
            else:
                with pytest.raises(OrphanToolResultError):
                    await store.append(conv, [result])
        elif op == "retract":
            taken = await store.retract_last(conv)
            in_context = _logged(await store.load_context(conv))
            if taken is None:
                assert in_context == []
            else:
                assert taken.seq not in in_context
                assert all(seq < taken.seq for seq in in_context)
        elif op == "run":
            await store.mark_run_completed(conv)
        elif op == "cut":
            head = await store.get_conversation(conv)
            cut = safe_cut([e for e in events if e.seq > head.covers_through_seq])
            if cut > head.covers_through_seq:
                await store.write_boundary(
                    conv,
                    BoundaryRequest(
                        summary=f"summary {step}",
                        covers_through_seq=cut,
                        retained=[],
                        reason="manual",
                        expected_boundary_seq=head.boundary_seq,
                    ),
                )
        else:
            await store.clear(conv)
        events = await _check(store, conv)
    assert any(isinstance(e, MessageEvent) for e in events)
