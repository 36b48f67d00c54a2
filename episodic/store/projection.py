"""The head row as a fold over the log.

The head's counters are a projection: :func:`rebuild_head` recomputes them from the events
alone, and the tests prove the stored head equals it. The SQLite backend applies these same
functions on append; the PostgreSQL function ``episodic_append`` mirrors them in SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from uuid import UUID

from episodic.context import missing_result
from episodic.models import (
    BoundaryEvent,
    ClearEvent,
    Conversation,
    DeletionEvent,
    Message,
    MessageEvent,
    RetractionEvent,
    RunCompletedEvent,
    StateEvent,
    StoredEvent,
    UnpinEvent,
    Usage,
    UsageEvent,
)
from episodic.rendering import context_token_estimate
from episodic.tokens import TokenEstimator
from episodic.view import in_view

#: Abandoned calls are costed with an id and name of this length; the real ones differ by a
#: few characters, which is within what an estimate is for.
_TYPICAL_ID = "call_" + "0" * 24


def abandoned_result_tokens(estimator: TokenEstimator) -> int:
    """The token estimate charged per abandoned call when a run completes: the synthetic
    result that loading pairs it with."""
    return context_token_estimate(missing_result(_TYPICAL_ID, "tool"), estimator)


@dataclass(frozen=True, slots=True)
class HeadCounters:
    """The counters of ``episodic_conversations`` that the log determines."""

    last_seq: int = 0
    boundary_seq: int | None = None
    covers_through_seq: int = 0
    total_user_messages: int = 0
    user_messages_since_boundary: int = 0
    run_completed_since_boundary: int = 0
    user_messages_since_run_completed: int = 0
    context_tokens: int = 0
    usage_input_tokens: int | None = None
    tokens_since_usage: int = 0
    open_tool_calls: Mapping[str, int] = field(default_factory=dict)

    def after_message(
        self, message: Message, *, seq: int, token_estimate: int, usage: Usage | None
    ) -> HeadCounters:
        """The counters once ``message`` is stored at ``seq``. ``usage`` is the one passed
        with its batch, given on the batch's first message only. ``token_estimate`` is the
        stored one: 0 for a system message, which is kept but never loaded (see
        ``prepare_batch``), so no role needs special handling here or in SQL."""
        open_calls = dict(self.open_tool_calls)
        for call in message.tool_calls:
            open_calls[call.id] = seq
        if message.role == "tool" and message.tool_call_id is not None:
            open_calls.pop(message.tool_call_id, None)
        users = 1 if message.role == "user" else 0
        usage_input, since_usage = self.usage_input_tokens, self.tokens_since_usage
        if usage is not None:
            usage_input, since_usage = usage.input_tokens, 0
        return replace(
            self,
            last_seq=seq,
            total_user_messages=self.total_user_messages + users,
            user_messages_since_boundary=self.user_messages_since_boundary + users,
            user_messages_since_run_completed=self.user_messages_since_run_completed + users,
            context_tokens=self.context_tokens + token_estimate,
            usage_input_tokens=usage_input,
            tokens_since_usage=since_usage + token_estimate,
            open_tool_calls=open_calls,
        )

    def abandoned_ids(self) -> list[str]:
        """Open calls in the order a run completion records them: by seq, then by id."""
        return [k for k, _ in sorted(self.open_tool_calls.items(), key=lambda kv: (kv[1], kv[0]))]

    def after_run_completed(self, *, seq: int, token_estimate: int) -> HeadCounters:
        return replace(
            self,
            last_seq=seq,
            run_completed_since_boundary=self.run_completed_since_boundary + 1,
            user_messages_since_run_completed=0,
            context_tokens=self.context_tokens + token_estimate,
            tokens_since_usage=self.tokens_since_usage + token_estimate,
            open_tool_calls={},
        )

    def after_retraction(
        self, target: MessageEvent, tail: Sequence[StoredEvent], *, seq: int
    ) -> HeadCounters:
        """The counters once the event at ``seq`` retracts ``target``, the newest message in
        view (:func:`episodic.view.retraction_target`); ``tail`` is every event after the cut,
        up to ``seq``. The target's part in each counter is taken back: its tokens, its user
        message (in the counts since the boundary, and since the latest run completion unless
        one came after it), its calls (no longer waiting) or, for a tool result, its call
        (waiting again, unless a run completion came after the result). The provider-reported
        usage stays: it described the context when it was reported."""
        message = target.message
        later_run = any(
            isinstance(event, RunCompletedEvent) and event.seq > target.seq for event in tail
        )
        users = 1 if message.role == "user" else 0
        open_calls = dict(self.open_tool_calls)
        for call in message.tool_calls:
            if open_calls.get(call.id) == target.seq:
                del open_calls[call.id]
        if message.tool_call_id is not None and not later_run:
            call_seq = _seq_of_call(tail, message.tool_call_id, before=target.seq)
            if call_seq is not None:
                open_calls[message.tool_call_id] = call_seq
        since_usage = self.tokens_since_usage
        if target.seq >= _usage_counted_from(tail, self.covers_through_seq):
            since_usage -= target.token_estimate
        return replace(
            self,
            last_seq=seq,
            total_user_messages=self.total_user_messages - users,
            user_messages_since_boundary=self.user_messages_since_boundary - users,
            user_messages_since_run_completed=(
                self.user_messages_since_run_completed - (0 if later_run else users)
            ),
            context_tokens=self.context_tokens - target.token_estimate,
            tokens_since_usage=since_usage,
            open_tool_calls=open_calls,
        )

    def after_usage(self, usage: Usage, *, seq: int) -> HeadCounters:
        """The counters once a usage report is stored at ``seq``: the pressure signal starts
        again from its input tokens, as after a batch appended with that usage."""
        return replace(
            self, last_seq=seq, usage_input_tokens=usage.input_tokens, tokens_since_usage=0
        )

    def after_event(self, *, seq: int) -> HeadCounters:
        """The counters once an event that changes nothing in view is stored at ``seq`` (a
        state change, a deletion)."""
        return replace(self, last_seq=seq)

    def after_clear(self, *, seq: int) -> HeadCounters:
        """The counters once a clear is stored at ``seq``: the view starts after it, so the
        cut moves there and the context's counters start again from nothing (calls still
        waiting are gone with the view: a late result for one is an orphan). The latest
        boundary stays the latest boundary; the total of user messages counts the whole
        conversation."""
        return replace(
            self,
            last_seq=seq,
            covers_through_seq=seq,
            user_messages_since_boundary=0,
            run_completed_since_boundary=0,
            user_messages_since_run_completed=0,
            context_tokens=0,
            usage_input_tokens=None,
            tokens_since_usage=0,
            open_tool_calls={},
        )

    def after_boundary(self, boundary: BoundaryEvent, tail: Sequence[StoredEvent]) -> HeadCounters:
        """The counters once ``boundary`` is stored; ``tail`` is every event after its cut
        and before it (what is in view of it counts). Pressure restarts from the boundary:
        the provider-reported usage described the context before it, so it no longer
        applies."""
        users = 0
        since_run = 0
        runs = 0
        tokens = boundary.token_estimate
        for event in in_view(tail):
            if isinstance(event, BoundaryEvent):
                continue  # superseded: the new handoff already covers it
            tokens += event.token_estimate
            if isinstance(event, RunCompletedEvent):
                runs += 1
                since_run = 0
            elif isinstance(event, MessageEvent) and event.message.role == "user":
                users += 1
                since_run += 1
        return replace(
            self,
            last_seq=boundary.seq,
            boundary_seq=boundary.seq,
            covers_through_seq=boundary.covers_through_seq,
            user_messages_since_boundary=users,
            run_completed_since_boundary=runs,
            user_messages_since_run_completed=since_run,
            context_tokens=tokens,
            usage_input_tokens=None,
            tokens_since_usage=0,
        )


@dataclass(frozen=True, slots=True)
class HeadState:
    """The locked head: its counters plus what fencing a boundary needs."""

    tenant_id: str
    counters: HeadCounters
    lease_token: UUID | None
    lease_expires_at: datetime | None
    created_at: datetime
    boundary_at: datetime | None


#: The head columns (and Conversation fields) that the log determines.
COUNTER_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(HeadCounters))


def counters_of(head: Conversation) -> HeadCounters:
    """The log-derived counters of a stored head."""
    return HeadCounters(**{name: getattr(head, name) for name in COUNTER_FIELDS})


class HeadFold:
    """The log folded into head counters one event at a time, oldest first, holding only the
    events after the current cut (what a boundary or a retraction looks at; the cut never
    moves back), so folding a long log that was compacted costs memory for its tail only."""

    def __init__(self) -> None:
        self.head = HeadCounters()
        self._tail: list[StoredEvent] = []

    def add(self, event: StoredEvent) -> HeadCounters:
        head = self.head
        if isinstance(event, BoundaryEvent):
            tail = [e for e in self._tail if e.seq > event.covers_through_seq]
            head = head.after_boundary(event, tail)
        elif isinstance(event, MessageEvent):
            head = head.after_message(
                event.message,
                seq=event.seq,
                token_estimate=event.token_estimate,
                usage=event.usage,
            )
        elif isinstance(event, RunCompletedEvent):
            head = head.after_run_completed(seq=event.seq, token_estimate=event.token_estimate)
        elif isinstance(event, RetractionEvent):
            (target,) = (e for e in self._tail if e.seq == event.retracted_seq)
            assert isinstance(target, MessageEvent)
            head = head.after_retraction(target, self._tail, seq=event.seq)
        elif isinstance(event, ClearEvent):
            head = head.after_clear(seq=event.seq)
        elif isinstance(event, UsageEvent):
            head = head.after_usage(event.usage, seq=event.seq)
        elif isinstance(event, StateEvent | DeletionEvent | UnpinEvent):
            head = head.after_event(seq=event.seq)
        if head.covers_through_seq != self.head.covers_through_seq:
            self._tail = [e for e in self._tail if e.seq > head.covers_through_seq]
        self._tail.append(event)
        self.head = head
        return head


def rebuild_head(events: Iterable[StoredEvent]) -> HeadCounters:
    """Fold the log, oldest first, into head counters."""
    fold = HeadFold()
    for event in events:
        fold.add(event)
    return fold.head


def _seq_of_call(tail: Sequence[StoredEvent], call_id: str, *, before: int) -> int | None:
    """The seq of the message in view, before ``before``, that made call ``call_id``."""
    for event in reversed(in_view(tail)):
        if (
            isinstance(event, MessageEvent)
            and event.seq < before
            and any(call.id == call_id for call in event.message.tool_calls)
        ):
            return event.seq
    return None


def _usage_counted_from(tail: Sequence[StoredEvent], covers_through_seq: int) -> int:
    """The first seq whose tokens ``tokens_since_usage`` counts: the latest of the cut, the
    event after the latest boundary or usage report, and the latest message that carried a
    usage report (retracted or not: its report stands)."""
    start = covers_through_seq + 1
    for event in tail:
        if isinstance(event, BoundaryEvent | UsageEvent):
            start = max(start, event.seq + 1)
        elif isinstance(event, MessageEvent) and event.usage is not None:
            start = max(start, event.seq)
    return start


__all__ = [
    "HeadCounters",
    "HeadFold",
    "HeadState",
    "abandoned_result_tokens",
    "counters_of",
    "rebuild_head",
]
