"""The events planned from the head rather than appended by a function of the database: a
retraction and a clear, which change what is in view without rewriting the log
(episodic/view.py says what is in view), a usage report that comes after its messages, an
unpin, and a deletion.
Each is planned here from the head and the events after its cut, and the backend writes it
only if the head has not moved since, so two concurrent retractions take back two messages,
never one twice. What the write sets besides the counters is :func:`write_event_columns`,
the twin of ``episodic_write_event``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from episodic.models import (
    ClearEvent,
    DeletionEvent,
    MessageEvent,
    RetractionEvent,
    StoredEvent,
    UnpinEvent,
    Usage,
    UsageEvent,
)
from episodic.policy import EpisodicCompactionConfig
from episodic.store.codec import encode_json
from episodic.store.due import DueState, due_marking
from episodic.store.projection import HeadCounters, HeadState
from episodic.view import in_view, retraction_target


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    """A retraction, a clear, a usage report, an unpin or a deletion, planned here from the
    head and the tail, and written only if the head is still the one it was planned on."""

    event: RetractionEvent | ClearEvent | UsageEvent | UnpinEvent | DeletionEvent
    payload: str
    #: the head's counters once it is stored
    counters: HeadCounters
    #: the message a retraction takes back
    retracted: MessageEvent | None = None
    #: when the current context began, for a clear (the age rule measures from it)
    context_since: datetime | None = None


def plan_retraction(
    conversation_id: UUID, head: HeadState, tail: list[StoredEvent], now: datetime
) -> PlannedEvent | None:
    """Take back the newest message in view after the cut; None when there is none (the
    handoff and the retained messages of a boundary are not the log's to take back)."""
    target = retraction_target(tail)
    if target is None:
        return None
    seq = head.counters.last_seq + 1
    event = RetractionEvent(
        conversation_id=conversation_id,
        seq=seq,
        created_at=now,
        token_estimate=0,
        retracted_seq=target.seq,
    )
    return PlannedEvent(
        event=event,
        payload=encode_json({"retracted_seq": target.seq}, what="retraction"),
        counters=head.counters.after_retraction(target, tail, seq=seq),
        retracted=target,
    )


def plan_clear(
    conversation_id: UUID, head: HeadState, tail: list[StoredEvent], now: datetime
) -> PlannedEvent | None:
    """Empty the view; None when there is nothing after the cut to clear (clearing twice
    writes once)."""
    if not in_view(tail):
        return None
    seq = head.counters.last_seq + 1
    event = ClearEvent(conversation_id=conversation_id, seq=seq, created_at=now, token_estimate=0)
    return PlannedEvent(
        event=event,
        payload="{}",
        counters=head.counters.after_clear(seq=seq),
        context_since=now,
    )


def plan_usage(conversation_id: UUID, usage: Usage, head: HeadState, now: datetime) -> PlannedEvent:
    """Record ``usage``, reported after the messages it is about."""
    seq = head.counters.last_seq + 1
    event = UsageEvent(
        conversation_id=conversation_id, seq=seq, created_at=now, token_estimate=0, usage=usage
    )
    return PlannedEvent(
        event=event,
        payload=encode_json(usage.model_dump(), what="usage"),
        counters=head.counters.after_usage(usage, seq=seq),
    )


def plan_unpin(
    conversation_id: UUID, unpinned_seq: int, head: HeadState, now: datetime
) -> PlannedEvent:
    """Unpin the pinned message at ``unpinned_seq`` (the store checked it is one): the context
    is as it was; the worker's next handoffs stop carrying it."""
    seq = head.counters.last_seq + 1
    event = UnpinEvent(
        conversation_id=conversation_id,
        seq=seq,
        created_at=now,
        token_estimate=0,
        unpinned_seq=unpinned_seq,
    )
    return PlannedEvent(
        event=event,
        payload=encode_json({"unpinned_seq": unpinned_seq}, what="unpin"),
        counters=head.counters.after_event(seq=seq),
    )


def plan_deletion(conversation_id: UUID, head: HeadState, now: datetime) -> PlannedEvent:
    """Delete the conversation: a tombstone after its last event (the head hides it)."""
    seq = head.counters.last_seq + 1
    event = DeletionEvent(
        conversation_id=conversation_id, seq=seq, created_at=now, token_estimate=0
    )
    return PlannedEvent(event=event, payload="{}", counters=head.counters.after_event(seq=seq))


def write_event_columns(
    planned: PlannedEvent, head: DueState, trigger: EpisodicCompactionConfig, now: datetime
) -> dict[str, Any]:
    """The head columns writing ``planned`` sets besides its counters, from the head it was
    planned on (its due state, creation, context start and metadata): a clear's new context
    start (``boundary_at``); for a deletion, the conversation hidden and taken off the
    worker's queue (its due state cleared, nothing marked); for any other event, the
    conversation marked due when ``trigger`` fires on the new head (:func:`due_marking`, the
    age measured from the context's start as it is after the event).

    Twin of ``episodic_write_event``'s ``SET`` (``boundary_at``, ``deleted_at``,
    ``due_since``, ``due_reason``) and of its call of ``episodic_mark_due``."""
    columns: dict[str, Any] = {}
    if planned.context_since is not None:
        columns["boundary_at"] = planned.context_since
    if planned.event.kind == "deletion":
        columns.update(deleted_at=planned.event.created_at, due_since=None, due_reason=None)
        return columns
    after = replace(head, boundary_at=planned.context_since or head.boundary_at)
    marking = due_marking(planned.counters, after, trigger, now)
    return {**columns, **marking}


__all__ = [
    "PlannedEvent",
    "plan_clear",
    "plan_deletion",
    "plan_retraction",
    "plan_unpin",
    "plan_usage",
    "write_event_columns",
]
