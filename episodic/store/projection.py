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
    Conversation,
    Message,
    MessageEvent,
    RunCompletedEvent,
    StoredEvent,
    Usage,
)
from episodic.rendering import context_token_estimate
from episodic.tokens import TokenEstimator

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

    def after_boundary(self, boundary: BoundaryEvent, tail: Sequence[StoredEvent]) -> HeadCounters:
        """The counters once ``boundary`` is stored; ``tail`` is every event after its cut
        and before it. Pressure restarts from the boundary: the provider-reported usage
        described the context before it, so it no longer applies."""
        users = 0
        since_run = 0
        runs = 0
        tokens = boundary.token_estimate
        for event in tail:
            if isinstance(event, BoundaryEvent):
                continue  # superseded: the new handoff already covers it
            tokens += event.token_estimate
            if isinstance(event, RunCompletedEvent):
                runs += 1
                since_run = 0
            elif event.message.role == "user":
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


def rebuild_head(events: Iterable[StoredEvent]) -> HeadCounters:
    """Fold the log, oldest first, into head counters."""
    head = HeadCounters()
    seen: list[StoredEvent] = []
    for event in events:
        if isinstance(event, BoundaryEvent):
            tail = [e for e in seen if e.seq > event.covers_through_seq]
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
        seen.append(event)
    return head


__all__ = [
    "HeadCounters",
    "HeadState",
    "abandoned_result_tokens",
    "counters_of",
    "rebuild_head",
]
