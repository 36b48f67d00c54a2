"""System messages are kept in the log and never loaded, on PostgreSQL and SQLite.

The agent owns its system prompt, so ``load_context`` never returns a system message; one
appended anyway is stored (``read_events`` and ``episodic show`` have it) and counts 0 tokens:
it moves neither the head's ``context_tokens`` nor the pressure, and the head still equals the
fold of the log.
"""

from __future__ import annotations

from episodic import BoundaryRequest, EpisodicStore, Message, MessageEvent, ToolCall, Usage
from episodic.store.projection import rebuild_head
from tests.support import counters_of

PROMPT = "You are a careful engineer. " * 40  # long enough to matter if it were counted


async def test_a_system_message_is_kept_but_never_loaded(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    events = await store.append(
        conv, [Message.system(PROMPT), Message.user("Fix the test"), Message.assistant("On it.")]
    )
    assert [e.message.role for e in events] == ["system", "user", "assistant"]
    assert events[0].token_estimate == 0
    assert events[0].message.token_estimate == 0
    assert all(e.token_estimate > 0 for e in events[1:])

    stored = await store.read_events(conv)
    assert stored == events
    assert isinstance(stored[0], MessageEvent)
    assert stored[0].message.content == PROMPT

    context = await store.load_context(conv)
    assert [m.role for m in context.messages] == ["user", "assistant"]
    assert context.estimated_tokens == sum(e.token_estimate for e in events[1:])


async def test_a_system_message_adds_no_pressure(store: EpisodicStore) -> None:
    plain = await store.create_conversation()
    conv = await store.create_conversation()
    turn = [
        Message.user("Fix the test"),
        Message.assistant(None, tool_calls=[ToolCall(id="c1", name="run", args={"cmd": "x"})]),
        Message.tool_result("c1", "1 failed", name="run"),
    ]
    for cid in (plain, conv):
        await store.append(cid, turn, usage=Usage(input_tokens=50))
    head_before = await store.get_conversation(conv)
    pressure_before = await store.pressure(conv)

    await store.append(conv, [Message.system(PROMPT)])
    head = await store.get_conversation(conv)
    assert head.last_seq == head_before.last_seq + 1  # stored...
    assert head.context_tokens == head_before.context_tokens  # ...and not counted
    assert head.tokens_since_usage == head_before.tokens_since_usage
    assert (await store.pressure(conv)) == pressure_before

    # mixed into a batch, it adds nothing either: the same as without it
    await store.append(conv, [Message.system("Be terse."), Message.user("and?")])
    await store.append(plain, [Message.user("and?")])
    head, plain_head = await store.get_conversation(conv), await store.get_conversation(plain)
    assert head.context_tokens == plain_head.context_tokens > head_before.context_tokens
    assert head.tokens_since_usage == plain_head.tokens_since_usage
    assert (await store.pressure(conv)).estimated_context_tokens == (
        await store.pressure(plain)
    ).estimated_context_tokens
    assert rebuild_head(await store.read_events(conv)) == counters_of(head)


async def test_head_equals_the_fold_with_system_messages_across_a_boundary(
    store: EpisodicStore,
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.system(PROMPT), Message.user("one"), Message.assistant("a")])
    boundary = await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="handoff",
            covers_through_seq=3,
            reason="manual_recovery",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conv, [Message.system(PROMPT), Message.user("two")])
    head = await store.get_conversation(conv)
    assert rebuild_head(await store.read_events(conv)) == counters_of(head)
    context = await store.load_context(conv)
    assert [m.role for m in context.messages] == ["user", "user"]
    [_, two] = context.messages
    assert head.context_tokens == boundary.token_estimate + (two.token_estimate or 0)
    assert context.estimated_tokens == head.context_tokens


async def test_a_developer_message_round_trips_through_the_store(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    data = {"role": "developer", "content": "Be terse."}
    [event] = await store.append(conv, [Message.from_openai(data)])
    [back] = await store.read_events(conv)
    assert isinstance(back, MessageEvent)
    assert back.message.role == "system"
    assert back.message.to_openai() == data
    assert event.token_estimate == 0
