"""The Anthropic Messages API's ``messages`` list, to and from :class:`~episodic.models.Message`.

The Messages API has two roles and strict turns: a tool call is a ``tool_use`` block of an
assistant turn, and its result a ``tool_result`` block at the start of the user turn right
after it. A loaded context already puts every call's results right after its call (see
``episodic.context``), so converting in order and merging consecutive turns of one role
gives that shape. On the way in (:func:`messages_from_anthropic`), a turn is split again:
a user turn's results are tool messages, the rest of it a user message.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from episodic.errors import ValidationError
from episodic.models import ImageBlock, Message, RawBlock, TextBlock

#: The image types the Messages API takes inline (``base64`` sources).
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
#: What the API accepts as a ``tool_use`` id; OpenAI-compatible servers emit others
#: (``functions.search:0``).
_TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]+")
#: The longest tool call id and tool name episodic keeps (``ToolCall``'s limits).
MAX_TOOL_ID_LENGTH = 512
#: The ``native.protocol`` under which a message read from Anthropic turns keeps the blocks it
#: was made of, when :func:`messages_to_anthropic` would not give them back as they came (a
#: thinking block's signature, a redacted thinking block, ``cache_control``, a raw block).
ANTHROPIC_PROTOCOL = "anthropic.messages"
#: Blocks only an assistant turn holds, and the block only a user turn holds.
ASSISTANT_ONLY_BLOCKS = frozenset({"tool_use", "thinking", "redacted_thinking"})
USER_ONLY_BLOCKS = frozenset({"tool_result"})


def messages_to_anthropic(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The ``messages`` of a Messages API request (pass the system prompt as ``system``).

    ``user`` and ``tool`` messages are user turns, ``assistant`` messages assistant turns;
    consecutive turns of one role are merged, as the API requires them to alternate. Blank
    text is left out (the API refuses a text block with no visible character), and so is a
    message left with nothing, and any system message. Readable ``reasoning`` is not sent: a
    thinking block needs the signature only Anthropic's own output carries.
    """
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        blocks = _blocks(message)
        if not blocks:
            continue
        role = "assistant" if message.role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def tool_use_id(call_id: str) -> str:
    """The ``tool_use`` id for a call id: the id itself when the API accepts it, else its
    accepted characters plus a digest, the same for the call and its result."""
    if _TOOL_USE_ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', call_id)[:64]}_{digest}"


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [_tool_result(message)]
    blocks = _content_blocks(message, images=message.role == "user")
    blocks.extend(
        {
            "type": "tool_use",
            "id": tool_use_id(call.id),
            "name": call.name,
            "input": dict(call.args),
        }
        for call in message.tool_calls
    )
    return blocks


def _tool_result(message: Message) -> dict[str, Any]:
    content: str | list[dict[str, Any]]
    if isinstance(message.content, str):
        content = message.content
    else:
        content = _content_blocks(message, images=True)
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": tool_use_id(message.tool_call_id or ""),
        "content": content,
    }
    if message.is_error:
        block["is_error"] = True
    return block


def _content_blocks(message: Message, *, images: bool) -> list[dict[str, Any]]:
    """Text and image blocks; an image where the API takes none (an assistant turn), or in a
    form it cannot fetch, is its alt text, and any other block its type in brackets."""
    content = message.content
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    out: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, ImageBlock) and images:
            out.append(_image(block))
        elif (text := _text_of(block)).strip():
            out.append({"type": "text", "text": text})
    return out


def _text_of(block: TextBlock | ImageBlock | RawBlock) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ImageBlock):
        return block.alt or "[image]"
    return f"[{block.data.get('type', 'attachment')}]"


def _image(block: ImageBlock) -> dict[str, Any]:
    url = block.url
    if url.startswith("data:"):
        header, comma, data = url[len("data:") :].partition(",")
        media_type, *params = header.split(";")
        if comma and "base64" in params and media_type in _IMAGE_TYPES:
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }
    elif url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    return {"type": "text", "text": block.alt or "[image]"}


# ---- turns to messages ----------------------------------------------------------------


