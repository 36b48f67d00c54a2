"""An append in OpenAI's chat-completions format: the messages of ``chat.completions.create``
(and the message its response holds), with the rules :func:`Message.from_openai
<episodic.models.Message.from_openai>` applies stated per role. Keys episodic has no field
for are any JSON: the conversion keeps them in the message's ``native`` and gives them back."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Discriminator, Field, JsonValue, Tag
from typing_extensions import TypeAliasType

from episodic.server.fields import (
    Identifier,
    Name,
    OpenModel,
    ToolName,
    other_type,
    type_tag,
)
from episodic.server.schemas import WithUsage

#: content part types with a schema of their own
PART_TYPES = frozenset({"text", "image_url"})


class ChatTextPart(OpenModel):
    """Text (any other key makes it a part kept as it is)."""

    type: Literal["text"]
    text: str


class ChatImageUrl(OpenModel):
    """An image's URL (``data:`` URLs included) and the detail to see it at."""

    url: str
    detail: str | None = None


class ChatImagePart(OpenModel):
    """An image."""

    type: Literal["image_url"]
    image_url: ChatImageUrl


class ChatOtherPart(OpenModel):
    """Any other part (audio, a file...), kept as it is."""

    type: Annotated[str, Field(min_length=1), other_type(PART_TYPES)]


ChatContentPart = TypeAliasType(
    "ChatContentPart",
    Annotated[
        Annotated[ChatTextPart, Tag("text")]
        | Annotated[ChatImagePart, Tag("image_url")]
        | Annotated[ChatOtherPart, Tag("other")],
        Discriminator(type_tag(PART_TYPES)),
    ],
)
ChatContent: TypeAlias = str | list[ChatContentPart]


class ChatFunction(OpenModel):
    """The function a call calls: its name and its arguments (a JSON text, kept as sent)."""

    name: ToolName
    arguments: str | dict[str, JsonValue] = Field(default="", description="default ''")


class ChatToolCall(OpenModel):
    """A function call; ``id`` is what its tool message answers."""

    id: Identifier
    function: ChatFunction


NoChatToolCalls: TypeAlias = Annotated[
    list[ChatToolCall] | None, Field(max_length=0, description="only assistant messages call")
]


class ChatSystemMessage(OpenModel):
    """A system (or developer) message: text only. Kept in the log, never loaded."""

    role: Literal["system", "developer"]
    content: str
    name: Name | None = None
    tool_calls: NoChatToolCalls = None


class ChatUserMessage(OpenModel):
    """What the user said."""

    role: Literal["user"]
    content: ChatContent
    name: Name | None = None
    tool_calls: NoChatToolCalls = None


class ChatAssistantMessage(OpenModel):
    """What the model said: content, tool calls (ids unique in the message), or both;
    ``reasoning_content`` (DeepSeek, vLLM) as a string is its readable reasoning."""

    role: Literal["assistant"]
    content: ChatContent | None = None
    name: Name | None = None
    tool_calls: list[ChatToolCall] | None = None


class ChatToolMessage(OpenModel):
    """A tool's result: ``tool_call_id`` is the id of the open call it answers."""

    role: Literal["tool"]
    tool_call_id: Identifier
    content: ChatContent
    name: Name | None = None
    tool_calls: NoChatToolCalls = None


ChatMessage = TypeAliasType(
    "ChatMessage",
    Annotated[
        ChatSystemMessage | ChatUserMessage | ChatAssistantMessage | ChatToolMessage,
        Field(discriminator="role"),
    ],
)


class OpenAIAppendBatch(WithUsage):
    """Messages to append, in OpenAI's chat-completions format (what ``GET .../context?
    format=openai`` gives); each tool message takes its tool's name from its call."""

    format: Literal["openai"]
    messages: list[ChatMessage] = Field(min_length=1)


def openai_call_ids(sent: Sequence[Any]) -> Iterator[list[str]]:
    """The ids of each message's calls (which must be unique within it)."""
    for message in sent:
        yield [call["id"] for call in message.get("tool_calls") or ()]


__all__ = ["ChatMessage", "OpenAIAppendBatch", "openai_call_ids"]
