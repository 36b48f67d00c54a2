"""Google ADK events, to and from :class:`~episodic.models.Message`.

An ADK ``Event`` is one thing an agent run produced: a user's message, a model turn (text,
thoughts, function calls), the responses of the functions it called, or only actions (a
state delta, a transfer, an end of agent). It comes here as its JSON
(``json.loads(event.model_dump_json())``, so bytes are base64 and nothing is lost) and
becomes the log's messages, the event kept whole in the first one's ``native`` payload
(protocol :data:`ADK_EVENT_PROTOCOL`), so :func:`adk_events_of` gives back exactly what came.

The messages are for what episodic does with a log: rendering for a summarizer, token
estimates, and tool pairing. A function call's ``id`` is the call's id and a function
response's ``id`` the result's ``tool_call_id``, so a response must answer a stored call and
no cut separates them. An event holding several function responses (ADK merges parallel
calls' responses into one) becomes one tool result per response, appended together. An event
with no content is an assistant message with none, which neither counts as a user turn nor
reads as an answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from episodic.errors import ValidationError
from episodic.models import Message, ToolCall

#: The ``native`` protocol of a message made from an ADK event.
ADK_EVENT_PROTOCOL = "google.adk.event"
#: The longest rendering of a part episodic has no model for (inline data runs to megabytes;
#: ``native`` keeps it whole).
RENDERED_PART_CHARS = 2_000


def messages_from_adk_event(
    event: Mapping[str, Any], *, pair_responses: bool = True
) -> list[Message]:
    """The log's messages for one ADK event's JSON (see the module docstring). Raises
    :class:`~episodic.errors.ValidationError` for what is not an event's JSON.

    ``pair_responses=False`` reads function responses as the event's content, not as tool
    results: for a long-running tool's later responses, whose call an earlier response (its
    interim answer) already closed."""
    if not isinstance(event, Mapping):
        raise ValidationError(
            "an ADK event must be its JSON (json.loads(event.model_dump_json())), "
            f"not {type(event).__name__}"
        )
    data = dict(event)
    content = data.get("content")
    parts = _parts(content)
    responses = [
        part["function_response"] for part in parts if part.get("function_response") is not None
    ]
    native = {"protocol": ADK_EVENT_PROTOCOL, "data": {"event": data}}
    try:
        if responses and pair_responses:
            messages = [_result(response) for response in responses]
        else:
            messages = [_turn(data, content, parts)]
        # Validate once, the event in native included: a value JSON cannot hold is named.
        first = Message.model_validate({**messages[0].model_dump(), "native": native})
        return [first, *messages[1:]]
    except ValidationError as exc:
        raise ValidationError(
            f"not a valid ADK event: {exc}", field=exc.field, details=exc.errors()
        ) from None


def adk_events_of(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The events' JSON, in order, from the messages :func:`messages_from_adk_event` made
    (the tool results after an event's first add nothing)."""
    events: list[dict[str, Any]] = []
    for message in messages:
        native = message.native
        if native is not None and native.protocol == ADK_EVENT_PROTOCOL:
            event = native.data.get("event")
            if isinstance(event, dict):
                events.append(event)
    return events


#: Part fields that qualify a part rather than say what it holds.
_PART_MODIFIERS = frozenset(
    {"thought", "thought_signature", "media_resolution", "video_metadata", "part_metadata"}
)
#: The camelCase names of the fields a part is read by: JSON dumped ``by_alias``.
_ALIASED = frozenset({"functionCall", "functionResponse", "inlineData", "fileData"})


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if not isinstance(content, Mapping):
        raise ValidationError("an event's content must be a Content object", field="content")
    parts = content.get("parts") or []
    if not isinstance(parts, list) or any(not isinstance(p, Mapping) for p in parts):
        raise ValidationError("an event's content parts must be a list of Parts", field="parts")
    if any(_ALIASED.intersection(part) for part in parts):
        raise ValidationError(
            "an event's JSON must use field names, not aliases: event.model_dump_json() "
            "without by_alias",
            field="parts",
        )
    return [dict(part) for part in parts]


def _turn(data: dict[str, Any], content: Any, parts: list[dict[str, Any]]) -> Message:
    """A user's or a model's turn: its text, its thoughts, its function calls."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts:
        text = part.get("text")
        if isinstance(text, str) and text:
            (thoughts if part.get("thought") else texts).append(text)
        elif part.get("function_call") is not None:
            calls.append(_call(part["function_call"]))
        elif not isinstance(text, str):
            texts.append(_rendered(part))
    role = content.get("role") if isinstance(content, Mapping) else None
    from_user = role == "user" or (role is None and data.get("author") == "user")
    body = "\n".join(texts)
    reasoning = "\n\n".join(thoughts) or None
    if from_user and parts and not calls:
        return Message(role="user", content=body, reasoning=reasoning)
    return Message(
        role="assistant", content=body or None, tool_calls=tuple(calls), reasoning=reasoning
    )


def _call(call: Any) -> ToolCall:
    if not isinstance(call, Mapping):
        raise ValidationError("a function_call part must be a FunctionCall", field="function_call")
    call_id, name = call.get("id"), call.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise ValidationError(
            "a function call needs its id, the id its function response answers "
            "(ADK gives every call one before the event is appended)",
            field="function_call.id",
        )
    if not isinstance(name, str) or not name:
        raise ValidationError("a function call needs the function's name", field="name")
    args = call.get("args") or {}
    if not isinstance(args, Mapping):
        raise ValidationError("a function call's args must be an object", field="args")
    return ToolCall(id=call_id, name=name, args=dict(args))


def _result(response: Any) -> Message:
    if not isinstance(response, Mapping):
        raise ValidationError(
            "a function_response part must be a FunctionResponse", field="function_response"
        )
    call_id, name = response.get("id"), response.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise ValidationError(
            "a function response needs the id of the function call it answers",
            field="function_response.id",
        )
    return Message.tool_result(
        call_id,
        _json(response.get("response") or {}),
        name=name if isinstance(name, str) else None,
    )


def _rendered(part: dict[str, Any]) -> str:
    """A part that is not text (inline or file data, code and its result) as text a
    summarizer can read: its kind, then the rest as compact JSON, cut short."""
    kind = next((k for k, v in part.items() if v is not None and k not in _PART_MODIFIERS), "part")
    value = part.get(kind)
    if isinstance(value, Mapping) and isinstance(value.get("data"), str):
        # inline bytes (base64): what they are, not what they hold
        encoded: str = value["data"]
        size = len(encoded) * 3 // 4 - (len(encoded) - len(encoded.rstrip("=")))
        value = {**value, "data": f"<{size:,} bytes>"}
    text = f"[{kind}] {_json(value)}"
    if len(text) > RENDERED_PART_CHARS:
        text = text[: RENDERED_PART_CHARS - 1] + "…"
    return text


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValidationError(f"an ADK event must hold JSON values only: {exc}") from None


__all__ = [
    "ADK_EVENT_PROTOCOL",
    "RENDERED_PART_CHARS",
    "adk_events_of",
    "messages_from_adk_event",
]
