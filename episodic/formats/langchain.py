"""LangChain messages, to and from :class:`~episodic.models.Message`.

A LangChain ``BaseMessage`` comes here as its dict, the form
``langchain_core.messages.messages_to_dict`` gives (``{"type": "ai", "data": {...}}``, made
JSON by the caller), and goes back in that form for ``messages_from_dict``: this module
imports no LangChain, as no format imports its SDK. The dict is kept whole in the message's
``native`` payload (protocol :data:`LANGCHAIN_MESSAGE_PROTOCOL`), so a message read here is
given back as it came (its id, metadata, usage and artifact included) for as long as its
fields still say what it said; a message written elsewhere, or changed since (a tool result
cut at load), is built from its fields.

A ``HumanMessage`` is a user message, an ``AIMessage`` an assistant message with its tool
calls (malformed ones too: LangChain answers them with an error ``ToolMessage``, which must
pair with a call), a ``ToolMessage`` the result of the call its ``tool_call_id`` names (an
``error`` status is ``is_error``), a ``SystemMessage`` a system message. Reasoning and
thinking blocks are the message's readable ``reasoning``; tool-use blocks repeat its
calls and are left out of the content; any block episodic has no model for stays raw.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from episodic.errors import ValidationError
from episodic.models import ImageBlock, Message, RawBlock, TextBlock, ToolCall, Usage

#: The ``native.protocol`` of a message read from a LangChain message's dict.
LANGCHAIN_MESSAGE_PROTOCOL = "langchain.message"

#: LangChain's message types (``BaseMessage.type``, chunks included) by episodic role.
_ROLE_OF_TYPE = {
    "human": "user",
    "HumanMessageChunk": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "system": "system",
    "SystemMessageChunk": "system",
}
#: ``ChatMessage`` roles by episodic role (``developer`` is OpenAI's newer name for system).
_ROLE_OF_CHAT_ROLE = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
}
#: The LangChain type each role is given back as.
_TYPE_OF_ROLE = {"user": "human", "assistant": "ai", "tool": "tool", "system": "system"}
#: Content blocks that repeat an AI message's tool calls (Anthropic's, LangChain's own).
_CALL_BLOCKS = frozenset({"tool_use", "tool_call"})
#: Content blocks of an AI message that hold its readable reasoning, and the key of the text.
_REASONING_BLOCKS = {"reasoning": "reasoning", "thinking": "thinking"}


def message_from_langchain(data: Mapping[str, Any], *, client_id: str | None = None) -> Message:
    """The message for one LangChain message's dict (see the module docstring), kept whole
    in ``native``; ``client_id`` is the message's id in the log, if the caller gives one.
    What is not such a dict raises :class:`~episodic.errors.ValidationError` naming the
    field."""
    if not isinstance(data, Mapping):
        raise ValidationError(
            "a LangChain message must be its dict (messages_to_dict([message])[0]), "
            f"not {type(data).__name__}"
        )
    outer = dict(data)
    fields = _fields(outer)
    fields["native"] = {"protocol": LANGCHAIN_MESSAGE_PROTOCOL, "data": outer}
    if client_id is not None:
        fields["client_id"] = client_id
    try:
        # One validation of everything, the dict kept in native included, so a refusal names
        # the whole path: ``tool_calls[0].args.x`` for a NaN a tool call's arguments hold.
        return Message.model_validate(fields)
    except ValidationError as exc:
        raise ValidationError(
            f"not a valid LangChain message: {exc}", field=exc.field, details=exc.errors()
        ) from None


def messages_from_langchain(items: Iterable[Mapping[str, Any]]) -> list[Message]:
    """:func:`message_from_langchain` of each dict, in order; a refusal names the index
    (``messages[3]``)."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise ValidationError("expected a list of LangChain message dicts", field="messages")
    out: list[Message] = []
    for index, item in enumerate(items):
        try:
            out.append(message_from_langchain(item))
        except ValidationError as exc:
            field = f"messages[{index}].{exc.field}" if exc.field else f"messages[{index}]"
            raise ValidationError(
                f"messages[{index}]: {exc}", field=field, details=exc.errors()
            ) from None
    return out


def message_to_langchain(message: Message) -> dict[str, Any]:
    """The message as a LangChain message's dict, for ``messages_from_dict``: the dict it
    was read from while its fields still say what that dict said, else one built from its
    fields (readable reasoning is not sent, as in the other formats; a result is named by
    its call's id, with an ``error`` status for ``is_error``; the id is the client id, else
    the one the message was read with)."""
    native = _native_dict(message)
    if native is not None:
        return native
    body: dict[str, Any] = {"content": _content(message)}
    if message.name is not None:
        body["name"] = message.name
    identity = message.client_id or _native_id(message)
    if identity is not None:
        body["id"] = identity
    if message.role == "assistant":
        calls = [call for call in message.tool_calls if not _is_malformed(call)]
        body["tool_calls"] = [
            {"name": call.name, "args": dict(call.args), "id": call.id, "type": "tool_call"}
            for call in calls
        ]
        body["invalid_tool_calls"] = [
            {
                "name": call.name,
                "args": call.arguments_json,
                "id": call.id,
                "error": None,
                "type": "invalid_tool_call",
            }
            for call in message.tool_calls
            if _is_malformed(call)
        ]
    elif message.role == "tool":
        body["tool_call_id"] = message.tool_call_id
        body["status"] = "error" if message.is_error else "success"
    kind = _TYPE_OF_ROLE[message.role]
    return {"type": kind, "data": {**body, "type": kind}}


