"""Stored text made safe and short for a terminal: what ``episodic show``, ``status`` and
``list`` print.

The log holds whatever agents and tools produced, and a tool's output can carry terminal
escape sequences: an OSC sequence can retitle the window or write to the clipboard, a CSI
sequence can move the cursor and overwrite what the operator reads. Every stored string goes
through :func:`terminal_safe` before it is printed: control characters (C0, DEL, C1) and the
bidirectional overrides that reorder what is shown become visible escapes such as ``\\x1b``.
Pure: no I/O.
"""

from __future__ import annotations

import re

from episodic.formats.claude_code import claude_compaction, describe_compaction
from episodic.models import (
    BoundaryEvent,
    DeletionEvent,
    Message,
    MessageEvent,
    RetractionEvent,
    RunCompletedEvent,
    StateEvent,
    StoredEvent,
    UnpinEvent,
    UsageEvent,
)

ELLIPSIS = "…"
#: C0 controls but tab and newline, DEL and C1, and the Unicode format characters that
#: reorder or hide text (bidi embeddings, overrides and isolates; marks).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_WHITESPACE = re.compile("[\t\n]+")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, one_line: bool = True) -> str:
    """``text`` with nothing a terminal would act on: control characters and text-reordering
    marks shown as escapes; with ``one_line``, tabs and newlines become spaces."""
    safe = _UNSAFE.sub(_visible, text)
    return _WHITESPACE.sub(" ", safe) if one_line else safe


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with an ellipsis."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + ELLIPSIS


def shown(text: str | None, width: int | None = None) -> str:
    """Stored text as one safe line, cut to ``width`` (None: whole)."""
    safe = terminal_safe(text or "")
    return safe if width is None else clip(safe, width)


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one: "1 attempt", "2 attempts"."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def short_id(value: object, *, wide: bool) -> str:
    """A UUID as its first 8 characters (enough to tell conversations apart on a screen),
    or whole with ``wide``."""
    text = str(value)
    return text if wide else text[:8]


def event_kind(event: StoredEvent) -> str:
    """A message's role, or the event's kind (a framework's own compaction recorded as a
    message is a boundary)."""
    if isinstance(event, MessageEvent):
        return "boundary" if claude_compaction(event.message) else event.message.role
    return event.kind


def describe_event(event: StoredEvent) -> str:
    """One line about an event (not yet made terminal-safe)."""
    if isinstance(event, MessageEvent):
        compaction = claude_compaction(event.message)
        if compaction is not None:
            return describe_compaction(compaction)
        return describe_message(event.message)
    if isinstance(event, RunCompletedEvent):
        abandoned = ", ".join(event.abandoned_tool_call_ids) or "none"
        return f"run completed; abandoned calls: {abandoned}"
    if isinstance(event, BoundaryEvent):
        items = event.handoff_items
        label = (
            event.reason
            if items is None
            else f"{event.reason}, {counted(len(items), 'handoff item')}"
        )
        return f"boundary through seq {event.covers_through_seq} ({label}): {event.summary}"
    if isinstance(event, RetractionEvent):
        return f"retracted seq {event.retracted_seq}"
    if isinstance(event, UsageEvent):
        return f"usage reported: {counted(event.usage.input_tokens, 'input token')}"
    if isinstance(event, StateEvent):
        keys = [*event.change.conversation]
        keys += [f"{scope}/{key}" for scope, delta in event.change.shared.items() for key in delta]
        return f"state set: {', '.join(keys)}"
    if isinstance(event, DeletionEvent):
        return "deleted: hidden and closed to writes; the log is kept"
    if isinstance(event, UnpinEvent):
        return f"unpinned seq {event.unpinned_seq}: later handoffs stop carrying it"
    return "cleared: the context starts after this event"


def describe_message(message: Message) -> str:
    """One line about a message: its text, its calls, or its result's status."""
    parts = [message.text] if message.text else []
    if message.tool_calls:
        calls = ", ".join(f"{c.name}#{c.id}({c.arguments_text()})" for c in message.tool_calls)
        parts.append(f"calls {calls}")
    if message.role == "tool":
        status = "error" if message.is_error else "ok"
        parts.insert(0, f"result #{message.tool_call_id} {message.name or ''} {status}:")
    if message.pinned:
        parts.insert(0, "[pinned]")
    return " ".join(parts)


__all__ = [
    "ELLIPSIS",
    "clip",
    "counted",
    "describe_event",
    "describe_message",
    "event_kind",
    "short_id",
    "shown",
    "terminal_safe",
]
