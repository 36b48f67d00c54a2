"""Boundaries and load_context, on PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from episodic import (
    BoundaryRequest,
    ConflictError,
    EpisodicStore,
    LeaseLostError,
    Message,
    NotFoundError,
    ToolCall,
    Usage,
    ValidationError,
)
from episodic.context import MISSING_RESULT_TEXT
from episodic.errors import UnsafeCutError
from episodic.loop import validate_history
from episodic.models import BoundaryEvent, MessageEvent
from episodic.store.projection import rebuild_head
from tests.support import counters_of, snapshot


def call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="run", args={"cmd": call_id})


async def _history(store: EpisodicStore, turns: int = 5) -> object:
    conv = await store.create_conversation()
    for turn in range(turns):
        await store.append(
            conv,
            [
                Message.user(f"request {turn}"),
                Message.assistant(None, tool_calls=[call(f"t{turn}")]),
                Message.tool_result(f"t{turn}", f"output {turn}", name="run"),
                Message.assistant(f"answer {turn}"),
            ],
        )
        await store.mark_run_completed(conv)
    return conv


async def test_loaded_messages_carry_the_exact_instant_they_were_stored(
    store: EpisodicStore,
) -> None:
    """load_context reads timestamps as seconds since the epoch (codec.instant): each message
    still comes back with the created_at, to the microsecond, that append returned and that
    read_events reads natively, within a batch (one instant) and across batches."""
    conv = await store.create_conversation()
    stored = await store.append(conv, [Message.user("a"), Message.assistant("b")])
    stored += await store.append(conv, [Message.user("c")])
    stored += await store.append(conv, [Message.user("d"), Message.assistant("e")])
    ctx = await store.load_context(conv)
    events = await store.read_events(conv)
    expected = [event.created_at for event in stored]
    assert [m.created_at for m in ctx.messages] == expected
    assert [event.created_at for event in events] == expected
    assert all(m.created_at is not None and m.created_at.tzinfo is UTC for m in ctx.messages)
    assert len(set(expected)) == 3


async def test_without_a_boundary_the_context_is_the_whole_history(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(
        conv, [Message.system("be brief"), Message.user("hi"), Message.assistant("yo")]
    )
    ctx = await store.load_context(conv)
    assert [m.text for m in ctx.messages] == ["hi", "yo"]
    assert [m.seq for m in ctx.messages] == [2, 3]
    assert all(m.created_at is not None and m.token_estimate for m in ctx.messages)
    assert ctx.boundary is None
    assert ctx.last_seq == 3
    assert ctx.estimated_tokens == sum(m.token_estimate or 0 for m in ctx.messages)


async def test_boundary_gives_handoff_retained_and_tail(store: EpisodicStore) -> None:
    conv = await _history(store)  # seqs 1..25, every fifth a run completion
    cut = 20
    # A message arrives while the summary is being written: it is after the cut.
    await store.append(conv, [Message.user("one more thing")])
    boundary = await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="HANDOFF: five requests handled",
            covers_through_seq=cut,
            retained=["request 3", "request 4"],
            reason="unfinished_turns",
            usage=Usage(input_tokens=900, output_tokens=60),
            model="fake-model",
            expected_boundary_seq=None,
        ),
    )
    assert boundary.seq == 27
    assert boundary.covers_through_seq == cut
    ctx = await store.load_context(conv)
    texts = [m.text for m in ctx.messages]
    assert texts[:3] == ["HANDOFF: five requests handled", "request 3", "request 4"]
    assert all(m.role == "user" for m in ctx.messages[:3])
    assert [m.seq for m in ctx.messages[3:]] == [21, 22, 23, 24, 26]
    assert texts[-1] == "one more thing"
    assert ctx.boundary == boundary
    head = await store.get_conversation(conv)
    assert head.boundary_seq == 27
    assert head.context_tokens == ctx.estimated_tokens
    assert head.user_messages_since_boundary == 2
    assert head.user_messages_since_run_completed == 1
    validate_history(list(ctx.messages))


async def test_stale_expected_boundary_conflicts_and_writes_nothing(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await _history(store, turns=2)
    first = await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="one",
            covers_through_seq=5,
            reason="manual_recovery",
            expected_boundary_seq=None,
        ),
    )
    before = await snapshot(database_url)
    with pytest.raises(ConflictError):
        await store.write_boundary(
            conv,
            BoundaryRequest(
                summary="two",
                covers_through_seq=10,
                reason="manual_recovery",
                expected_boundary_seq=None,
            ),
        )
    assert await snapshot(database_url) == before
    second = await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="two",
            covers_through_seq=10,
            reason="manual_recovery",
            expected_boundary_seq=first.seq,
        ),
    )
    ctx = await store.load_context(conv)
    assert ctx.messages[0].text == "two"
    assert ctx.boundary == second


@pytest.mark.parametrize("case", ["open_call", "result_after_cut", "past_the_end", "backwards"])
async def test_unsafe_cuts_are_refused(store: EpisodicStore, database_url: str, case: str) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("go"), Message.assistant(None, tool_calls=[call("a")])])
    await store.append(conv, [Message.user("still there?")])  # seq 3, call a still open
    if case in ("result_after_cut", "backwards"):
        await store.append(conv, [Message.tool_result("a", "done", name="run")])  # seq 4
    if case == "backwards":
        await store.write_boundary(
            conv,
            BoundaryRequest(
                summary="s", covers_through_seq=4, reason="r", expected_boundary_seq=None
            ),
        )
    before = await snapshot(database_url)
    cut = {"open_call": 2, "result_after_cut": 3, "past_the_end": 99, "backwards": 1}[case]
    expected = 5 if case == "backwards" else None
    with pytest.raises(UnsafeCutError):
        await store.write_boundary(
            conv,
            BoundaryRequest(
                summary="s", covers_through_seq=cut, reason="r", expected_boundary_seq=expected
            ),
        )
    assert await snapshot(database_url) == before


async def test_calls_without_results_are_paired_at_load(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(
        conv,
        [Message.user("check both"), Message.assistant("on it", tool_calls=[call("a"), call("b")])],
    )
    await store.append(conv, [Message.user("hurry up")])  # interrupts before the results
    await store.append(conv, [Message.tool_result("a", "a done", name="run")])
    await store.mark_run_completed(conv)  # b is abandoned
    await store.append(conv, [Message.user("what happened?")])
    ctx = await store.load_context(conv)
    roles = [(m.role, m.tool_call_id) for m in ctx.messages]
    assert roles == [
        ("user", None),
        ("assistant", None),
        ("tool", "a"),
        ("tool", "b"),
        ("user", None),
        ("user", None),
    ]
    synthetic = ctx.messages[3]
    assert synthetic.is_error
    assert synthetic.text == MISSING_RESULT_TEXT
    assert synthetic.seq is None
    validate_history(list(ctx.messages))
    openai = ctx.to_openai()
    assert openai[2] == {"role": "tool", "tool_call_id": "a", "content": "a done"}


async def test_long_tool_results_are_cut_at_load_only(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    big = "line of output\n" * 2_000
    await store.append(
        conv,
        [
            Message.user("dump it"),
            Message.assistant(None, tool_calls=[call("x")]),
            Message.tool_result("x", big, name="run"),
        ],
    )
    ctx = await store.load_context(conv, max_tool_result_tokens=200)
    result = ctx.messages[2]
    assert "cut" in result.text
    assert result.token_estimate is not None
    assert result.token_estimate < 300
    events = await store.read_events(conv)
    assert isinstance(events[2], MessageEvent)
    assert events[2].message.text == big
    with pytest.raises(ValidationError):
        await store.load_context(conv, max_tool_result_tokens=0)


async def test_pressure_comes_from_the_head(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a" * 400)])
    pressure = await store.pressure(conv)
    assert pressure.estimated_context_tokens == (await store.load_context(conv)).estimated_tokens
    await store.append(conv, [Message.assistant("b" * 40)], usage=Usage(input_tokens=50_000))
    await store.append(conv, [Message.user("c" * 40)])
    pressure = await store.pressure(conv)
    head = await store.get_conversation(conv)
    assert pressure.estimated_context_tokens == 50_000 + head.tokens_since_usage
    assert head.tokens_since_usage > 0
    assert pressure.total_user_messages == 2
    assert pressure.user_messages_after_latest_run_completed == 2
    later = await store.pressure(conv, now=datetime.now(UTC) + timedelta(days=31))
    assert later.conversation_age_days == 31
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="short",
            covers_through_seq=3,
            reason="context_pressure",
            usage=Usage(input_tokens=70_000, output_tokens=500),
            expected_boundary_seq=None,
        ),
    )
    after = await store.pressure(conv)
    # The summarizer's own usage never feeds the pressure signal.
    assert after.estimated_context_tokens is not None
    assert after.estimated_context_tokens < 100
    assert after.user_messages_since_boundary == 0


async def test_recent_turns_retention(store: EpisodicStore) -> None:
    conv = await _history(store, turns=4)
    # Keep the last two user turns verbatim: cut before the first of them (seq 11).
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="earlier turns",
            covers_through_seq=10,
            reason="context_pressure",
            retention="recent_turns",
            expected_boundary_seq=None,
        ),
    )
    ctx = await store.load_context(conv)
    assert ctx.messages[0].text == "earlier turns"
    assert ctx.messages[1].text == "request 2"
    assert ctx.boundary is not None
    assert ctx.boundary.retention == "recent_turns"


async def test_lease_fencing(store: EpisodicStore) -> None:
    conv = await _history(store, turns=1)
    with pytest.raises(LeaseLostError):
        await store.write_boundary(
            conv,
            BoundaryRequest(
                summary="s",
                covers_through_seq=5,
                reason="r",
                expected_boundary_seq=None,
                lease_token=uuid4(),
            ),
        )


async def test_head_is_the_fold_of_a_log_with_boundaries(store: EpisodicStore) -> None:
    conv = await _history(store, turns=3)
    b1 = await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="first",
            covers_through_seq=5,
            retained=["request 0"],
            reason="r",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conv, [Message.user("x"), Message.assistant(None, tool_calls=[call("z")])])
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="second", covers_through_seq=15, reason="r", expected_boundary_seq=b1.seq
        ),
    )
    head = await store.get_conversation(conv)
    assert rebuild_head(await store.read_events(conv)) == counters_of(head)
    events = await store.read_events(conv)
    assert sum(isinstance(e, BoundaryEvent) for e in events) == 2


async def test_unknown_conversation(store: EpisodicStore) -> None:
    with pytest.raises(NotFoundError):
        await store.load_context(uuid4())
    with pytest.raises(NotFoundError):
        await store.pressure(uuid4())
    with pytest.raises(NotFoundError):
        await store.write_boundary(
            uuid4(),
            BoundaryRequest(
                summary="s", covers_through_seq=1, reason="r", expected_boundary_seq=None
            ),
        )