def messages_to_langchain(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """:func:`message_to_langchain` of each message, in order."""
    return [message_to_langchain(message) for message in messages]


def usage_from_langchain(usage_metadata: Mapping[str, Any] | None) -> Usage | None:
    """An ``AIMessage.usage_metadata`` as episodic's :class:`~episodic.models.Usage` (cache
    reads and reasoning from its details), None when the model reported none. Counts that
    are not token counts raise :class:`~episodic.errors.ValidationError`."""
    if usage_metadata is None:
        return None
    if not isinstance(usage_metadata, Mapping):
        raise ValidationError("usage_metadata must be a mapping", field="usage_metadata")
    inputs = usage_metadata.get("input_token_details") or {}
    outputs = usage_metadata.get("output_token_details") or {}
    if not isinstance(inputs, Mapping) or not isinstance(outputs, Mapping):
        raise ValidationError(
            "usage_metadata's token details must be mappings", field="usage_metadata"
        )
    return Usage(
        input_tokens=usage_metadata.get("input_tokens") or 0,
        output_tokens=usage_metadata.get("output_tokens") or 0,
        cache_read_tokens=inputs.get("cache_read") or 0,
        reasoning_tokens=outputs.get("reasoning") or 0,
    )


# ---- dicts to messages ----------------------------------------------------------------


def _fields(outer: dict[str, Any]) -> dict[str, Any]:
    """``Message`` fields from one message's dict (``native`` aside)."""
    kind, data = outer.get("type"), outer.get("data")
    if not isinstance(data, Mapping):
        raise ValidationError(
            "a LangChain message dict holds the message's fields under 'data'", field="data"
        )
    role = _role(kind, data)
    content = _content_fields(data.get("content"), role)
    name = data.get("name")
    fields: dict[str, Any] = {
        "role": role,
        "content": content.blocks,
        "name": name if isinstance(name, str) else None,
    }
    if role == "assistant":
        fields["tool_calls"] = _calls(data)
        reasoning = content.reasoning or _kwargs_reasoning(data)
        fields["reasoning"] = reasoning or None
        if not content.blocks and not isinstance(data.get("content"), str):
            fields["content"] = None  # only calls (or thinking): no text of its own
    elif role == "tool":
        call_id = data.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ValidationError(
                "a ToolMessage needs the tool_call_id of the call it answers",
                field="tool_call_id",
            )
        fields["tool_call_id"] = call_id
        fields["is_error"] = data.get("status") == "error"
    elif role == "system":
        fields["content"] = _plain_text(content.blocks)
    return fields


def _role(kind: Any, data: Mapping[str, Any]) -> str:
    if kind in ("chat", "ChatMessageChunk"):
        chat_role = data.get("role")
        role = _ROLE_OF_CHAT_ROLE.get(chat_role) if isinstance(chat_role, str) else None
        if role is None:
            raise ValidationError(
                f"a ChatMessage's role {chat_role!r:.80} is not one episodic keeps; "
                "expected user, assistant, system or developer",
                field="role",
            )
        return role
    role = _ROLE_OF_TYPE.get(kind) if isinstance(kind, str) else None
    if role is None:
        raise ValidationError(
            f"unknown LangChain message type {kind!r:.80}; expected human, ai, tool, system "
            "or chat (a FunctionMessage answers no call id: use tool calls)",
            field="type",
        )
    return role


@dataclass(frozen=True, slots=True)
class _Content:
    """A message's content as episodic blocks (or its string), and the reasoning it held."""

    blocks: str | tuple[dict[str, Any], ...]
    reasoning: str


def _content_fields(content: Any, role: str) -> _Content:
    if isinstance(content, str):
        return _Content(content, "")
    if not isinstance(content, list):
        raise ValidationError(
            "a LangChain message's content must be a string or a list of content blocks",
            field="content",
        )
    blocks: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for block in content:
        if isinstance(block, str):
            blocks.append({"type": "text", "text": block})
            continue
        if not isinstance(block, dict):
            raise ValidationError(
                "each content block must be a string or an object", field="content"
            )
        kind = block.get("type")
        text = block.get("text")
        if kind == "text" and isinstance(text, str):
            blocks.append({"type": "text", "text": text})
        elif role == "assistant" and kind in _CALL_BLOCKS:
            continue  # the message's tool_calls say it; native keeps the block
        elif role == "assistant" and kind in _REASONING_BLOCKS:
            thought = _reasoning_text(block, _REASONING_BLOCKS[kind])
            if thought:
                thoughts.append(thought)
            else:
                blocks.append({"type": "raw", "data": block})  # redacted or encrypted
        elif (image := _image(block)) is not None:
            blocks.append(image)
        else:
            blocks.append({"type": "raw", "data": block})
    return _Content(tuple(blocks), "\n\n".join(thoughts))


def _reasoning_text(block: dict[str, Any], key: str) -> str:
    """A reasoning block's text: its own, else its summary's (OpenAI's reasoning items)."""
    text = block.get(key)
    if isinstance(text, str):
        return text
    summary = block.get("summary")
    if isinstance(summary, list):
        return "\n\n".join(
            part["text"]
            for part in summary
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _kwargs_reasoning(data: Mapping[str, Any]) -> str:
    """Reasoning some providers put in ``additional_kwargs`` (DeepSeek, vLLM)."""
    kwargs = data.get("additional_kwargs")
    if isinstance(kwargs, Mapping):
        reasoning = kwargs.get("reasoning_content")
        if isinstance(reasoning, str):
            return reasoning
    return ""


def _image(block: dict[str, Any]) -> dict[str, Any] | None:
    """An image by URL: OpenAI's ``image_url`` block, or LangChain's standard ``image``
    block with a ``url``; other images (base64, file ids) stay raw."""
    kind = block.get("type")
    if kind == "image_url":
        image = block.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        detail = image.get("detail") if isinstance(image, dict) else None
        if isinstance(url, str) and (detail is None or isinstance(detail, str)):
            return {"type": "image", "url": url, "detail": detail}
    elif kind == "image" and isinstance(block.get("url"), str):
        return {"type": "image", "url": block["url"]}
    return None


def _plain_text(blocks: str | tuple[dict[str, Any], ...]) -> str:
    """A system message's content as text (episodic's system messages are plain text)."""
    if isinstance(blocks, str):
        return blocks
    return "\n".join(b["text"] if b["type"] == "text" else f"[{b['type']}]" for b in blocks)


def _calls(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An AI message's calls: its tool calls, then its malformed ones (kept as calls with
    their raw argument text, so the error result LangChain makes for each pairs with it)."""
    calls: list[dict[str, Any]] = []
    for key in ("tool_calls", "invalid_tool_calls"):
        listed = data.get(key) or []
        if not isinstance(listed, list):
            raise ValidationError(f"an AIMessage's {key} must be a list", field=key)
        for call in listed:
            if not isinstance(call, Mapping):
                raise ValidationError(f"each of an AIMessage's {key} is an object", field=key)
            call_id, name = call.get("id"), call.get("name")
            if not isinstance(call_id, str) or not call_id:
                if key == "invalid_tool_calls":
                    continue  # LangChain answers no malformed call without an id either
                raise ValidationError(
                    "a tool call needs its id, the id its ToolMessage answers",
                    field="tool_calls.id",
                )
            args = call.get("args")
            if key == "tool_calls":
                calls.append({"id": call_id, "name": name, "args": args or {}})
            else:
                raw = args if isinstance(args, str) else None
                calls.append(
                    {"id": call_id, "name": name or "unknown", "args": {}, "arguments_json": raw}
                )
    return calls


# ---- messages to dicts ----------------------------------------------------------------


def _native_dict(message: Message) -> dict[str, Any] | None:
    """The dict a message was read from, while the message still says what it says: one
    changed since (``compose_context`` caps a long tool result with ``model_copy``, which
    keeps ``native``) is built from its fields instead, so the capped text is what is sent."""
    native = message.native
    if native is None or native.protocol != LANGCHAIN_MESSAGE_PROTOCOL:
        return None
    try:
        again = message_from_langchain(native.data)
    except ValidationError:
        return None
    if _wire_fields(again) != _wire_fields(message):
        return None
    return copy.deepcopy(native.data)


def _native_id(message: Message) -> str | None:
    """The id of the LangChain message a changed message was read from: still its id."""
    native = message.native
    if native is None or native.protocol != LANGCHAIN_MESSAGE_PROTOCOL:
        return None
    data = native.data.get("data")
    identity = data.get("id") if isinstance(data, dict) else None
    return identity if isinstance(identity, str) and identity else None


def _wire_fields(message: Message) -> tuple[Any, ...]:
    return (
        message.role,
        message.content,
        message.tool_calls,
        message.tool_call_id,
        message.is_error,
        message.reasoning,
    )


def _is_malformed(call: ToolCall) -> bool:
    """A call whose argument text is not a JSON object: one of LangChain's
    ``invalid_tool_calls``."""
    if call.args or not call.arguments_json:
        return False
    try:
        return not isinstance(orjson.loads(call.arguments_json), dict)
    except orjson.JSONDecodeError:
        return True


def _content(message: Message) -> str | list[dict[str, Any]]:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    return [_block(block) for block in content]


def _block(block: TextBlock | ImageBlock | RawBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock):
        image: dict[str, Any] = {"url": block.url}
        if block.detail is not None:
            image["detail"] = block.detail
        return {"type": "image_url", "image_url": image}
    return copy.deepcopy(dict(block.data))


__all__ = [
    "LANGCHAIN_MESSAGE_PROTOCOL",
    "message_from_langchain",
    "message_to_langchain",
    "messages_from_langchain",
    "messages_to_langchain",
    "usage_from_langchain",
]
