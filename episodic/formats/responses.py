"""OpenAI Responses-API input items, to and from :class:`~episodic.models.Message`.

The Responses API speaks in items, not messages: a ``message``, a ``function_call`` and its
``function_call_output``, a ``reasoning`` item, and a growing list of built-in tool items
(web and file search, computer use, MCP, shell...). Every item
:func:`message_from_responses_item` reads is kept whole in the message's ``native`` payload
(protocol :data:`~episodic.models.OPENAI_RESPONSES_PROTOCOL`), so an item episodic has no
model for is still stored, still readable by a summarizer, and given back byte for byte.

Tool calls pair with their outputs by ``call_id``: it becomes the call's ``id`` and the
result's ``tool_call_id``, so the log's pairing rules (and the safe cut) apply to function
calls exactly as they do to chat-completions calls.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from episodic.errors import ValidationError
from episodic.formats.openai_chat import parse_arguments
from episodic.models import (
    DEVELOPER_ROLE,
    OPENAI_CHAT_PROTOCOL,
    OPENAI_RESPONSES_PROTOCOL,
    ImageBlock,
    Message,
    RawBlock,
    TextBlock,
)

#: Content part types the API takes in a user message or a function call's output as they are.
_INPUT_PARTS = frozenset({"input_text", "input_image", "input_file"})
#: Parts of a message item that are text: what the user typed, what the model said.
_TEXT_PARTS = frozenset({"input_text", "output_text"})
#: The ``native.protocol`` under which the message :func:`messages_from_responses_items` makes
#: of consecutive ``function_call`` items keeps them (``{"items": [...]}``), for the record:
#: the message is given back from its fields, one item per call.
OPENAI_RESPONSES_ITEMS_PROTOCOL = "openai.responses.items"
#: The longest rendering of an item episodic has no model for. Generated images and encrypted
#: payloads run to megabytes; a summarizer needs to know what happened, not the bytes, and
#: ``native`` keeps them all.
RENDERED_ITEM_CHARS = 2_000


def message_to_responses(message: Message) -> list[dict[str, Any]]:
    """What :meth:`Message.to_responses <episodic.models.Message.to_responses>` returns."""
    item = _native_item(message)
    if item is not None:
        return [item]
    if message.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.tool_call_id,
                "output": _content(message),
            }
        ]
    if message.role == "assistant":
        items: list[dict[str, Any]] = []
        text = message.text
        if text or not message.tool_calls:
            # A string, not output_text parts: an assistant part list needs the id and status
            # of an output the API issued, which a message written elsewhere does not have.
            items.append({"type": "message", "role": "assistant", "content": text})
        items.extend(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments_text(),
            }
            for call in message.tool_calls
        )
        return items
    if message.role == "system":
        return [{"type": "message", "role": _system_role(message), "content": message.content}]
    return [{"type": "message", "role": "user", "content": _content(message)}]


def messages_to_responses(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Every message's items, in order, ready for ``responses.create(input=...)``.

    The API refuses an assistant message or function call whose ``id`` names output that
    came with a reasoning item, unless that reasoning item is sent too, and a loaded context
    holds no reasoning items (``compose_context`` leaves out turns without text). So, as the
    OpenAI Agents SDK does for compacted histories, when no reasoning item is in the list
    those items go without their ids: their content is all there, an id only points at what
    the API stored.
    """
    items = [item for message in messages for item in message_to_responses(message)]
    if any(item.get("type") == "reasoning" for item in items):
        return items
    return [_without_output_id(item) for item in items]


def message_from_responses_item(item: Mapping[str, Any]) -> Message:
    """What :meth:`Message.from_responses_item <episodic.models.Message.from_responses_item>`
    returns."""
    if not isinstance(item, Mapping):
        raise ValidationError(
            "a Responses item must be a mapping (for an SDK object pass "
            f"item.model_dump(exclude_unset=True)), not {type(item).__name__}"
        )
    data = dict(item)
    fields = _fields_from_item(data)
    fields["native"] = {"protocol": OPENAI_RESPONSES_PROTOCOL, "data": data}
    try:
        # One validation of everything, the item kept in native included, so a refusal
        # names the whole path: ``native.data.action`` for a value JSON cannot hold.
        return Message.model_validate(fields)
    except ValidationError as exc:
        raise ValidationError(
            f"not a valid Responses item: {exc}", field=exc.field, details=exc.errors()
        ) from None


