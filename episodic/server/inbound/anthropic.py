"""An append in the Anthropic Messages API's format: ``messages.create``'s turns (and the
assistant turn a response holds), with the rules :func:`messages_from_anthropic
<episodic.formats.anthropic.messages_from_anthropic>` applies stated per role and block. A
user turn's ``tool_result`` blocks become tool messages, the rest of it a user message."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Discriminator, Field, JsonValue, Tag
from typing_extensions import TypeAliasType

from episodic.formats.anthropic import (
    ASSISTANT_ONLY_BLOCKS,
    MAX_TOOL_ID_LENGTH,
    USER_ONLY_BLOCKS,
)
from episodic.server.fields import OpenModel, ToolName, other_type, type_tag
from episodic.server.schemas import WithUsage

#: a ``tool_use`` id as the API takes it
ToolUseId: TypeAlias = Annotated[
    str, Field(min_length=1, max_length=MAX_TOOL_ID_LENGTH, pattern=r"^[A-Za-z0-9_-]+$")
]
#: the block types a user turn's blocks are told apart by (an assistant's are refused)
USER_BLOCK_TYPES = USER_ONLY_BLOCKS | ASSISTANT_ONLY_BLOCKS
#: the block types an assistant turn's blocks are told apart by (a result is refused);
#: ``redacted_thinking`` is one of its other blocks
ASSISTANT_BLOCK_TYPES = USER_ONLY_BLOCKS | frozenset({"tool_use", "thinking"})


class AnthropicBlock(OpenModel):
    """A block inside a tool result: text and images are read, any other kept as it is."""

    type: str


class AnthropicToolUse(OpenModel):
    """A tool call; ``id`` is what its result answers."""

    type: Literal["tool_use"]
    id: ToolUseId
    name: ToolName
    input: dict[str, JsonValue]


class AnthropicThinking(OpenModel):
    """Readable reasoning (its signature is kept with the message)."""

    type: Literal["thinking"]
    thinking: str


class AnthropicToolResult(OpenModel):
    """A tool's result: ``tool_use_id`` is the id of the open call it answers."""

    type: Literal["tool_result"]
    tool_use_id: ToolUseId
    content: str | list[AnthropicBlock] = Field(default="", description="default ''")
    is_error: bool | None = None


class AnthropicUserOtherBlock(OpenModel):
    """Text, an image, a document...: the user message's content."""

    type: Annotated[str, Field(min_length=1), other_type(USER_BLOCK_TYPES)]


class AnthropicAssistantOtherBlock(OpenModel):
    """Text, a server tool's use or result, redacted thinking...: the assistant message's
    content (redacted thinking is kept with the message, not shown)."""

    type: Annotated[str, Field(min_length=1), other_type(ASSISTANT_BLOCK_TYPES)]


AnthropicUserBlock = TypeAliasType(
    "AnthropicUserBlock",
    Annotated[
        Annotated[AnthropicToolResult, Tag("tool_result")]
        | Annotated[AnthropicUserOtherBlock, Tag("other")],
        Discriminator(type_tag(USER_BLOCK_TYPES)),
    ],
)
AnthropicAssistantBlock = TypeAliasType(
    "AnthropicAssistantBlock",
    Annotated[
        Annotated[AnthropicToolUse, Tag("tool_use")]
        | Annotated[AnthropicThinking, Tag("thinking")]
        | Annotated[AnthropicAssistantOtherBlock, Tag("other")],
        Discriminator(type_tag(ASSISTANT_BLOCK_TYPES)),
    ],
)


class AnthropicUserTurn(OpenModel):
    """A user turn: its results first (each a tool message), then what the user said."""

    role: Literal["user"]
    content: str | Annotated[list[AnthropicUserBlock], Field(min_length=1)]


class AnthropicAssistantTurn(OpenModel):
    """An assistant turn: one assistant message (``tool_use`` ids unique in it)."""

    role: Literal["assistant"]
    content: str | Annotated[list[AnthropicAssistantBlock], Field(min_length=1)]


AnthropicTurn = TypeAliasType(
    "AnthropicTurn",
    Annotated[AnthropicUserTurn | AnthropicAssistantTurn, Field(discriminator="role")],
)


class AnthropicAppendBatch(WithUsage):
    """Turns to append, in the Anthropic Messages API's format (what ``GET .../context?
    format=anthropic`` gives). A turn's keys other than role and content are not kept."""

    format: Literal["anthropic"]
    messages: list[AnthropicTurn] = Field(min_length=1)


def anthropic_call_ids(sent: Sequence[Any]) -> Iterator[list[str]]:
    """The ``tool_use`` ids of each assistant turn (one message's calls)."""
    for turn in sent:
        blocks = turn["content"] if isinstance(turn["content"], list) else ()
        yield [block["id"] for block in blocks if block.get("type") == "tool_use"]


__all__ = [
    "AnthropicAppendBatch",
    "AnthropicTurn",
    "anthropic_call_ids",
]
