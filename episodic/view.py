"""Which events of a log are in view.

The log is never rewritten, so taking something back is an event too: a retraction takes its
message out of view, a clear everything before it. Everything that reads a tail as the
conversation (the context, the safe cut, a boundary's transcript and counters, the head's
fold) reads it through :func:`in_view`; ``read_events`` and ``episodic show`` keep every event.
"""

from __future__ import annotations

from collections.abc import Iterable

from episodic.models import ClearEvent, MessageEvent, RetractionEvent, StoredEvent


def in_view(events: Iterable[StoredEvent]) -> list[StoredEvent]:
    """``events`` (oldest first) less the retractions, the messages they retracted, and
    everything up to the latest clear."""
    listed = list(events)
    start = 0
    retracted: set[int] = set()
    for index, event in enumerate(listed):
        if isinstance(event, ClearEvent):
            start = index + 1
        elif isinstance(event, RetractionEvent):
            retracted.add(event.retracted_seq)
    return [
        event
        for event in listed[start:]
        if not isinstance(event, RetractionEvent) and event.seq not in retracted
    ]


def retraction_target(tail: Iterable[StoredEvent]) -> MessageEvent | None:
    """The message a retraction would take back: the newest one in view after the cut,
    whatever its role (a system message is kept in the log though never loaded, and a
    framework that stored it may take it back)."""
    for event in reversed(in_view(tail)):
        if isinstance(event, MessageEvent):
            return event
    return None


__all__ = ["in_view", "retraction_target"]
