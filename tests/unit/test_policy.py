"""The episodic trigger rules, whole-day ages, and safe cuts over the event log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episodic.errors import ValidationError
from episodic.models import Message, MessageEvent, RunCompletedEvent, StoredEvent, ToolCall
from episodic.policy import (
    EpisodicCompactionConfig,
    EpisodicCompactionPressure,
    EpisodicCompactionTrigger,
    age_in_days,
    episodic_compaction_trigger,
    open_tool_calls,
    resting_cut,
    safe_cut,
    safe_cut_at_or_before,
)

from .conversations import CONVERSATION_ID, T0, CallRecord, GeneratedLog, stored_logs

Trigger = EpisodicCompactionTrigger
DEFAULTS = EpisodicCompactionConfig()


def _trigger(config: EpisodicCompactionConfig = DEFAULTS, **pressure: int | None) -> Trigger | None:
    return episodic_compaction_trigger(EpisodicCompactionPressure(**pressure), config)


def test_defaults() -> None:
    assert DEFAULTS.model_dump() == {
        "trigger_context_tokens": 100_000,
        "trigger_unfinished_turns": 8,
        "trigger_age_days": 30,
        "trigger_age_turn_count": 50,
    }
    assert EpisodicCompactionPressure().model_dump() == {
        "estimated_context_tokens": None,
        "user_messages_since_boundary": 0,
        "run_completed_since_boundary": 0,
        "user_messages_after_latest_run_completed": 0,
        "conversation_age_days": 0,
        "total_user_messages": 0,
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CONTEXT_PRESSURE", "context_pressure"),
        ("UNFINISHED_TURNS", "unfinished_turns"),
        ("AGE_AND_TURNS", "age_and_turns"),
        ("MANUAL_RECOVERY", "manual_recovery"),
    ],
)
def test_trigger_strings_are_stable(name: str, value: str) -> None:
    assert EpisodicCompactionTrigger[name] == value
    assert str(EpisodicCompactionTrigger[name]) == value


def test_nothing_fires_on_an_empty_conversation() -> None:
    assert _trigger() is None


@pytest.mark.parametrize(
    ("estimate", "limit", "expected"),
    [
        (999, 1_000, None),
        (1_000, 1_000, Trigger.CONTEXT_PRESSURE),
        (1_001, 1_000, Trigger.CONTEXT_PRESSURE),
        (None, 1_000, None),
        (10**9, None, None),
        (None, None, None),
        (0, 0, Trigger.CONTEXT_PRESSURE),
    ],
)
def test_context_pressure_rule(
    estimate: int | None, limit: int | None, expected: Trigger | None
) -> None:
    config = EpisodicCompactionConfig(trigger_context_tokens=limit)
    assert _trigger(config, estimated_context_tokens=estimate) == expected


@pytest.mark.parametrize(
    ("unfinished", "expected"),
    [(7, None), (8, Trigger.UNFINISHED_TURNS), (9, Trigger.UNFINISHED_TURNS)],
)
def test_unfinished_turns_rule(unfinished: int, expected: Trigger | None) -> None:
    assert _trigger(user_messages_after_latest_run_completed=unfinished) == expected


@pytest.mark.parametrize(
    ("age", "turns", "expected"),
    [
        (29, 50, None),
        (30, 49, None),
        (30, 50, Trigger.AGE_AND_TURNS),
        (31, 51, Trigger.AGE_AND_TURNS),
        (1_000, 0, None),
        (0, 1_000, None),
    ],
)
def test_age_and_turns_rule_needs_both(age: int, turns: int, expected: Trigger | None) -> None:
    assert _trigger(conversation_age_days=age, total_user_messages=turns) == expected


def test_since_boundary_counts_decide_nothing() -> None:
    assert _trigger(user_messages_since_boundary=10**6, run_completed_since_boundary=10**6) is None


def test_rules_apply_in_order_first_match_wins() -> None:
    everything = {
        "estimated_context_tokens": 5_000,
        "user_messages_after_latest_run_completed": 100,
        "conversation_age_days": 100,
        "total_user_messages": 100,
    }
    on = EpisodicCompactionConfig(trigger_context_tokens=1_000)
    assert _trigger(on, **everything) == Trigger.CONTEXT_PRESSURE
    assert _trigger(DEFAULTS, **everything) == Trigger.UNFINISHED_TURNS
    assert _trigger(on, **{**everything, "estimated_context_tokens": 999}) == (
        Trigger.UNFINISHED_TURNS
    )
    assert _trigger(on, **{**everything, "estimated_context_tokens": None}) == (
        Trigger.UNFINISHED_TURNS
    )
    assert _trigger(DEFAULTS, **{**everything, "user_messages_after_latest_run_completed": 7}) == (
        Trigger.AGE_AND_TURNS
    )


def test_manual_recovery_is_never_automatic() -> None:
    seen = {
        _trigger(
            EpisodicCompactionConfig(trigger_context_tokens=t),
            estimated_context_tokens=e,
            user_messages_after_latest_run_completed=u,
            conversation_age_days=a,
            total_user_messages=n,
        )
        for t in (None, 0, 10)
        for e in (None, 0, 10)
        for u in (0, 8)
        for a in (0, 30)
        for n in (0, 50)
    }
    assert Trigger.MANUAL_RECOVERY not in seen
    assert seen == {None, *(t for t in Trigger if t is not Trigger.MANUAL_RECOVERY)}


def test_pressure_refuses_negative_counts() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        EpisodicCompactionPressure(total_user_messages=-1)


@pytest.mark.parametrize(
    "fields",
    [
        {"trigger_unfinished_turns": -1},
        {"trigger_context_tokens": "many"},
        {"trigger_age_days": 1.5},
        {"trigger_everything": True},
    ],
)
def test_config_refuses_with_episodic_validation_error(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=r"^invalid EpisodicCompactionConfig: ") as caught:
        EpisodicCompactionConfig(**fields)
    assert not isinstance(caught.value, pydantic.ValidationError)
    assert caught.value.field == next(iter(fields))
    with pytest.raises(ValidationError):
        EpisodicCompactionConfig.model_validate(fields)


# ---- age -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "days"),
    [
        (timedelta(0), 0),
        (timedelta(days=1) - timedelta(microseconds=1), 0),
        (timedelta(days=1), 1),
        (timedelta(days=30, hours=23), 30),
        (-timedelta(hours=5), 0),
    ],
)
def test_age_in_whole_days(delta: timedelta, days: int) -> None:
    created = datetime(2025, 3, 1, 12, tzinfo=UTC)
    assert age_in_days(created, created + delta) == days


# ---- safe cuts -------------------------------------------------------------------------


def _events(*messages: Message | tuple[str, ...]) -> list[StoredEvent]:
    """A log from messages; a tuple of ids stands for a run completion abandoning them."""
    out: list[StoredEvent] = []
    for seq, item in enumerate(messages, start=1):
        if isinstance(item, tuple):
            out.append(
                RunCompletedEvent(
                    conversation_id=CONVERSATION_ID,
                    seq=seq,
                    created_at=T0,
                    token_estimate=0,
                    abandoned_tool_call_ids=item,
                )
            )
        else:
            out.append(
                MessageEvent(
                    conversation_id=CONVERSATION_ID,
                    seq=seq,
                    created_at=T0,
                    token_estimate=1,
                    message=item,
                )
            )
    return out


def _calls(*ids: str) -> Message:
    return Message.assistant(None, tool_calls=[ToolCall(id=i, name="t") for i in ids])


def _result(call_id: str) -> Message:
    return Message.tool_result(call_id, "ok", name="t")


USER = Message.user("u")


@pytest.mark.parametrize(
    ("log", "cut"),
    [
        ([], 0),
        ([USER], 1),
        ([USER, _calls("a")], 1),
        ([USER, _calls("a"), _result("a")], 3),
        ([USER, _calls("a", "b"), _result("b"), USER], 1),
        ([_calls("a"), USER, _result("a"), USER], 4),
        ([_calls("a"), USER], 0),
        # The call closed as abandoned holds back no cut, not even before its closing.
        ([USER, _calls("a"), USER, ("a",)], 4),
        ([USER, _calls("a"), _result("a"), _calls("a"), USER, ("a",)], 6),
        # An id reused after its first call was answered: only the second call is abandoned.
        ([USER, _calls("a"), USER, _result("a"), _calls("a"), ("a",)], 6),
    ],
)
def test_safe_cut_table(log: list[Message | tuple[str, ...]], cut: int) -> None:
    assert safe_cut(_events(*log)) == cut


ANSWER = Message.assistant("answered")
THINKING = Message.assistant(None, reasoning="let me see")
# A built-in tool item is read as text, yet the run waits on it.
COMPUTER_CALL = Message.from_responses_item(
    {"type": "computer_call", "id": "cu_1", "call_id": "c1", "action": {"type": "screenshot"}}
)
STATE_ONLY = Message.assistant(None)  # an agent framework's event with no content


@pytest.mark.parametrize(
    ("log", "cut"),
    [
        ([], 0),
        ([USER, ANSWER], 2),
        # The newest question is not answered yet: its run is in progress.
        ([USER, ANSWER, USER], 2),
        ([USER, ANSWER, USER, _calls("a"), _result("a")], 2),
        ([USER, ANSWER, USER, THINKING], 2),
        ([USER, ANSWER, USER, _calls("a"), _result("a"), ANSWER], 6),
        # A run completion puts it at rest, answered or not.
        ([USER, ANSWER, USER, _calls("a"), ("a",)], 5),
        # A system message neither starts nor ends a run.
        ([USER, ANSWER, Message.system("be brief")], 3),
        # No question in view: the run began before the cut, nothing of it is covered.
        ([_calls("a"), _result("a")], 0),
        ([USER, USER, USER], 2),
        ([USER, ANSWER, USER, COMPUTER_CALL], 2),
        ([USER, ANSWER, STATE_ONLY], 3),
        ([USER, ANSWER, USER, STATE_ONLY], 2),
        ([STATE_ONLY, _calls("a"), _result("a")], 1),  # only the state-only event
    ],
)
def test_resting_cut_leaves_a_run_in_progress_out(
    log: list[Message | tuple[str, ...]], cut: int
) -> None:
    assert resting_cut(_events(*log)) == cut


def test_safe_cut_at_or_before_moves_an_unsafe_cut_earlier() -> None:
    events = _events(USER, _calls("a"), USER, _result("a"), USER)
    assert [safe_cut_at_or_before(events, s) for s in range(7)] == [0, 1, 1, 1, 4, 5, 5]


def test_open_tool_calls() -> None:
    events = _events(USER, _calls("a", "b"), _result("a"), _calls("c"), ("b",))
    assert open_tool_calls(events) == ("c",)


def _oracle_safe(log: GeneratedLog, cut: int) -> bool:
    """No call at or before ``cut`` that was not abandoned has its result after it (or none)."""
    return all(
        call.abandoned or (call.result_seq is not None and call.result_seq <= cut)
        for call in log.calls
        if call.call_seq <= cut
    )


def _open_across(calls: list[CallRecord], cut: int) -> list[CallRecord]:
    return [
        c
        for c in calls
        if c.call_seq <= cut and not c.abandoned and (c.result_seq is None or c.result_seq > cut)
    ]


@settings(max_examples=200, deadline=None)
@given(log=stored_logs(), requested=st.integers(0, 25))
def test_safe_cut_never_leaves_a_call_open_across_it(log: GeneratedLog, requested: int) -> None:
    cut = safe_cut(log.events)
    assert _open_across(log.calls, cut) == []
    safe = [0, *(e.seq for e in log.events if _oracle_safe(log, e.seq))]
    assert cut == max(safe)
    moved = safe_cut_at_or_before(log.events, requested)
    assert moved == max(s for s in safe if s <= requested)
