"""An append's body in any of the formats a context is served in: the schema of each (chosen
by the body's ``format``; episodic's own when it has none), its validation, and its messages.

The body is validated against its format's schema, as sent, before anything is converted:
what the schema accepts converts, so a refusal names the part of the body that broke a rule
the schema states. What no schema can say is checked after: a tool call id used twice in one
message (:class:`~episodic.errors.DuplicateToolCallError`), and, by the store, a result that
answers no open call. The converted batch is what the store keys an idempotent retry on, so
the same ``Idempotency-Key`` replays the first result for the same messages in any format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, get_args
from uuid import UUID

from fastapi.exceptions import RequestValidationError
from pydantic import Discriminator, Tag, TypeAdapter
from pydantic import ValidationError as PydanticValidationError
from typing_extensions import TypeAliasType

from episodic import errors
from episodic.formats.anthropic import messages_from_anthropic
from episodic.formats.openai_chat import messages_from_openai
from episodic.formats.responses import messages_from_responses_items
from episodic.models import Message, Usage
from episodic.server.fields import storable_number
from episodic.server.inbound.anthropic import (
    AnthropicAppendBatch,
    anthropic_call_ids,
)
from episodic.server.inbound.openai_chat import (
    OpenAIAppendBatch,
    openai_call_ids,
)
from episodic.server.inbound.responses import (
    ResponsesAppendBatch,
    responses_call_ids,
)
from episodic.server.schemas import AppendBatch, ContextFormat, message_from_episodic

#: an append takes its messages in each format a context is served in
AppendFormat = ContextFormat
APPEND_FORMATS: tuple[str, ...] = get_args(AppendFormat)
DEFAULT_FORMAT = "episodic"


def _format_of(body: Any) -> str | None:
    """A body's tag: its ``format``, episodic's own when it has none."""
    return body.get("format", DEFAULT_FORMAT) if isinstance(body, dict) else None


AppendRequest = TypeAliasType(
    "AppendRequest",
    Annotated[
        Annotated[AppendBatch, Tag("episodic")]
        | Annotated[OpenAIAppendBatch, Tag("openai")]
        | Annotated[ResponsesAppendBatch, Tag("responses")]
        | Annotated[AnthropicAppendBatch, Tag("anthropic")],
        Discriminator(_format_of),
    ],
)
APPEND_REQUEST: TypeAdapter[Any] = TypeAdapter(AppendRequest)


@dataclass(frozen=True, slots=True)
class Conversion:
    """One format's way in: its messages, and the ids of each message's calls (which the
    schema cannot require to be unique)."""

    messages: Callable[[Sequence[Any]], list[Message]]
    call_ids: Callable[[Sequence[Any]], Iterable[list[str]]]


def _episodic_messages(sent: Sequence[Any]) -> list[Message]:
    return [message_from_episodic(message) for message in sent]


def _episodic_call_ids(sent: Sequence[Any]) -> Iterable[list[str]]:
    return ([call["id"] for call in message.get("tool_calls") or ()] for message in sent)


CONVERSIONS: dict[str, Conversion] = {
    "episodic": Conversion(_episodic_messages, _episodic_call_ids),
    "openai": Conversion(messages_from_openai, openai_call_ids),
    "responses": Conversion(messages_from_responses_items, responses_call_ids),
    "anthropic": Conversion(messages_from_anthropic, anthropic_call_ids),
}


@dataclass(frozen=True, slots=True)
class ReadAppend:
    """An append's body, read: its format, its messages, the usage sent with them."""

    format: str
    messages: list[Message]
    usage: Usage | None


def read_append(body: bytes, query_format: str | None, conversation_id: UUID) -> ReadAppend:
    """The append ``body`` asks for, in its ``format``, else in ``query_format`` (the
    ``?format=`` of the request), else in episodic's own. A body that is not JSON, that its
    format's schema refuses, or whose format is not the query's is a 422."""
    sent = parse_json(body)
    if isinstance(sent, dict) and query_format is not None:
        stated = sent.setdefault("format", query_format)
        if stated != query_format:
            raise errors.ValidationError(
                f"the body's format is {stated!r:.40} and the query's {query_format!r}: send "
                "one, or the same in both",
                field="format",
            )
    try:
        batch = APPEND_REQUEST.validate_python(sent, strict=True)
    except PydanticValidationError as exc:
        raise RequestValidationError(located(exc, sent)) from None
    conversion = CONVERSIONS[batch.format]
    for ids in conversion.call_ids(sent["messages"]):
        _unique(ids, conversation_id)
    usage = Usage.model_validate(batch.usage.model_dump()) if batch.usage is not None else None
    return ReadAppend(batch.format, conversion.messages(sent["messages"]), usage)


def parse_json(body: bytes) -> Any:
    """The body's JSON (NaN and Infinity, which JSON has not, refused; an integer beyond 64
    bits read as the nearest float, which the store can keep)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not a JSON value")

    try:
        return json.loads(body, parse_constant=refuse, parse_int=storable_number)
    except ValueError as exc:  # a JSONDecodeError, a UnicodeDecodeError, or the refusal
        raise errors.ValidationError(f"the body is not JSON: {exc}", field="body") from None


def _unique(ids: list[str], conversation_id: UUID) -> None:
    seen: set[str] = set()
    for call_id in ids:
        if call_id in seen:
            raise errors.DuplicateToolCallError(
                conversation_id=conversation_id, tool_call_id=call_id
            )
        seen.add(call_id)


def located(exc: PydanticValidationError, sent: Any) -> list[dict[str, Any]]:
    """pydantic's errors, each located in the body as sent: its ``loc`` is the path of keys
    and indexes to the refused part (``body``, ``messages``, 0, ``tool_call_id``), without
    the names pydantic gives the members of a union (``tool``, ``str``...)."""
    found = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        found.append({**error, "loc": ("body", *_path(sent, error["loc"]))})
    return found


def _path(sent: Any, loc: Sequence[str | int]) -> list[str | int]:
    """The part of ``loc`` that is keys and indexes of ``sent``; a missing key (a required
    field) ends it."""
    path: list[str | int] = []
    here = sent
    last = len(loc) - 1
    for position, part in enumerate(loc):
        step = _step(here, part)
        if step is not None:
            here = step[0]
        elif not (isinstance(here, dict) and position == last):
            continue  # a union member's name: not a part of the body
        # (else a field that is missing, or one that is not allowed: named all the same)
        path.append(part)
    return path


def _step(here: Any, part: str | int) -> tuple[Any] | None:
    """What ``part`` (a key, an index) of ``here`` holds, when it holds one."""
    if isinstance(here, dict) and isinstance(part, str) and part in here:
        return (here[part],)
    if isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
        return (here[part],)
    return None


__all__ = [
    "APPEND_FORMATS",
    "APPEND_REQUEST",
    "CONVERSIONS",
    "AppendFormat",
    "AppendRequest",
    "ReadAppend",
    "parse_json",
    "read_append",
]
