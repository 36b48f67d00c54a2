"""Pinned instructions: a user message appended with ``pinned`` is carried word for word by
every handoff the worker writes after it, until ``store.unpin`` appends an unpin event; what
is not a pinned user message cannot be unpinned, and the refusal writes nothing."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest

from episodic import (
    EpisodicCompactionConfig,
    EpisodicStore,
    Message,
    NotFoundError,
    NotPinnedError,
    ToolCall,
    UnpinEvent,
    ValidationError,
)
from episodic.compaction import CompactionConfig
from tests.contract.test_worker import ScriptedSummarizer, _worker
from tests.support import FILE_LISTING, snapshot

RULE = "Standing rule: reply in French, and keep every answer under fifty words."


async def _turn(store: EpisodicStore, conv: UUID, turn: int) -> None:
    await store.append(
        conv,
        [
            Message.user(f"request {turn}"),
            Message.assistant(None, tool_calls=[ToolCall(id=f"c{turn}", name="run")]),
            Message.tool_result(f"c{turn}", f"output {turn}:\n{FILE_LISTING}", name="run"),
            Message.assistant(f"answer {turn}"),
        ],
    )


async def _compact(
    store: EpisodicStore,
    conv: UUID,
    first_turn: int,
    *,
    recent_user_tokens: int = 5,
    detect_instructions: bool = True,
) -> str:
    """Three more turns (the trigger's count), then one compaction that retains only the
    newest user message (``recent_user_tokens``): its handoff."""
    for turn in range(first_turn, first_turn + 3):
        await _turn(store, conv, turn)
    config = CompactionConfig(detect_instructions=detect_instructions).with_limits(
        recent_user_token_budget=recent_user_tokens
    )
    worker = _worker(store, ScriptedSummarizer("## Progress\n- working"), compaction=config)
    [result] = await worker.run_once()
    assert result.outcome == "succeeded", result
    context = await store.load_context(conv)
    assert context.boundary is not None
    return context.boundary.summary


def test_only_a_user_message_can_be_pinned() -> None:
    assert Message.user("always answer in French", pinned=True).pinned
    for role in ("assistant", "system"):
        with pytest.raises(ValidationError, match=f"only user messages can be pinned.*{role}"):
            Message(role=role, content="x", pinned=True)  # type: ignore[arg-type]


async def test_a_pin_is_kept_in_the_log_and_an_unpin_is_an_event(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    [pinned, plain] = await store.append(
        conv, [Message.user(RULE, pinned=True), Message.user("hello")]
    )
    events = await store.read_events(conv)
    assert [e.message.pinned for e in events if e.kind == "message"] == [True, False]
    before = await store.load_context(conv)

    unpin = await store.unpin(conv, pinned.seq)

    assert isinstance(unpin, UnpinEvent)
    assert (unpin.seq, unpin.unpinned_seq, unpin.token_estimate) == (plain.seq + 1, pinned.seq, 0)
    assert (await store.read_events(conv))[-1] == unpin
    after = await store.load_context(conv)
    assert after.messages == before.messages  # the message itself stays in view
    assert after.last_seq == unpin.seq


async def test_unpin_refuses_what_is_not_a_pinned_user_message(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user(RULE, pinned=True), Message.user("plain")])
    await store.append(conv, [Message.assistant("ok")])
    before = await snapshot(database_url)
    for seq, what in (
        (2, "user message that is not pinned"),
        (3, "assistant message"),
        (9, "no event"),
    ):
        with pytest.raises(NotPinnedError, match=f"seq {seq} .* is (a |){what}") as raised:
            await store.unpin(conv, seq)
        assert raised.value.field == "seq"
    with pytest.raises(ValidationError):
        await store.unpin(conv, 0)
    with pytest.raises(NotFoundError):
        await store.unpin(uuid4(), 1)
    assert await snapshot(database_url) == before


async def test_every_later_handoff_carries_a_pin_until_it_is_unpinned(
    store: EpisodicStore,
) -> None:
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=3)
    conv = first_conv = await store.create_conversation()
    [pin] = await store.append(conv, [Message.user(RULE, pinned=True)])

    first = await _compact(store, conv, 0)
    second = await _compact(store, conv, 3)  # built on the first boundary's state

    for handoff in (first, second):
        assert RULE in handoff
    context = await store.load_context(conv)
    assert sum(m.text.count(RULE) for m in context.messages) == 1

    # Retained as a recent user message, it is not repeated by the handoff.
    conv = await store.create_conversation()
    await store.append(conv, [Message.user(RULE, pinned=True)])
    assert RULE not in await _compact(store, conv, 0, recent_user_tokens=20_000)
    context = await store.load_context(conv)
    assert sum(m.text.count(RULE) for m in context.messages) == 1
    conv = first_conv

    await store.unpin(conv, pin.seq)
    third = await _compact(store, conv, 6)
    assert RULE not in third
    assert (await store.read_events(conv, after_seq=pin.seq - 1, limit=1))[0].message.pinned


async def test_pins_come_first_and_detected_rules_and_reminders_after_them(
    store: EpisodicStore,
) -> None:
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=3)
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("Never touch the billing module.")])
    await store.append(conv, [Message.user(RULE, pinned=True)])
    await store.append(conv, [Message.user("At the end, mail the report; don't forget that.")])
    handoff = await _compact(store, conv, 0)
    # the pin, then what was detected, newest first
    assert handoff.index(RULE) < handoff.index("don't forget") < handoff.index("Never touch")

    await store.unpin(conv, 2)
    handoff = await _compact(store, conv, 3)
    assert RULE not in handoff
    assert "Never touch the billing module." in handoff  # nothing pinned: detected again

    conv = await store.create_conversation()
    await store.append(conv, [Message.user("Never touch the billing module.")])
    handoff = await _compact(store, conv, 0, detect_instructions=False)
    assert "Never touch" not in handoff
