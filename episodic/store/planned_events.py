"""The events planned from the head rather than appended by a function of the database: a
retraction and a clear, which change what is in view without rewriting the log
(episodic/view.py says what is in view), a usage report that comes after its messages, and
a deletion.
Each is planned here from the head and the events after its cut, and the backend writes it
only if the head has not moved since, so two concurrent retractions take back two messages,
never one twice."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from episodic.models import (
    ClearEvent,
    DeletionEvent,
    RetractionEvent,
    StoredEvent,
    Usage,
    UsageEvent,
)
from episodic.store.backend import PlannedEvent
from episodic.store.codec import encode_json
from episodic.store.projection import HeadState
from episodic.view import in_view, retraction_target


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


def plan_deletion(conversation_id: UUID, head: HeadState, now: datetime) -> PlannedEvent:
    """Delete the conversation: a tombstone after its last event (the head hides it)."""
    seq = head.counters.last_seq + 1
    event = DeletionEvent(
        conversation_id=conversation_id, seq=seq, created_at=now, token_estimate=0
    )
    return PlannedEvent(event=event, payload="{}", counters=head.counters.after_event(seq=seq))


__all__ = ["plan_clear", "plan_deletion", "plan_retraction", "plan_usage"]