def messages_from_responses_items(items: Iterable[Mapping[str, Any]]) -> list[Message]:
    """Messages from a list of Responses items: what ``Context.to_responses`` gives
    (converting it back and loading gives the same items), or a request's input with the
    output its responses added.

    Each item is :func:`message_from_responses_item`'s message, except a turn's calls: a run
    of two or more consecutive ``function_call`` items (parallel calls) is one assistant
    message with all their calls, since a loaded context puts each call's output right after
    the message that made the call (one message per call would move each output up to its
    call); the items are kept in ``native`` (protocol
    :data:`OPENAI_RESPONSES_ITEMS_PROTOCOL`) unless its fields give them back as they came.
    An assistant message item right before calls joins their message when that message gives
    both back as they came (what :func:`message_to_responses` makes of a message with text
    and calls: its text, were it blank, would otherwise be left out of a context). What is not
    an item raises :class:`~episodic.errors.ValidationError` naming its index (``items[3]``).
    """
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise ValidationError("expected a list of Responses items", field="items")
    out: list[Message] = []
    run: list[dict[str, Any]] = []  # an assistant message item, then the calls after it
    first = 0  # the index of the run's first item
    for index, item in enumerate(items):
        if isinstance(item, Mapping) and item.get("type") == "function_call":
            first = index if not run else first
            run.append(dict(item))
            continue
        out.extend(_run_messages(run, first))
        run, first = [], index
        if _is_assistant_text(item):
            run.append(dict(item))  # it may open a turn's calls
        else:
            out.append(_item_message(item, index))
    out.extend(_run_messages(run, first))
    return out


def _is_assistant_text(item: object) -> bool:
    return (
        isinstance(item, Mapping)
        and item.get("type", "message") == "message"
        and item.get("role") == "assistant"
    )


def _item_message(item: Any, index: int) -> Message:
    try:
        return message_from_responses_item(item)
    except ValidationError as exc:
        field = f"items[{index}].{exc.field}" if exc.field else f"items[{index}]"
        raise ValidationError(f"items[{index}]: {exc}", field=field, details=exc.errors()) from None


def _run_messages(run: list[dict[str, Any]], first: int) -> list[Message]:
    """The messages of a run: an assistant message item, its calls, or both."""
    if not run:
        return []
    head = run[0] if run[0].get("type") != "function_call" else None
    calls = run[1:] if head is not None else run
    if head is None:
        return _calls_messages(calls, first)
    text = _item_message(head, first)  # refused here, with its index, if it is no item
    if calls:
        together = _run_message(run, first, _message_fields(head))
        if together is not None:
            return [together]
    return [text, *_calls_messages(calls, first + 1)]


def _calls_messages(calls: list[dict[str, Any]], first: int) -> list[Message]:
    """No message for no calls, the item's own for one, one for several."""
    if len(calls) < 2:
        return [_item_message(item, first) for item in calls]
    exact = _run_message(calls, first, {"role": "assistant"})
    if exact is not None:
        return [exact]
    native = {"protocol": OPENAI_RESPONSES_ITEMS_PROTOCOL, "data": {"items": calls}}
    return [_validated({**_joined(calls, first, {"role": "assistant"}), "native": native}, first)]


def _run_message(run: list[dict[str, Any]], first: int, fields: dict[str, Any]) -> Message | None:
    """One message of the run's items (``fields`` with the calls of those that are calls),
    if it gives them back as they came; else None."""
    message = _validated(_joined(run, first, fields), first)
    return message if message_to_responses(message) == run else None


def _joined(run: list[dict[str, Any]], first: int, fields: dict[str, Any]) -> dict[str, Any]:
    calls: list[Any] = []
    for offset, item in enumerate(run):
        if item.get("type") != "function_call":
            continue
        try:
            calls.extend(_call_fields(item)["tool_calls"])
        except ValidationError as exc:
            where = f"items[{first + offset}]"
            field = f"{where}.{exc.field}" if exc.field else where
            raise ValidationError(f"{where}: {exc}", field=field) from None
    return {**fields, "tool_calls": tuple(calls)}


