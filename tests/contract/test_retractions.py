"""Retractions and clears, on both backends: what an agent framework's "pop the last item"
and "clear the session" become on a log that is never rewritten.

The oracle for a retraction: a conversation where the message is retracted reads (context
and counters, all but the last seq) exactly like one where it was never appended. For a clear:
like a new conversation. And the head is always the fold of the log.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from uuid import UUID, uuid4

import pytest

from episodic import (
    BoundaryRequest,
    ClearEvent,
    EpisodicStore,
    Message,
    MessageEvent,
    RetractionEvent,
    ToolCall,
    Usage,
)
from episodic.errors import NotFoundError, OrphanToolResultError
from episodic.policy import EpisodicCompactionConfig
from episodic.store.projection import HeadCounters, rebuild_head
from tests.support import counters_of


def call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="run", args={"cmd": "pytest"})


async def _counters(store: EpisodicStore, conv: UUID) -> HeadCounters:
    head = counters_of(await store.get_conversation(conv))
    assert rebuild_head(await store.read_events(conv, limit=10_000)) == head
    return head


async def _texts(store: EpisodicStore, conv: UUID) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in (await store.load_context(conv)).messages]


async def _twins(
    store: EpisodicStore, batches: list[tuple[list[Message], Usage | None]]
) -> tuple[UUID, UUID]:
    """Two conversations with the same batches; the second without its last message."""
    whole, short = await store.create_conversation(), await store.create_conversation()
    for i, (batch, usage) in enumerate(batches):
        await store.append(whole, batch, usage=usage)
        kept = batch[:-1] if i == len(batches) - 1 else batch
        if kept:
            await store.append(short, kept, usage=usage)
    return whole, short


async def _same_as_never_appended(store: EpisodicStore, retracted: UUID, short: UUID) -> None:
    got, want = await _counters(store, retracted), await _counters(store, short)
    assert replace(got, last_seq=0) == replace(want, last_seq=0)
    assert await _texts(store, retracted) == await _texts(store, short)


@pytest.mark.parametrize(
    "batches",
    [
        pytest.param([([Message.user("a"), Message.assistant("b")], None)], id="assistant"),
        pytest.param([([Message.user("a")], None), ([Message.user("b")], None)], id="user"),
        pytest.param(
            [
                ([Message.user("a")], Usage(input_tokens=900)),
                ([Message.assistant("b"), Message.user("c")], None),
            ],
            id="after-usage",
        ),
        pytest.param(
            [([Message.user("a"), Message.assistant("b")], Usage(input_tokens=900))],
            id="in-the-usage-batch",
        ),
        pytest.param(
            [([Message.user("go"), Message.assistant(None, tool_calls=[call("c1")])], None)],
            id="a-call",
        ),
        pytest.param(
            [
                ([Message.user("go"), Message.assistant(None, tool_calls=[call("c1")])], None),
                ([Message.tool_result("c1", "ok", name="run")], None),
            ],
            id="a-result",
        ),
    ],
)
async def test_a_retracted_message_reads_as_never_appended(
    store: EpisodicStore, batches: list[tuple[list[Message], Usage | None]]
) -> None:
    whole, short = await _twins(store, batches)
    retracted = await store.retract_last(whole)
    assert isinstance(retracted, MessageEvent)
    assert retracted.message.text == batches[-1][0][-1].text
    await _same_as_never_appended(store, whole, short)
    # The log keeps the message, and says what took it back.
    events = await store.read_events(whole)
    assert events[-1] == RetractionEvent(
        conversation_id=whole,
        seq=events[-2].seq + 1,
        created_at=events[-1].created_at,
        token_estimate=0,
        retracted_seq=retracted.seq,
    )
    assert retracted in events


async def test_retracting_a_result_lets_its_call_be_answered_again(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("go"), Message.assistant(None, tool_calls=[call("c")])])
    await store.append(conv, [Message.tool_result("c", "wrong", name="run")])
    await store.retract_last(conv)
    assert (await store.get_conversation(conv)).open_tool_calls == {"c": 2}
    await store.append(conv, [Message.tool_result("c", "right", name="run")])
    assert (await _texts(store, conv))[-1] == ("tool", "right")
    await _counters(store, conv)


async def test_a_retracted_call_takes_no_result(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("go"), Message.assistant(None, tool_calls=[call("c")])])
    await store.retract_last(conv)
    with pytest.raises(OrphanToolResultError):
        await store.append(conv, [Message.tool_result("c", "late", name="run")])


async def test_retractions_walk_back_newest_first(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.assistant("b")])
    await store.append(conv, [Message.system("policy"), Message.user("c")])
    taken = [await store.retract_last(conv) for _ in range(5)]
    assert [t.message.text if t else None for t in taken] == ["c", "policy", "b", "a", None]
    assert await _texts(store, conv) == []
    assert (await _counters(store, conv)).context_tokens == 0


async def test_a_retraction_after_a_boundary_takes_from_the_tail_only(
    store: EpisodicStore,
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("old"), Message.assistant("older")])
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="the story so far",
            covers_through_seq=2,
            retained=["old"],
            reason="manual",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conv, [Message.user("new")])
    assert (await store.retract_last(conv)).message.text == "new"
    assert await store.retract_last(conv) is None  # the handoff is not the log's to take back
    context = await store.load_context(conv)
    assert len(context.messages) == 2  # the handoff and the retained "old"
    assert "the story so far" in context.messages[0].text
    await _counters(store, conv)


async def test_a_boundary_after_a_retraction_leaves_the_retracted_out(
    store: EpisodicStore,
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.assistant("keep"), Message.user("b")])
    await store.append(conv, [Message.assistant("drop")])
    await store.retract_last(conv)
    await store.append(conv, [Message.user("after")])
    boundary = await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="handoff",
            covers_through_seq=3,
            retained=[],
            reason="manual",
            expected_boundary_seq=None,
        ),
    )
    head = await _counters(store, conv)
    assert head.user_messages_since_boundary == 1  # "after": "drop" is out of view
    assert [m.text for m in (await store.load_context(conv)).messages][1:] == ["after"]
    assert boundary.tokens_after == head.context_tokens


async def test_concurrent_retractions_take_back_one_message_each(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user(str(i)) for i in range(12)])
    taken = await asyncio.gather(*(store.retract_last(conv) for _ in range(16)))
    texts = [t.message.text for t in taken if t is not None]
    assert sorted(texts, key=int) == [str(i) for i in range(12)]
    assert taken.count(None) == 4
    assert await _texts(store, conv) == []
    await _counters(store, conv)


async def test_a_clear_empties_the_view_and_keeps_the_log(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.assistant(None, tool_calls=[call("c")])])
    cleared = await store.clear(conv)
    assert isinstance(cleared, ClearEvent)
    assert cleared.seq == 3
    assert await _texts(store, conv) == []
    assert await store.clear(conv) is None  # nothing in view: nothing written
    # The call went with the view: its result is an orphan now.
    with pytest.raises(OrphanToolResultError):
        await store.append(conv, [Message.tool_result("c", "late", name="run")])
    await store.append(conv, [Message.user("fresh")])
    assert await _texts(store, conv) == [("user", "fresh")]
    fresh = await store.create_conversation()
    await store.append(fresh, [Message.user("fresh")])
    got, want = await _counters(store, conv), await _counters(store, fresh)
    assert replace(got, last_seq=0, covers_through_seq=0, total_user_messages=0) == replace(
        want, last_seq=0, total_user_messages=0
    )
    assert got.total_user_messages == 2  # the conversation's, not the view's
    assert [e.kind for e in await store.read_events(conv)] == [
        "message",
        "message",
        "clear",
        "message",
    ]


async def test_a_clear_after_a_boundary_drops_the_handoff_too(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.assistant("b")])
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="handoff",
            covers_through_seq=2,
            retained=["a"],
            reason="manual",
            expected_boundary_seq=None,
        ),
    )
    await store.clear(conv)
    assert await _texts(store, conv) == []
    await store.append(conv, [Message.user("c")])
    assert await _texts(store, conv) == [("user", "c")]
    await _counters(store, conv)


async def test_unknown_conversations_are_not_found(store: EpisodicStore) -> None:
    with pytest.raises(NotFoundError):
        await store.retract_last(uuid4())
    with pytest.raises(NotFoundError):
        await store.clear(uuid4())


async def test_a_usage_report_reads_as_usage_passed_with_the_append(store: EpisodicStore) -> None:
    reported, passed = await store.create_conversation(), await store.create_conversation()
    await store.append(reported, [Message.user("a"), Message.assistant("b")])
    event = await store.report_usage(reported, Usage(input_tokens=1_234, output_tokens=5))
    assert event.usage == Usage(input_tokens=1_234, output_tokens=5)
    await store.append(reported, [Message.user("c")])
    await store.append(passed, [Message.user("a")])
    await store.append(passed, [Message.assistant("b")], usage=Usage(input_tokens=1_234))
    await store.append(passed, [Message.user("c")])
    got, want = await _counters(store, reported), await _counters(store, passed)
    assert got.usage_input_tokens == want.usage_input_tokens == 1_234
    # The report covers everything before it (an append's usage, its own batch too): what
    # counts since is only "c".
    c_tokens = (await store.load_context(reported)).messages[-1].token_estimate
    assert got.tokens_since_usage == c_tokens
    assert want.tokens_since_usage > c_tokens
    # Retracting what came after the report takes its tokens back from the pressure.
    await store.retract_last(reported)
    assert (await _counters(store, reported)).tokens_since_usage == 0


async def test_a_usage_report_can_make_the_conversation_due(store: EpisodicStore) -> None:
    store.trigger = EpisodicCompactionConfig(trigger_context_tokens=10_000)
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("short")])
    assert (await store.get_conversation(conv)).due_since is None
    await store.report_usage(conv, Usage(input_tokens=12_000))
    head = await store.get_conversation(conv)
    assert head.due_since is not None
    assert head.due_reason == "context_pressure"
    with pytest.raises(NotFoundError):
        await store.report_usage(uuid4(), Usage(input_tokens=1))
