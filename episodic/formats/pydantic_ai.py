"""Pydantic AI's messages, to and from :class:`~episodic.models.Message`.

A Pydantic AI history is a list of ``ModelRequest``s (what the app sent: system prompts, the
user's prompt, tool returns, retry feedback) and ``ModelResponse``s (what the model said:
text, thinking, tool calls, built-in tool calls and their returns, files). Each comes here as
its JSON (``ModelMessagesTypeAdapter.dump_python(messages, mode="json")``: bytes as base64,
nothing lost) and becomes the log's messages:

- a response is one assistant message: its text parts are the content (built-in tool calls,
  files and the other parts follow as text a summarizer can read), its thinking the
  ``reasoning``, its tool calls the message's calls;
- a request is one tool result per tool return (a legacy ``retry-prompt`` that names a tool
  is one too, an error), then one user message with the text of its user prompts and retry
  feedback. Its system prompts and the parts no model reads as text (instruction and
  capability deltas) ride along in ``native``: a system prompt is never a user turn and never
  summarized. A request with neither returns nor text is a user message of no text.

A tool call's ``tool_call_id`` is the call's id and a tool return's ``tool_call_id`` the
result's, so a return must answer a stored call and no cut separates them. Each message keeps
the JSON of the parts it stands for in ``native`` (protocol :data:`PYDANTIC_AI_PROTOCOL`),
the first one also the Pydantic AI message's own fields (``instructions``, ``usage``,
``run_id``, timestamps...), and all of them a digest of the whole message, which finds them
together again: :func:`pydantic_ai_messages_of` gives back exactly what came, part for part.
The digest is also each message's ``client_id``, so a Pydantic AI message appended twice is
stored once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from episodic.errors import ValidationError
from episodic.formats.openai_chat import parse_arguments
from episodic.models import Message, ToolCall

#: The ``native`` protocol of a message made from a Pydantic AI message.
PYDANTIC_AI_PROTOCOL = "pydantic_ai.message"
#: The prefix of the client ids of those messages.
CLIENT_ID_PREFIX = "pydantic-ai:"
#: The longest rendering of a part episodic has no model for (a generated file runs to
#: megabytes; ``native`` keeps it whole).
RENDERED_PART_CHARS = 2_000

#: A response part that is a call the app answers in its next request.
_CALL = "tool-call"
#: A request part that answers a call.
_RETURN = "tool-return"
#: The deprecated retry part: a tool's retry when it names the tool, feedback otherwise.
_LEGACY_RETRY = "retry-prompt"


def messages_from_pydantic_ai(message: Mapping[str, Any]) -> list[Message]:
    """The log's messages for one Pydantic AI message's JSON (see the module docstring).
    Raises :class:`~episodic.errors.ValidationError` for what is not such JSON."""
    if not isinstance(message, Mapping):
        raise ValidationError(
            "a Pydantic AI message must be its JSON "
            "(ModelMessagesTypeAdapter.dump_python(messages, mode='json')), "
            f"not {type(message).__name__}"
        )
    data = dict(message)
    kind, parts = data.get("kind"), data.get("parts")
    if kind not in ("request", "response"):
        raise ValidationError(
            f"a Pydantic AI message's kind is 'request' or 'response', not {kind!r:.80}",
            field="kind",
        )
    if not isinstance(parts, list) or any(
        not isinstance(part, Mapping) or not isinstance(part.get("part_kind"), str)
        for part in parts
    ):
        raise ValidationError(
            "a Pydantic AI message's parts must be a list of parts, each with its part_kind",
            field="parts",
        )
    group = message_digest(data)
    envelope = {key: value for key, value in data.items() if key != "parts"}
    try:
        split = (
            [(_assistant(parts), list(range(len(parts))))]
            if kind == "response"
            else _request(parts)
        )
        # Validated once each, the parts in native included: a value JSON cannot hold is named.
        return [
            Message.model_validate(
                {
                    **fields,
                    "client_id": f"{CLIENT_ID_PREFIX}{group}:{index}",
                    "native": {
                        "protocol": PYDANTIC_AI_PROTOCOL,
                        "data": {
                            "kind": kind,
                            "group": group,
                            "parts": [[at, parts[at]] for at in ats],
                            **({"message": envelope} if index == 0 else {}),
                        },
                    },
                }
            )
            for index, (fields, ats) in enumerate(split)
        ]
    except ValidationError as exc:
        raise ValidationError(
            f"not a valid Pydantic AI message: {exc}", field=exc.field, details=exc.errors()
        ) from None


def pydantic_ai_messages_of(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The JSON of a Pydantic AI history from the log's messages, ready for
    ``ModelMessagesTypeAdapter.validate_python``: each message :func:`messages_from_pydantic_ai`
    made gives back its Pydantic AI message (the parts found next to each other, in their
    order), and any other message is converted from its fields: a user message is a request
    with that user prompt, an assistant message a response with its text and calls, a tool
    result a tool return (joining the request before it). A system message is left out.

    What a model would refuse is left out too: the responses before the first request, and a
    tool return whose call is not earlier in the history."""
    out: list[dict[str, Any]] = []
    group: _Group | None = None
    for message in messages:
        native = _native(message)
        if native is not None:
            if group is None or group.key != native["group"]:
                if group is not None:
                    out.append(group.message())
                group = _Group(native["group"], native["kind"])
            group.add(native)
            continue
        if group is not None:
            out.append(group.message())
            group = None
        _convert(message, out)
    if group is not None:
        out.append(group.message())
    return _answerable(out)