def _validated(fields: dict[str, Any], first: int) -> Message:
    try:
        return Message.model_validate(fields)
    except ValidationError as exc:
        where = f"items[{first}]"
        raise ValidationError(
            f"not valid Responses items from {where}: {exc}", field=where, details=exc.errors()
        ) from None


# ---- items to messages ----------------------------------------------------------------


def _fields_from_item(data: dict[str, Any]) -> dict[str, Any]:
    """``Message`` fields from one item (``native`` aside)."""
    kind = data.get("type")
    if kind is None and "role" in data:
        kind = "message"  # an easy input message may leave out its type
    if not isinstance(kind, str) or not kind:
        raise ValidationError(
            f"a Responses item needs a type (or, for a message, a role); got {kind!r:.80}",
            field="type",
        )
    if kind == "message":
        return _message_fields(data)
    if kind == "function_call":
        return _call_fields(data)
    if kind == "function_call_output":
        return _output_fields(data)
    if kind == "reasoning":
        return _reasoning_fields(data)
    return {"role": "assistant", "content": _rendered(kind, data)}


def _message_fields(data: dict[str, Any]) -> dict[str, Any]:
    role = data.get("role")
    if role == DEVELOPER_ROLE:
        role = "system"  # the newer name for it; native keeps the word and gives it back
    if role not in ("user", "assistant", "system"):
        raise ValidationError(
            f"unknown message role {role!r:.80}; expected user, assistant, system or developer",
            field="role",
        )
    content = data.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise ValidationError(
            "a message item's content must be a string or a list of content parts",
            field="content",
        )
    blocks = _blocks(content, "content")
    if role == "system":
        # episodic's system messages are plain text
        return {"role": role, "content": "\n".join(_block_text(block) for block in blocks)}
    return {"role": role, "content": blocks}


def _call_id(data: dict[str, Any], problem: str) -> str:
    """The item's ``call_id``: what pairs a call with its output, so it must be there."""
    call_id = data.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ValidationError(problem, field="call_id")
    return call_id


def _call_fields(data: dict[str, Any]) -> dict[str, Any]:
    call_id = _call_id(
        data, "a function_call item needs its call_id, the id its function_call_output answers"
    )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValidationError("a function_call item needs the function's name", field="name")
    arguments = data.get("arguments", "")
    if not isinstance(arguments, str | dict):
        raise ValidationError("function_call arguments must be a JSON string", field="arguments")
    args, arguments_json = parse_arguments(arguments)
    call = {"id": call_id, "name": name, "args": args, "arguments_json": arguments_json}
    return {"role": "assistant", "tool_calls": (call,)}


def _output_fields(data: dict[str, Any]) -> dict[str, Any]:
    call_id = _call_id(
        data, "a function_call_output item needs the call_id of the function_call it answers"
    )
    output = data.get("output")
    if isinstance(output, str):
        content: str | tuple[dict[str, Any], ...] = output
    elif isinstance(output, list):
        content = _blocks(output, "output")
    else:
        raise ValidationError(
            "a function_call_output item needs its output: a string or a list of content parts",
            field="output",
        )
    name = data.get("name")
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": content,
        "name": name if isinstance(name, str) else None,
    }


def _reasoning_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The readable part of a reasoning item: its summary, else its reasoning text. An item
    with only ``encrypted_content`` has none; it is kept (in native) all the same."""
    texts: list[str] = []
    for key in ("summary", "content"):
        parts = data.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise ValidationError(f"a reasoning item's {key} must be a list", field=key)
        texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if texts:
            break
    return {"role": "assistant", "reasoning": "\n\n".join(texts) if texts else None}


def _rendered(kind: str, data: dict[str, Any]) -> str:
    """An item episodic has no model for, as text a summarizer can read: its type, then
    the rest as compact JSON (cut at :data:`RENDERED_ITEM_CHARS`)."""
    rest = {key: value for key, value in data.items() if key != "type"}
    try:
        body = orjson.dumps(rest).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValidationError(
            f"a {kind:.80} item must hold JSON values only: {exc}", field="native"
        ) from None
    text = f"[{kind}] {body}"
    if len(text) > RENDERED_ITEM_CHARS:
        text = text[: RENDERED_ITEM_CHARS - 1] + "…"
    return text


def _blocks(parts: list[Any], field: str) -> tuple[dict[str, Any], ...]:
    """Content block fields, for ``Message`` validation. Parts with no block of their own
    (files, audio, annotations aside) stay raw; native keeps every part as it came anyway."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, dict):
            raise ValidationError("each content part must be an object", field=field)
        kind = part.get("type")
        text = part.get("text")
        detail = part.get("detail")
        if kind in _TEXT_PARTS and isinstance(text, str):
            out.append({"type": "text", "text": text})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append({"type": "text", "text": part["refusal"]})  # what the model said
        elif (
            kind == "input_image"
            and isinstance(part.get("image_url"), str)
            and (detail is None or isinstance(detail, str))
        ):
            out.append({"type": "image", "url": part["image_url"], "detail": detail})
        else:
            out.append({"type": "raw", "data": part})
    return tuple(out)


