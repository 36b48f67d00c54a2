"""An append in OpenAI's Responses format: input items (and the output items a response
adds), with the rules :func:`Message.from_responses_item
<episodic.models.Message.from_responses_item>` applies stated per item type. Each item is kept
whole in its message's ``native``; an item type episodic has no model for is kept too, as an
assistant message a summarizer can read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, JsonValue, Tag
from typing_extensions import TypeAliasType

from episodic.server.fields import (
    Identifier,
    Name,
    OpenModel,
    ToolName,
    other_type,
)
from episodic.server.schemas import WithUsage

#: item types with a schema of their own
ITEM_TYPES = frozenset({"message", "function_call", "function_call_output", "reasoning"})


class ResponsesMessageItem(OpenModel):
    """A message (its ``type`` may be left out): a string, or content parts (text,
    ``input_image``, files... any part is kept). ``developer`` reads as system."""

    type: Literal["message"] | None = Field(default=None, description="default 'message'")
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, JsonValue]]


class ResponsesFunctionCall(OpenModel):
    """A function call; ``call_id`` is what its output answers."""

    type: Literal["function_call"]
    call_id: Identifier
    name: ToolName
    arguments: str | dict[str, JsonValue] = Field(default="", description="default ''")


class ResponsesFunctionCallOutput(OpenModel):
    """A function call's output: ``call_id`` is that of the open call it answers."""

    type: Literal["function_call_output"]
    call_id: Identifier
    output: str | list[dict[str, JsonValue]]
    name: Name | None = None


class ResponsesReasoning(OpenModel):
    """Reasoning: its summary (or its text) is readable; the item is kept as it came."""

    type: Literal["reasoning"]
    summary: list[JsonValue] | None = None
    content: list[JsonValue] | None = None


class ResponsesOtherItem(OpenModel):
    """Any other item (web search, MCP, shell calls, compaction...): kept as it came, read
    as its type and JSON."""

    type: Annotated[str, Field(min_length=1), other_type(ITEM_TYPES)]


def _item_tag(value: Any) -> str | None:
    """An item's tag: its type, ``message`` for a typeless item with a role."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind is None and "role" in value:
        return "message"
    if not isinstance(kind, str):
        return None
    return kind if kind in ITEM_TYPES else "other"


ResponsesItem = TypeAliasType(
    "ResponsesItem",
    Annotated[
        Annotated[ResponsesMessageItem, Tag("message")]
        | Annotated[ResponsesFunctionCall, Tag("function_call")]
        | Annotated[ResponsesFunctionCallOutput, Tag("function_call_output")]
        | Annotated[ResponsesReasoning, Tag("reasoning")]
        | Annotated[ResponsesOtherItem, Tag("other")],
        Discriminator(_item_tag),
    ],
)


class ResponsesAppendBatch(WithUsage):
    """Items to append, in OpenAI's Responses format (what ``GET .../context?
    format=responses`` gives), under ``messages``. Consecutive function calls (parallel
    calls) are one assistant message, so a context gives them back as they came."""

    format: Literal["responses"]
    messages: list[ResponsesItem] = Field(min_length=1)


def responses_call_ids(sent: Sequence[Any]) -> Iterator[list[str]]:
    """The call ids of each run of consecutive function calls (one message's calls)."""
    run: list[str] = []
    for item in sent:
        if item.get("type") == "function_call":
            run.append(item["call_id"])
            continue
        yield run
        run = []
    yield run


__all__ = ["ResponsesAppendBatch", "ResponsesItem", "responses_call_ids"]