def system_prompt_parts(message: Message) -> list[dict[str, Any]]:
    """The system prompt parts among those a message stands for (none for a message this
    module did not make)."""
    native = _native(message)
    if native is None:
        return []
    return [part for _, part in native["parts"] if part.get("part_kind") == "system-prompt"]


# ---- to the log ---------------------------------------------------------------------------


def _assistant(parts: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A response: its text, its thinking, its calls; other parts as text after the text."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts:
        kind = part["part_kind"]
        if kind == "text" and isinstance(part.get("content"), str):
            texts.append(part["content"])
        elif kind == "thinking" and isinstance(part.get("content"), str):
            thoughts.append(part["content"])
        elif kind == _CALL:
            calls.append(_call(part))
        else:
            texts.append(_rendered(part))
    return {
        "role": "assistant",
        "content": "\n".join(text for text in texts if text) or None,
        "tool_calls": calls,
        "reasoning": "\n\n".join(thought for thought in thoughts if thought) or None,
    }


def _request(parts: list[Mapping[str, Any]]) -> list[tuple[dict[str, Any], list[int]]]:
    """A request's messages and the parts each stands for: a tool result per return, then a
    user message with the rest (on the first result when none of the rest is text)."""
    split: list[tuple[dict[str, Any], list[int]]] = []
    rest: list[int] = []
    for at, part in enumerate(parts):
        if _answers_a_call(part):
            split.append((_result(part), [at]))
        else:
            rest.append(at)
    texts = [text for at in rest if (text := _request_text(parts[at])) is not None]
    if texts or not split:
        split.append(({"role": "user", "content": "\n".join(texts)}, rest))
    elif rest:
        first, ats = split[0]
        split[0] = (first, sorted([*ats, *rest]))
    return split


def _answers_a_call(part: Mapping[str, Any]) -> bool:
    kind = part["part_kind"]
    return kind == _RETURN or (kind == _LEGACY_RETRY and part.get("tool_name") is not None)


def _call(part: Mapping[str, Any]) -> ToolCall:
    call_id, name, arguments = part.get("tool_call_id"), part.get("tool_name"), part.get("args")
    if not isinstance(call_id, str) or not call_id:
        raise ValidationError(
            "a tool call needs its tool_call_id, the id its tool return answers",
            field="tool_call_id",
        )
    if not isinstance(name, str) or not name:
        raise ValidationError("a tool call needs the tool's name", field="tool_name")
    if arguments is not None and not isinstance(arguments, str | dict):
        raise ValidationError("a tool call's args are a JSON string or an object", field="args")
    args, exact = parse_arguments(arguments or {})
    return ToolCall(id=call_id, name=name, args=args, arguments_json=exact)


def _result(part: Mapping[str, Any]) -> dict[str, Any]:
    call_id, name = part.get("tool_call_id"), part.get("tool_name")
    if not isinstance(call_id, str) or not call_id:
        raise ValidationError(
            "a tool return needs the tool_call_id of the call it answers", field="tool_call_id"
        )
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "name": name if isinstance(name, str) else None,
        "content": _text(part.get("content")),
        # A failed, denied, interrupted or retried call: the model is told it did not work.
        "is_error": part["part_kind"] == _LEGACY_RETRY
        or part.get("outcome", "success") != "success",
    }