def messages_from_anthropic(turns: Iterable[Mapping[str, Any]]) -> list[Message]:
    """Messages from a Messages API ``messages`` list: what :func:`messages_to_anthropic`
    gives (converting it back gives the same turns), or a request's turns.

    An assistant turn is one assistant message: its ``tool_use`` blocks are its calls, its
    ``thinking`` blocks its readable reasoning, its other blocks its content. A user turn is
    a tool message for each ``tool_result`` block, named after its call when the call is in
    the list (the API puts results first), then a user message of its other blocks, if it has
    any. Text and images become episodic's blocks, any other block is kept raw. A message
    keeps the blocks it was made of in ``native`` (protocol :data:`ANTHROPIC_PROTOCOL`) when
    :func:`messages_to_anthropic` would not give them back as they came. A turn's keys other
    than ``role`` and ``content`` (a response's ``id``, ``model``, ``usage``...) are not kept.

    Anything that is not a turn raises :class:`~episodic.errors.ValidationError` naming where
    (``messages[2].content[0].tool_use_id``): a tool call or a thinking block in a user turn,
    a result in an assistant turn, a ``tool_use`` id the API would refuse.
    """
    if isinstance(turns, str | bytes | Mapping) or not isinstance(turns, Iterable):
        raise ValidationError("expected a list of Messages API turns", field="messages")
    names: dict[str, str] = {}  # call id -> its tool's name, for the results that follow
    out: list[Message] = []
    for index, turn in enumerate(turns):
        where = f"messages[{index}]"
        role, content = _turn(turn, where)
        if isinstance(content, str):
            out.append(_message({"role": role, "content": content}, None, where))
        elif role == "assistant":
            message = _assistant_message(content, where)
            names.update((call.id, call.name) for call in message.tool_calls)
            out.append(message)
        else:
            out.extend(_user_messages(content, where, names))
    return out


def _turn(turn: object, where: str) -> tuple[str, str | list[Mapping[str, Any]]]:
    """A turn's role and content: a string, or its blocks (each an object with a type)."""
    if not isinstance(turn, Mapping):
        raise ValidationError(
            f"{where} must be a turn (an object), not {type(turn).__name__}", field=where
        )
    role = turn.get("role")
    if role not in ("user", "assistant"):
        raise ValidationError(
            f"{where}.role must be user or assistant, not {role!r:.80}", field=f"{where}.role"
        )
    content = turn.get("content")
    if isinstance(content, str):
        return role, content
    if not isinstance(content, list) or not content:
        raise ValidationError(
            f"{where}.content must be a string or a non-empty list of blocks",
            field=f"{where}.content",
        )
    return role, [_block(block, f"{where}.content[{i}]") for i, block in enumerate(content)]


def _block(block: object, where: str) -> Mapping[str, Any]:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise ValidationError(f"{where} must be a block: an object with a type", field=where)
    return block


def _assistant_message(blocks: list[Mapping[str, Any]], where: str) -> Message:
    content: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.content[{i}]"
        _refuse_other_turns_block(kind, at, "assistant")
        if kind == "tool_use":
            calls.append(_call(block, at))
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise ValidationError(f"{at}.thinking must be a string", field=f"{at}.thinking")
            reasoning.append(thinking)
        elif kind != "redacted_thinking":  # nothing readable: native keeps it
            content.append(_content_block(block))
        # ``tool_use`` ids must be unique within the message: Message's validation says so
    fields = {
        "role": "assistant",
        "content": tuple(content) if content else None,
        "tool_calls": tuple(calls),
        "reasoning": "\n\n".join(reasoning) if reasoning else None,
    }
    return _message(fields, blocks, where)


def _user_messages(
    blocks: list[Mapping[str, Any]], where: str, names: Mapping[str, str]
) -> list[Message]:
    out: list[Message] = []
    rest: list[Mapping[str, Any]] = []
    for i, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.content[{i}]"
        _refuse_other_turns_block(kind, at, "user")
        if kind == "tool_result":
            out.append(_result_message(block, at, names))
        else:
            rest.append(block)
    if rest:
        content = tuple(_content_block(block) for block in rest)
        out.append(_message({"role": "user", "content": content}, rest, where))
    return out


#: the blocks only the other side's turns hold, and how the message names each side's turn
_OTHER_TURNS_BLOCKS = {"assistant": USER_ONLY_BLOCKS, "user": ASSISTANT_ONLY_BLOCKS}
_A_TURN = {"assistant": "an assistant turn", "user": "a user turn"}


