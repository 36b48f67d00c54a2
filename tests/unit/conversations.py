"""Hypothesis strategies for conversations: parallel tool calls, pending and abandoned calls,
images, private reasoning and multibyte text."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from hypothesis import strategies as st

from episodic.models import (
    BoundaryEvent,
    ImageBlock,
    Message,
    MessageEvent,
    RunCompletedEvent,
    StoredEvent,
    TextBlock,
    ToolCall,
)

CONVERSATION_ID = UUID("00000000-0000-4000-8000-000000000001")
T0 = datetime(2025, 1, 1, tzinfo=UTC)

#: Any text without lone surrogates: ASCII, accents, CJK, emoji (4-byte UTF-8) and so on.
texts = st.text(max_size=30)
non_empty_texts = st.text(min_size=1, max_size=30)


@st.composite
def user_messages(draw: st.DrawFn) -> Message:
    if draw(st.booleans()):
        return Message.user(draw(texts))
    blocks = draw(
        st.lists(
            st.one_of(
                st.builds(TextBlock, text=texts),
                st.builds(
                    ImageBlock,
                    url=st.just("data:image/png;base64,AAAA"),
                    alt=st.none() | texts,
                ),
            ),
            min_size=1,
            max_size=3,
        )
    )
    return Message.user(tuple(blocks))


reasoning = st.none() | st.text(max_size=3_000)


@st.composite
def assistant_texts(draw: st.DrawFn) -> Message:
    return Message.assistant(draw(st.none() | texts), reasoning=draw(reasoning))


@st.composite
def tool_batches(draw: st.DrawFn, first_id: int) -> list[Message]:
    """An assistant message with 1-3 parallel calls and their results, in any order."""
    ids = [f"call_{first_id + i}" for i in range(draw(st.integers(1, 3)))]
    calls = [ToolCall(id=call_id, name="run", args={"n": i}) for i, call_id in enumerate(ids)]
    results = [
        Message.tool_result(call_id, draw(texts), name="run", is_error=draw(st.booleans()))
        for call_id in draw(st.permutations(ids))
    ]
    return [Message.assistant(draw(st.none() | texts), tool_calls=calls), *results]


@st.composite
def valid_histories(draw: st.DrawFn, max_turns: int = 8) -> list[Message]:
    """Histories a provider accepts: calls answered right after them, ending with user/tool."""
    messages: list[Message] = []
    next_id = 0
    for _ in range(draw(st.integers(1, max_turns))):
        kind = draw(st.sampled_from(["user", "assistant", "tools"]))
        if kind == "user":
            messages.append(draw(user_messages()))
        elif kind == "assistant":
            messages.append(draw(assistant_texts()))
        else:
            batch = draw(tool_batches(next_id))
            next_id += len(batch)
            messages.extend(batch)
    if messages[-1].role not in ("user", "tool"):
        messages.append(draw(user_messages()))
    return messages


@st.composite
def arbitrary_histories(draw: st.DrawFn) -> list[Message]:
    """Messages in any order from a small id pool: mostly broken, sometimes fine."""
    pool = ["a", "b", "c"]

    def one(kind: str) -> Message:
        if kind == "user":
            return Message.user(draw(texts))
        if kind == "system":
            return Message.system("be brief")
        if kind == "assistant":
            ids = draw(st.lists(st.sampled_from(pool), max_size=3, unique=True))
            return Message.assistant("x", tool_calls=[ToolCall(id=i, name="t") for i in ids])
        return Message.tool_result(draw(st.sampled_from(pool)), "r", name="t")

    kinds = st.sampled_from(["user", "assistant", "assistant", "tool", "tool", "system"])
    return [one(kind) for kind in draw(st.lists(kinds, max_size=7))]


@st.composite
def mutated_histories(draw: st.DrawFn) -> list[Message]:
    """A valid history with one edit: a message dropped, duplicated, moved or appended."""
    messages = draw(valid_histories())
    edit = draw(st.sampled_from(["drop", "duplicate", "swap", "append"]))
    i = draw(st.integers(0, len(messages) - 1))
    j = draw(st.integers(0, len(messages) - 1))
    if edit == "drop":
        del messages[i]
    elif edit == "duplicate":
        messages.insert(j, messages[i])
    elif edit == "swap":
        messages[i], messages[j] = messages[j], messages[i]
    else:
        messages.append(draw(st.one_of(assistant_texts(), st.just(Message.system("s")))))
    return messages


any_histories = st.one_of(valid_histories(), mutated_histories(), arbitrary_histories())


@dataclass(frozen=True)
class CallRecord:
    """Ground truth for one tool call in a generated log."""

    call_id: str
    call_seq: int
    result_seq: int | None
    abandoned: bool


@dataclass(frozen=True)
class GeneratedLog:
    events: list[StoredEvent]
    calls: list[CallRecord]


@st.composite
def stored_logs(draw: st.DrawFn) -> GeneratedLog:
    """A log as the store writes it: results may arrive after later user messages, runs
    complete and abandon what is still open, ids are reused once answered, boundaries occur."""
    events: list[StoredEvent] = []
    open_calls: dict[str, int] = {}
    records: dict[tuple[str, int], CallRecord] = {}
    answered: list[str] = []
    counter = 0

    def add_message(message: Message) -> int:
        seq = len(events) + 1
        events.append(
            MessageEvent(
                conversation_id=CONVERSATION_ID,
                seq=seq,
                created_at=T0,
                token_estimate=1,
                message=message,
            )
        )
        return seq

    steps = st.sampled_from(["user", "assistant", "calls", "result", "result", "run", "boundary"])
    for step in draw(st.lists(steps, max_size=20)):
        if step == "user":
            add_message(Message.user("u"))
        elif step == "assistant":
            add_message(Message.assistant("a"))
        elif step == "calls":
            ids: list[str] = []
            for _ in range(draw(st.integers(1, 3))):
                reusable = [i for i in answered if i not in open_calls and i not in ids]
                reuse = draw(st.booleans())
                if reusable and reuse:
                    ids.append(draw(st.sampled_from(reusable)))
                else:
                    counter += 1
                    ids.append(f"c{counter}")
            seq = add_message(
                Message.assistant(None, tool_calls=[ToolCall(id=i, name="t") for i in ids])
            )
            for call_id in ids:
                open_calls[call_id] = seq
        elif step == "result" and open_calls:
            call_id = draw(st.sampled_from(sorted(open_calls)))
            call_seq = open_calls.pop(call_id)
            seq = add_message(Message.tool_result(call_id, "r", name="t"))
            records[(call_id, call_seq)] = CallRecord(call_id, call_seq, seq, abandoned=False)
            answered.append(call_id)
        elif step == "run":
            abandoned = tuple(open_calls)
            events.append(
                RunCompletedEvent(
                    conversation_id=CONVERSATION_ID,
                    seq=len(events) + 1,
                    created_at=T0,
                    token_estimate=0,
                    abandoned_tool_call_ids=abandoned,
                )
            )
            for call_id, call_seq in open_calls.items():
                records[(call_id, call_seq)] = CallRecord(call_id, call_seq, None, abandoned=True)
            open_calls.clear()
        elif step == "boundary" and events:
            events.append(
                BoundaryEvent(
                    conversation_id=CONVERSATION_ID,
                    seq=len(events) + 1,
                    created_at=T0,
                    token_estimate=0,
                    summary="s",
                    covers_through_seq=len(events),
                    reason="manual_recovery",
                )
            )
    for call_id, call_seq in open_calls.items():
        records[(call_id, call_seq)] = CallRecord(call_id, call_seq, None, abandoned=False)
    return GeneratedLog(events, list(records.values()))
