"""When a conversation's history is due for a summary boundary, and where a boundary may cut.

Pure and synchronous: the store measures pressure from its head counters and passes it in,
and callers pass ``now``; nothing here reads a clock or a database.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from episodic.models import (
    OPENAI_RESPONSES_PROTOCOL,
    EpisodicModel,
    Message,
    MessageEvent,
    RunCompletedEvent,
    StoredEvent,
)
from episodic.view import in_view

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_Count = Annotated[int, Field(ge=0)]

SECONDS_PER_DAY = 86_400


class EpisodicCompactionTrigger(StrEnum):
    """Why a boundary was written; the strings are stored on boundaries and attempts."""

    CONTEXT_PRESSURE = "context_pressure"
    UNFINISHED_TURNS = "unfinished_turns"
    AGE_AND_TURNS = "age_and_turns"
    #: Forced by an operator; :func:`episodic_compaction_trigger` never returns it.
    MANUAL_RECOVERY = "manual_recovery"


class EpisodicCompactionPressure(EpisodicModel):
    """A conversation's pressure relative to its latest boundary, as the store measures it.

    ``user_messages_after_latest_run_completed`` counts user messages after the latest clean
    run completion, or after the boundary when there is none: turns that never finished.
    ``user_messages_since_boundary`` and ``run_completed_since_boundary`` are recorded on the
    boundary for the record but decide nothing.
    """

    model_config = _FROZEN

    estimated_context_tokens: _Count | None = None
    user_messages_since_boundary: _Count = 0
    run_completed_since_boundary: _Count = 0
    user_messages_after_latest_run_completed: _Count = 0
    conversation_age_days: _Count = 0
    total_user_messages: _Count = 0


#: The context-pressure threshold when nothing else is said: below the 128k-token window of
#: the smallest common model (GPT-4o, Llama 3.1, Qwen 2.5), with 28k left for the system
#: prompt, tool schemas and the reply, and well under what a 200k or 1M window holds, where
#: answers already degrade long before the window is full. A context this size also reaches
#: a 128k summarizer whole (the transcript cap is higher).
DEFAULT_TRIGGER_CONTEXT_TOKENS = 100_000


class EpisodicCompactionConfig(EpisodicModel):
    """Thresholds of the episodic trigger. ``trigger_context_tokens=None`` turns off the
    context-pressure rule; the default suits windows of 128k tokens and more (a model with a
    smaller window wants a smaller value)."""

    model_config = _FROZEN

    trigger_context_tokens: _Count | None = DEFAULT_TRIGGER_CONTEXT_TOKENS
    trigger_unfinished_turns: _Count = 8
    trigger_age_days: _Count = 30
    trigger_age_turn_count: _Count = 50


def episodic_compaction_trigger(
    pressure: EpisodicCompactionPressure, config: EpisodicCompactionConfig
) -> EpisodicCompactionTrigger | None:
    """The first rule that fires, in order: context pressure, unfinished turns, age and turns;
    ``None`` when none does. Every comparison is ``>=``."""
    estimate = pressure.estimated_context_tokens
    limit = config.trigger_context_tokens
    if estimate is not None and limit is not None and estimate >= limit:
        return EpisodicCompactionTrigger.CONTEXT_PRESSURE
    if pressure.user_messages_after_latest_run_completed >= config.trigger_unfinished_turns:
        return EpisodicCompactionTrigger.UNFINISHED_TURNS
    if (
        pressure.conversation_age_days >= config.trigger_age_days
        and pressure.total_user_messages >= config.trigger_age_turn_count
    ):
        return EpisodicCompactionTrigger.AGE_AND_TURNS
    return None


def age_in_days(created_at: datetime, now: datetime) -> int:
    """Whole days from ``created_at`` to ``now``, never negative (clocks drift). Both must be
    timezone-aware or both naive, as for any datetime subtraction."""
    return max(int((now - created_at).total_seconds()) // SECONDS_PER_DAY, 0)


def safe_cut(events: Sequence[StoredEvent]) -> int:
    """The latest seq a boundary may cover through, 0 when there is none.

    A cut is safe when no tool call at or before it waits for a result after it; calls that a
    run completion closed as abandoned are ignored, so one lost result never blocks
    compaction. ``events`` are in ascending seq order.
    """
    cut = 0
    for seq in _safe_seqs(events):
        cut = seq
    return cut


def resting_cut(events: Sequence[StoredEvent]) -> int:
    """The latest safe cut that leaves a run still in progress out, 0 when there is none:
    what the compaction worker covers through.

    A run is at rest once the newest message in view is an answer (an assistant's reply:
    text, no tool calls, not a built-in tool item) or a run completion follows it; system
    messages and empty assistant messages (state-only events) change nothing. Otherwise the
    run that the newest user message began is still going (its agent may be waiting on a tool
    or on the model right now), so the cut stays before that message; and when no user
    message is in view, before anything in view (the run began before the latest cut).
    """
    newest_user: int | None = None
    at_rest = True
    first: int | None = None
    for event in in_view(events):
        if isinstance(event, RunCompletedEvent):
            at_rest = True
        elif isinstance(event, MessageEvent) and not _is_neutral(event.message):
            first = event.seq if first is None else first
            if event.message.role == "user":
                newest_user = event.seq
            at_rest = _is_answer(event.message)
    if at_rest:
        return safe_cut(events)
    # Not at rest means a message that is not neutral was seen: ``first`` is set.
    start = newest_user if newest_user is not None else first
    assert start is not None
    return safe_cut_at_or_before(events, start - 1)


def _is_answer(message: Message) -> bool:
    """An assistant's reply: text, no calls, and not a built-in tool item (a computer, shell
    or MCP call is kept as text for summarizers, but the run waits on it)."""
    if message.role != "assistant" or message.tool_calls or not message.text:
        return False
    native = message.native
    return (
        native is None
        or native.protocol != OPENAI_RESPONSES_PROTOCOL
        or native.data.get("type", "message") == "message"
    )


def _is_neutral(message: Message) -> bool:
    """Neither starts nor ends a run: a system message, or an assistant message of nothing
    (an agent framework's state-only event)."""
    return message.role == "system" or (
        message.role == "assistant"
        and not message.tool_calls
        and not message.text
        and not message.reasoning
    )


def safe_cut_at_or_before(events: Sequence[StoredEvent], seq: int) -> int:
    """The latest safe cut not after ``seq``: an unsafe requested cut moves earlier."""
    cut = 0
    for safe in _safe_seqs(events):
        if safe > seq:
            break
        cut = safe
    return cut


def open_tool_calls(events: Sequence[StoredEvent]) -> tuple[str, ...]:
    """Ids of the calls in ``events`` still waiting for a result, oldest first (a call a run
    completion closed as abandoned is not waiting)."""
    waiting: dict[str, int] = {}
    for event in in_view(events):
        _apply(event, waiting, frozenset())
    return tuple(waiting)


def _safe_seqs(events: Sequence[StoredEvent]) -> Iterator[int]:
    # Only what is in view counts: a retracted call waits for nothing, and a cut falls on an
    # event in view. Abandonment is recorded at the run completion, later in the log; a call
    # it closes never gets a result, so it must not hold back any cut, including the ones
    # before the closing.
    events = in_view(events)
    abandoned = _abandoned_calls(events)
    waiting: dict[str, int] = {}
    for event in events:
        _apply(event, waiting, abandoned)
        if not waiting:
            yield event.seq


def _abandoned_calls(events: Sequence[StoredEvent]) -> frozenset[tuple[str, int]]:
    """``(call id, seq of the call)`` for every abandoned call. Keyed by the call's seq as
    well because an id may be reused once its earlier call was answered."""
    waiting: dict[str, int] = {}
    abandoned: set[tuple[str, int]] = set()
    for event in events:
        if isinstance(event, RunCompletedEvent):
            for call_id in event.abandoned_tool_call_ids:
                if call_id in waiting:
                    abandoned.add((call_id, waiting[call_id]))
        _apply(event, waiting, frozenset())
    return frozenset(abandoned)


def _apply(
    event: StoredEvent, waiting: dict[str, int], ignored: frozenset[tuple[str, int]]
) -> None:
    """Update ``waiting`` (call id -> seq of its call) with one event."""
    if isinstance(event, RunCompletedEvent):
        for call_id in event.abandoned_tool_call_ids:
            waiting.pop(call_id, None)
    elif isinstance(event, MessageEvent):
        message = event.message
        if message.tool_call_id is not None:
            waiting.pop(message.tool_call_id, None)
        for call in message.tool_calls:
            if (call.id, event.seq) not in ignored:
                waiting[call.id] = event.seq


__all__ = [
    "DEFAULT_TRIGGER_CONTEXT_TOKENS",
    "EpisodicCompactionConfig",
    "EpisodicCompactionPressure",
    "EpisodicCompactionTrigger",
    "age_in_days",
    "episodic_compaction_trigger",
    "open_tool_calls",
    "resting_cut",
    "safe_cut",
    "safe_cut_at_or_before",
]