def _block_text(block: dict[str, Any]) -> str:
    if block["type"] == "text":
        return str(block["text"])
    return f"[{block['data'].get('type', 'attachment')}]" if block["type"] == "raw" else "[image]"


# ---- messages to items ----------------------------------------------------------------


def _native_item(message: Message) -> dict[str, Any] | None:
    """The item a message was read from, while the message still says what it says.

    A message changed since (``compose_context`` caps a long tool result with
    ``model_copy``, which keeps ``native``) is built from its fields instead: the capped
    text must be what is sent, not the original output.
    """
    native = message.native
    if native is None or native.protocol != OPENAI_RESPONSES_PROTOCOL:
        return None
    try:
        again = message_from_responses_item(native.data)
    except ValidationError:
        return None
    if _wire_fields(again) != _wire_fields(message):
        return None
    return copy.deepcopy(native.data)


def _wire_fields(message: Message) -> tuple[Any, ...]:
    return (
        message.role,
        message.content,
        message.tool_calls,
        message.tool_call_id,
        message.reasoning,
    )


def _system_role(message: Message) -> str:
    """``developer`` for a system message read under that name, in either OpenAI format."""
    native = message.native
    if (
        native is not None
        and native.protocol in (OPENAI_CHAT_PROTOCOL, OPENAI_RESPONSES_PROTOCOL)
        and native.data.get("role") == DEVELOPER_ROLE
    ):
        return DEVELOPER_ROLE
    return "system"


def _content(message: Message) -> str | list[dict[str, Any]]:
    """A user message's or a tool result's content: a string, or input content parts."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    return [_part(block) for block in content]


def _part(block: TextBlock | ImageBlock | RawBlock) -> dict[str, Any]:
    """One block as an input content part; these shapes serve in a user message and in a
    function call's output alike."""
    if isinstance(block, TextBlock):
        return {"type": "input_text", "text": block.text}
    if isinstance(block, ImageBlock):
        return {"type": "input_image", "image_url": block.url, "detail": block.detail or "auto"}
    data = block.data
    kind = data.get("type")
    if kind in _INPUT_PARTS:
        return dict(data)
    file = data.get("file")
    if kind == "file" and isinstance(file, dict):
        # chat-completions' file part: the same fields, flat
        return {"type": "input_file", **file}
    # Nothing in this format can carry it (chat-completions audio, say): what a summarizer
    # would read in its place, so the turn still says something was there.
    return {"type": "input_text", "text": f"[{kind or 'attachment'}]"}


def _without_output_id(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` without the id that ties it to a stored output (see messages_to_responses)."""
    if "id" not in item:
        return item
    kind = item.get("type", "message")
    if kind == "function_call":
        return {key: value for key, value in item.items() if key != "id"}
    if kind == "message" and item.get("role") == "assistant":
        # Output parts are only accepted with the output's id; without it the text goes as a
        # plain assistant message, with its phase (the API asks for it back).
        content = item.get("content")
        if isinstance(content, list):
            blocks = _blocks(content, "content")
            content = "\n".join(_block_text(block) for block in blocks)
        easy: dict[str, Any] = {"type": "message", "role": "assistant", "content": content}
        if item.get("phase") is not None:
            easy["phase"] = item["phase"]
        return easy
    return item


__all__ = [
    "OPENAI_RESPONSES_ITEMS_PROTOCOL",
    "RENDERED_ITEM_CHARS",
    "message_from_responses_item",
    "message_to_responses",
    "messages_from_responses_items",
    "messages_to_responses",
]