def _refuse_other_turns_block(kind: str, at: str, role: Literal["assistant", "user"]) -> None:
    """Refuse a block in a turn of ``role`` that only the other side's turns hold."""
    if kind in _OTHER_TURNS_BLOCKS[role]:
        other = "user" if role == "assistant" else "assistant"
        raise ValidationError(
            f"{at}: {_A_TURN[role]} cannot hold a {kind} block ({_A_TURN[other]} does)", field=at
        )


def _call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``ToolCall`` fields from a ``tool_use`` block."""
    name = block.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_TOOL_ID_LENGTH or "\x00" in name:
        raise ValidationError(
            f"{where}.name must be the tool's name (1 to {MAX_TOOL_ID_LENGTH} characters)",
            field=f"{where}.name",
        )
    arguments = block.get("input")
    if not isinstance(arguments, Mapping):
        raise ValidationError(f"{where}.input must be an object", field=f"{where}.input")
    return {"id": _tool_id(block.get("id"), f"{where}.id"), "name": name, "args": dict(arguments)}


def _result_message(block: Mapping[str, Any], where: str, names: Mapping[str, str]) -> Message:
    call_id = _tool_id(block.get("tool_use_id"), f"{where}.tool_use_id")
    given = block.get("content", "")
    content: str | tuple[dict[str, Any], ...]
    if isinstance(given, str):
        content = given
    elif isinstance(given, list):
        content = tuple(
            _content_block(_block(part, f"{where}.content[{i}]")) for i, part in enumerate(given)
        )
    else:
        raise ValidationError(
            f"{where}.content must be a string or a list of blocks", field=f"{where}.content"
        )
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise ValidationError(f"{where}.is_error must be true or false", field=f"{where}.is_error")
    fields = {
        "role": "tool",
        "tool_call_id": call_id,
        "content": content,
        "is_error": bool(is_error),
        "name": names.get(call_id),
    }
    return _message(fields, [block], where)


def _tool_id(value: object, where: str) -> str:
    """A ``tool_use`` id (or the id a result answers), as the API accepts them."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_TOOL_ID_LENGTH
        or not _TOOL_USE_ID.fullmatch(value)
    ):
        raise ValidationError(
            f"{where} must be a tool_use id: letters, digits, _ and - "
            f"(1 to {MAX_TOOL_ID_LENGTH} characters)",
            field=where,
        )
    return value


def _content_block(block: Mapping[str, Any]) -> dict[str, Any]:
    """Block fields, for ``Message`` validation: text and images as episodic's blocks (an
    image by its data URL or its URL), any other block raw."""
    kind = block.get("type")
    text = block.get("text")
    if kind == "text" and isinstance(text, str):
        return {"type": "text", "text": text}
    source = block.get("source")
    if kind == "image" and isinstance(source, Mapping):
        media_type, data, url = source.get("media_type"), source.get("data"), source.get("url")
        if source.get("type") == "base64" and isinstance(media_type, str) and isinstance(data, str):
            return {"type": "image", "url": f"data:{media_type};base64,{data}"}
        if source.get("type") == "url" and isinstance(url, str):
            return {"type": "image", "url": url}
    return {"type": "raw", "data": dict(block)}


def _message(fields: dict[str, Any], blocks: list[Mapping[str, Any]] | None, where: str) -> Message:
    """The message of ``fields``, keeping the ``blocks`` it was read from in ``native`` when
    converting it back would not give them as they came."""
    try:
        message = Message.model_validate(fields)
        if blocks is None:
            return message
        given = [dict(block) for block in blocks]
        if _blocks(message) == given:
            return message
        native = {"protocol": ANTHROPIC_PROTOCOL, "data": {"content": given}}
        return Message.model_validate({**fields, "native": native})
    except ValidationError as exc:
        raise ValidationError(
            f"{where} is not a valid Messages API turn: {exc}", field=where, details=exc.errors()
        ) from None


__all__ = [
    "ANTHROPIC_PROTOCOL",
    "messages_from_anthropic",
    "messages_to_anthropic",
    "tool_use_id",
]
