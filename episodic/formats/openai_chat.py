"""OpenAI chat-completions message dicts, to and from :class:`~episodic.models.Message`.

Lossless: keys the model has no field for are kept in the message's ``native`` payload
(protocol :data:`~episodic.models.OPENAI_CHAT_PROTOCOL`) and given back by
:func:`message_to_openai`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from episodic.errors import ValidationError
from episodic.models import (
    DEVELOPER_ROLE,
    OPENAI_CHAT_PROTOCOL,
    ROLES,
    ImageBlock,
    Message,
    RawBlock,
    TextBlock,
)


def message_to_openai(message: Message, *, include_reasoning: bool = False) -> dict[str, Any]:
    """What :meth:`Message.to_openai <episodic.models.Message.to_openai>` returns."""
    out: dict[str, Any] = {"role": message.role}
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    if message.content is None:
        out["content"] = None
    elif isinstance(message.content, str):
        out["content"] = message.content
    else:
        out["content"] = [_block_to_openai(block) for block in message.content]
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_text()},
            }
            for call in message.tool_calls
        ]
    if message.name is not None and message.role != "tool":
        out["name"] = message.name
    if include_reasoning and message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if message.native is not None and message.native.protocol == OPENAI_CHAT_PROTOCOL:
        for key, value in message.native.data.items():
            out.setdefault(key, value)
        if message.role == "system" and message.native.data.get("role") == DEVELOPER_ROLE:
            out["role"] = DEVELOPER_ROLE
    return out


def messages_to_openai(
    messages: Iterable[Message], *, include_reasoning: bool = False
) -> list[dict[str, Any]]:
    """Each message as a chat-completions dict, in order."""
    return [message_to_openai(m, include_reasoning=include_reasoning) for m in messages]


def message_from_openai(data: Mapping[str, Any], *, tool_name: str | None = None) -> Message:
    """What :meth:`Message.from_openai <episodic.models.Message.from_openai>` returns."""
    if not isinstance(data, Mapping):
        raise ValidationError(
            f"a chat-completions message must be a mapping, not {type(data).__name__}"
        )
    fields = _fields_from_openai(dict(data), tool_name)  # episodic's own checks
    try:
        # One validation, of the blocks, calls and native payload too (given as dicts),
        # so a refusal names the whole path: ``tool_calls[0].id``.
        return Message.model_validate(fields)
    except ValidationError as exc:
        raise ValidationError(
            f"not a valid chat-completions message: {exc}",
            field=exc.field,
            details=exc.errors(),
        ) from None


def messages_from_openai(items: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Convert a chat-completions message list, naming each tool result after its call."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise ValidationError("expected a list of chat-completions messages", field="messages")
    names: dict[str, str] = {}
    out: list[Message] = []
    for item in items:
        # A non-mapping item, or an id that is not text, is for from_openai to refuse.
        call_id = item.get("tool_call_id") if isinstance(item, Mapping) else None
        name = (
            names.get(call_id) if isinstance(call_id, str) and item.get("role") == "tool" else None
        )
        message = message_from_openai(item, tool_name=name)
        for call in message.tool_calls:
            names[call.id] = call.name
        out.append(message)
    return out


def parse_arguments(arguments: str | dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A call's ``args`` and ``arguments_json`` from the provider's arguments: the parsed
    object, and the exact text whenever it is not simply that object's JSON (invalid JSON,
    extra whitespace), so the call is given back byte for byte. Shared with the Responses
    format, whose calls carry the same JSON string."""
    if isinstance(arguments, dict):
        return arguments, None  # some compatible servers send an object, not a JSON string
    try:
        parsed = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return {}, arguments
    if orjson.dumps(parsed).decode() == arguments:
        return parsed, None
    return parsed, arguments


def _fields_from_openai(extra: dict[Any, Any], tool_name: str | None) -> dict[str, Any]:
    """``Message`` fields from a chat-completions dict; ``extra`` keeps what has no field."""
    role = extra.pop("role", None)
    if role == DEVELOPER_ROLE:
        # The newer name for a system message. Episodic has one role for both; the word is
        # kept with the other chat-completions keys, and to_openai gives it back.
        role = "system"
        extra["role"] = DEVELOPER_ROLE
    if role not in ROLES:
        raise ValidationError(
            f"unknown role {role!r:.80}; expected one of {', '.join(ROLES)}", field="role"
        )
    content = extra.pop("content", None)
    fields: dict[str, Any] = {"role": role}
    if content is not None:
        fields["content"] = content if isinstance(content, str) else _blocks_from_openai(content)
    raw_calls = extra.pop("tool_calls", None)
    if raw_calls is not None and not isinstance(raw_calls, list | tuple):
        raise ValidationError("tool_calls must be a list of tool calls", field="tool_calls")
    if raw_calls:
        fields["tool_calls"] = tuple(_tool_call_from_openai(call) for call in raw_calls)
    if role == "tool":
        fields["tool_call_id"] = extra.pop("tool_call_id", None)
        # chat-completions tool messages carry no name; one that came in the dict stays
        # in ``native`` too, so it is given back.
        fields["name"] = tool_name if tool_name is not None else extra.get("name")
    elif "name" in extra:
        fields["name"] = extra.pop("name")
    reasoning = extra.pop("reasoning_content", None)
    if isinstance(reasoning, str):
        fields["reasoning"] = reasoning
    elif reasoning is not None:
        extra["reasoning_content"] = reasoning
    if extra:
        fields["native"] = {"protocol": OPENAI_CHAT_PROTOCOL, "data": extra}
    return fields


def _block_to_openai(block: TextBlock | ImageBlock | RawBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock):
        image: dict[str, Any] = {"url": block.url}
        if block.detail is not None:
            image["detail"] = block.detail
        # alt is episodic's own (what a summarizer reads); chat-completions has no place for it
        return {"type": "image_url", "image_url": image}
    return dict(block.data)


def _blocks_from_openai(blocks: Any) -> tuple[dict[str, Any], ...]:
    """Content block fields, for ``Message`` validation."""
    if not isinstance(blocks, list):
        raise ValidationError("content must be a string, a list of blocks or null", field="content")
    out: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise ValidationError("each content block must be an object", field="content")
        kind = block.get("type")
        image = block.get("image_url")
        if kind == "text" and set(block) == {"type", "text"} and isinstance(block["text"], str):
            out.append({"type": "text", "text": block["text"]})
        elif (
            kind == "image_url"
            and set(block) == {"type", "image_url"}
            and isinstance(image, dict)
            and set(image) <= {"url", "detail"}
            and isinstance(image.get("url"), str)
        ):
            out.append({"type": "image", "url": image["url"], "detail": image.get("detail")})
        else:
            out.append({"type": "raw", "data": block})
    return tuple(out)


def _tool_call_from_openai(call: Any) -> dict[str, Any]:
    """``ToolCall`` fields, for ``Message`` validation."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(call.get("id"), str):
        raise ValidationError("a tool call needs an id and a function", field="tool_calls")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str | dict):
        raise ValidationError("tool call arguments must be a JSON string", field="tool_calls")
    args, keep_text = parse_arguments(arguments)
    return {
        "id": call["id"],
        "name": function.get("name", ""),
        "args": args,
        "arguments_json": keep_text,
    }


__all__ = [
    "message_from_openai",
    "message_to_openai",
    "messages_from_openai",
    "messages_to_openai",
    "parse_arguments",
]