def _request_text(part: Mapping[str, Any]) -> str | None:
    """What a model reads of a request part as text: a user prompt, retry feedback, a
    summary; None for a part that says nothing (a system prompt, an instruction delta)."""
    kind = part["part_kind"]
    if kind in ("user-prompt", "retry-feedback", _LEGACY_RETRY):
        return _text(part.get("content"))
    if kind == "compaction" and isinstance(part.get("content"), str):
        return str(part["content"])
    if kind == "speech" and isinstance(part.get("transcript"), str):
        return str(part["transcript"])
    return None


def _text(content: Any) -> str:
    """Content as text: a string as it is, a list of user content item by item (files by
    their URL or size), anything else as compact JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_item_text(item) for item in content)
    return _json(_without_bytes(content))


def _item_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        kind = item.get("kind", "content")
        if isinstance(item.get("url"), str):
            return f"[{kind}] {item['url']}"
        if kind == "binary":
            return f"[{item.get('media_type', 'binary')}] {_without_bytes(item)['data']}"
        if isinstance(item.get("content"), str):
            return str(item["content"])
    return _json(_without_bytes(item))


def _rendered(part: Mapping[str, Any]) -> str:
    """A part that is not text as text a summarizer can read: its kind, then the rest as
    compact JSON without nulls or bytes, cut short."""
    rest = {k: v for k, v in part.items() if k != "part_kind" and v is not None}
    text = f"[{part['part_kind']}] {_json(_without_bytes(rest))}"
    if len(text) > RENDERED_PART_CHARS:
        text = text[: RENDERED_PART_CHARS - 1] + "…"
    return text


def _without_bytes(value: Any) -> Any:
    """``value`` with each binary item's base64 data replaced by its size: what they are, not
    what they hold."""
    if isinstance(value, list):
        return [_without_bytes(item) for item in value]
    if not isinstance(value, Mapping):
        return value
    out = {key: _without_bytes(item) for key, item in value.items()}
    encoded = value.get("data")
    if value.get("kind") == "binary" and isinstance(encoded, str):
        size = len(encoded) * 3 // 4 - (len(encoded) - len(encoded.rstrip("=")))
        out["data"] = f"<{size:,} bytes>"
    return out


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValidationError(f"a Pydantic AI message must hold JSON values only: {exc}") from None


def message_digest(data: Mapping[str, Any]) -> str:
    """A Pydantic AI message's digest, from its JSON: the same message, the same digest,
    whatever the order of its keys (the ``group`` of its messages in the log)."""
    try:
        encoded = orjson.dumps(dict(data), option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValidationError(
            f"a Pydantic AI message must be its JSON, with JSON values only: {exc}"
        ) from None
    return hashlib.sha256(encoded).hexdigest()[:32]


# ---- from the log -------------------------------------------------------------------------


@dataclass
class _Group:
    """The parts of one Pydantic AI message, found next to each other in a history."""

    key: str
    kind: str
    envelope: dict[str, Any] | None = None
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, native: dict[str, Any]) -> None:
        if isinstance(native.get("message"), dict):
            self.envelope = native["message"]
        for at, part in native["parts"]:
            self.parts[at] = part

    def message(self) -> dict[str, Any]:
        """The message (a message of the group left out of the history leaves out its
        parts, and the first one left out, its fields: the kind is all then)."""
        envelope = self.envelope if self.envelope is not None else {"kind": self.kind}
        return {**envelope, "parts": [self.parts[at] for at in sorted(self.parts)]}


def _native(message: Message) -> dict[str, Any] | None:
    """The payload of a message this module made, checked for the shape it gave it."""
    native = message.native
    if native is None or native.protocol != PYDANTIC_AI_PROTOCOL:
        return None
    data = native.data
    parts = data.get("parts")
    if (
        not isinstance(data.get("group"), str)
        or data.get("kind") not in ("request", "response")
        or not isinstance(parts, list)
        or not all(
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], int)
            and isinstance(pair[1], dict)
            for pair in parts
        )
    ):
        return None
    return data


def _convert(message: Message, out: list[dict[str, Any]]) -> None:
    """A message this module did not make (a handoff, a retained user message, a synthetic
    result for a call that got none, a message appended in another format), as Pydantic AI
    JSON; a user message or tool result joins the request before it."""
    stamp = message.created_at.isoformat() if message.created_at is not None else None
    if message.role == "assistant":
        parts: list[dict[str, Any]] = []
        if message.reasoning:
            parts.append({"part_kind": "thinking", "content": message.reasoning})
        if message.text:
            parts.append({"part_kind": "text", "content": message.text})
        parts.extend(
            {
                "part_kind": _CALL,
                "tool_name": call.name,
                "args": call.arguments_json if call.arguments_json is not None else call.args,
                "tool_call_id": call.id,
            }
            for call in message.tool_calls
        )
        if message.text or message.tool_calls:
            out.append({"kind": "response", "parts": parts, **_stamped(stamp)})
        return
    part: dict[str, Any]
    if message.role == "user":
        part = {"part_kind": "user-prompt", "content": message.text, **_stamped(stamp)}
    elif message.role == "tool":
        part = {
            "part_kind": _RETURN,
            "tool_name": message.name or "tool",
            "tool_call_id": message.tool_call_id,
            "content": message.text,
            "outcome": "failed" if message.is_error else "success",
            **_stamped(stamp),
        }
    else:
        return  # a system message: never part of a history
    if out and out[-1].get("kind") == "request":
        out[-1]["parts"].append(part)
    else:
        out.append({"kind": "request", "parts": [part]})


def _stamped(stamp: str | None) -> dict[str, str]:
    return {"timestamp": stamp} if stamp is not None else {}


def _answerable(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` from its first request on, less each tool return whose call is not earlier
    in it (and a request left with no parts by that)."""
    start = next((i for i, m in enumerate(history) if m.get("kind") == "request"), len(history))
    out: list[dict[str, Any]] = []
    called: set[str] = set()
    for message in history[start:]:
        parts = message["parts"]
        if message.get("kind") == "response":
            called.update(p["tool_call_id"] for p in parts if p.get("part_kind") == _CALL)
            out.append(message)
            continue
        kept = [p for p in parts if not _answers_a_call(p) or p.get("tool_call_id") in called]
        if len(kept) == len(parts):
            out.append(message)
        elif kept:
            out.append({**message, "parts": kept})
    return out


__all__ = [
    "CLIENT_ID_PREFIX",
    "PYDANTIC_AI_PROTOCOL",
    "RENDERED_PART_CHARS",
    "message_digest",
    "messages_from_pydantic_ai",
    "pydantic_ai_messages_of",
    "system_prompt_parts",
]
