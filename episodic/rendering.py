"""Messages as plain text: what a summarizer reads, and what token estimates are taken over.

One block per message::

    [user]
    Fix the failing test
    [assistant]
    Running the tests.
    tool calls: run({"cmd":"pytest"})
    [tool result c1 run error]
    1 failed

Images become their alt text (or ``[image]``). Readable private reasoning is excerpted under
its own header, cut by characters; opaque payloads in ``native`` are never rendered. A
summarizer may be shown only the head of each tool result (``tool_result_char_cap``): the
tool record (:mod:`episodic.worklog`) carries what a result identifies, from all of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from episodic.models import Message
from episodic.tokens import TokenEstimator

DEFAULT_REASONING_CHAR_CAP = 2_000
DEFAULT_TOOL_RESULT_CHAR_CAP = 2_000
REASONING_HEADER = "[private reasoning excerpt]"
REASONING_CUT_MARKER = "\n[... reasoning cut ...]\n"
#: ends a tool result cut for a summarizer; {more} is the characters left out
TOOL_RESULT_CUT_MARKER = " [... {more} more characters: the tool record keeps their ids and errors]"


def excerpt_reasoning(text: str, cap: int = DEFAULT_REASONING_CHAR_CAP) -> str:
    """``text`` cut to at most ``cap`` characters: about a third from the head and two thirds
    from the tail around a marker, because conclusions tend to come last."""
    if len(text) <= cap:
        return text
    room = cap - len(REASONING_CUT_MARKER)
    if room <= 0:
        return text[len(text) - cap :] if cap > 0 else ""
    head = room // 3
    tail = room - head
    return text[:head] + REASONING_CUT_MARKER + text[len(text) - tail :]


def render_message(
    message: Message,
    *,
    include_reasoning: bool = True,
    reasoning_char_cap: int = DEFAULT_REASONING_CHAR_CAP,
    tool_result_char_cap: int | None = None,
) -> str:
    """One message as a text block (see the module docstring); a tool result longer than
    ``tool_result_char_cap`` characters is cut to its head."""
    role = message.role
    body = message.text
    if role == "tool":
        if tool_result_char_cap is not None and len(body) > tool_result_char_cap:
            more = len(body) - tool_result_char_cap
            body = body[:tool_result_char_cap] + TOOL_RESULT_CUT_MARKER.format(more=more)
        status = "error" if message.is_error else "ok"
        out = f"[tool result {message.tool_call_id} {message.name or 'unknown'} {status}]\n{body}"
    elif role == "assistant":
        lines = [body] if body else []
        if message.tool_calls:
            calls = ", ".join(f"{c.name}({c.arguments_text()})" for c in message.tool_calls)
            lines.append(f"tool calls: {calls}")
        out = "[assistant]\n" + ("\n".join(lines) if lines else "(empty)")
    else:
        out = f"[{role}]\n{body}"
    if include_reasoning and message.reasoning:
        out += f"\n{REASONING_HEADER}\n{excerpt_reasoning(message.reasoning, reasoning_char_cap)}"
    return out


def render_transcript(
    messages: Iterable[Message], *, reasoning_char_cap: int = DEFAULT_REASONING_CHAR_CAP
) -> str:
    """Messages rendered and joined by blank lines."""
    return "\n\n".join(render_message(m, reasoning_char_cap=reasoning_char_cap) for m in messages)


def context_token_estimate(message: Message, estimator: TokenEstimator) -> int:
    """What a message costs in a model's context: its rendering without private reasoning
    (which is not sent back to providers). Stored once per event at append."""
    return estimator.count(render_message(message, include_reasoning=False))


__all__ = [
    "DEFAULT_REASONING_CHAR_CAP",
    "DEFAULT_TOOL_RESULT_CHAR_CAP",
    "REASONING_CUT_MARKER",
    "REASONING_HEADER",
    "TOOL_RESULT_CUT_MARKER",
    "context_token_estimate",
    "excerpt_reasoning",
    "render_message",
    "render_transcript",
]
