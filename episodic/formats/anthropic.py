"""The Anthropic Messages API's ``messages`` list, from :class:`~episodic.models.Message`.

The Messages API has two roles and strict turns: a tool call is a ``tool_use`` block of an
assistant turn, and its result a ``tool_result`` block at the start of the user turn right
after it. A loaded context already puts every call's results right after its call (see
``episodic.context``), so converting in order and merging consecutive turns of one role
gives that shape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from episodic.models import ImageBlock, Message, RawBlock, TextBlock

#: The image types the Messages API takes inline (``base64`` sources).
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
#: What the API accepts as a ``tool_use`` id; OpenAI-compatible servers emit others
#: (``functions.search:0``).
_TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]+")


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


__all__ = ["messages_to_anthropic", "tool_use_id"]
