"""The HTTP API's request and response bodies (named schemas in /openapi.json). Heads and
events are episodic's own models, so their documentation is the library's.

A message to append has a schema of its own per role (``NewUserMessage``...), chosen by its
``role``: together they state :class:`~episodic.models.Message`'s rules (a tool result needs
the id of the call it answers and content, only an assistant message carries tool calls...),
so a message the schema accepts is one the library takes. What no schema can say is checked
when appending: a result must answer an open call, ids must be unique.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator
from typing_extensions import TypeAliasType

from episodic.models import (
    MAX_TOKEN_COUNT,
    ClearEvent,
    Conversation,
    Message,
    MessageEvent,
    NativePayload,
    StoredEvent,
)
from episodic.policy import EpisodicCompactionPressure
from episodic.server.fields import (
    INTEGRAL,
    NO_NUL,
    DocumentValue,
    Identifier,
    Integer,
    Name,
    RequestModel,
    ToolName,
    storable_numbers,
)
from episodic.store.checks import MAX_EXACT_JSON_INT
from episodic.store.due import MAX_THRESHOLD

ContextFormat = Literal["episodic", "openai", "responses", "anthropic"]
#: a message's fields the store sets: a message read back may be sent as it is, without them
STORE_SET_FIELDS = ("seq", "created_at", "token_estimate")

Threshold: TypeAlias = Annotated[int, Field(ge=0, le=MAX_THRESHOLD, strict=True), INTEGRAL]
TokenCount: TypeAlias = Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT), INTEGRAL]


class CompactionOverrides(RequestModel):
    """This conversation's own compaction triggers, in place of the server's (a model with a
    smaller window wants a smaller ``trigger_context_tokens``); null or absent: the server's."""

    trigger_context_tokens: Threshold | None = None
    trigger_unfinished_turns: Threshold | None = None
    trigger_age_days: Threshold | None = None
    trigger_age_turn_count: Threshold | None = None


def _document_schema(schema: dict[str, Any]) -> None:
    """The metadata's schema: a document (keys and text without NUL), whose ``compaction``,
    when there is one, is overrides or null. Said with ``dependentSchemas``, not as a
    property beside ``additionalProperties``: a TypeScript generator makes that an index
    signature its request types cannot take (openapi-fetch reads it as ``never``)."""
    compaction = schema.pop("properties", {}).get("compaction", {})
    compaction.pop("default", None)
    schema["propertyNames"] = {"pattern": NO_NUL}
    schema["dependentSchemas"] = {"compaction": {"properties": {"compaction": compaction}}}


class ConversationMetadata(BaseModel):
    """Your data about the conversation, any JSON object (stored as a document, which holds
    no NUL character), and in ``compaction`` its own compaction triggers."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_document_schema)
    __pydantic_extra__: dict[str, DocumentValue] = Field(init=False)

    compaction: CompactionOverrides | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys_hold_no_nul(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(isinstance(k, str) and "\x00" in k for k in data):
            raise ValueError("a metadata key holds a NUL character, which no document stores")
        return data


class NewConversation(RequestModel):
    """A conversation to create; every field may be left out."""

    conversation_id: UUID | None = Field(default=None, description="an id of yours (a UUID)")
    metadata: ConversationMetadata | None = Field(
        default=None, description="your data, and per-conversation compaction overrides"
    )

    def metadata_document(self) -> dict[str, Any] | None:
        """The metadata as sent (overrides left out stay out), each integer beyond 64 bits
        the nearest float (the store keeps no larger)."""
        if self.metadata is None:
            return None
        document: dict[str, Any] = storable_numbers(
            self.metadata.model_dump(mode="python", exclude_unset=True)
        )
        return document


# ---- messages to append, in episodic's format ------------------------------------------


class NewTextBlock(RequestModel):
    """A run of text."""

    type: Literal["text"]
    text: str


class NewImageBlock(RequestModel):
    """An image, by URL (``data:`` URLs included); ``alt`` is what a summarizer reads."""

    type: Literal["image"]
    url: str
    detail: str | None = None
    alt: str | None = None


class NewRawBlock(RequestModel):
    """A provider's block episodic has no model for, kept as it is."""

    type: Literal["raw"]
    data: dict[str, JsonValue]


NewContentBlock = TypeAliasType(
    "NewContentBlock",
    Annotated[NewTextBlock | NewImageBlock | NewRawBlock, Field(discriminator="type")],
)
NewContent: TypeAlias = str | list[NewContentBlock]


class NewToolCall(RequestModel):
    """A call the assistant asks a tool to make; ``id`` is what its result answers."""

    id: Identifier
    name: ToolName
    args: dict[str, JsonValue] = Field(default_factory=dict, description="default {}")
    arguments_json: str | None = Field(
        default=None, description="the provider's exact argument text, when not args' JSON"
    )


NoToolCalls: TypeAlias = Annotated[
    list[NewToolCall], Field(max_length=0, description="only an assistant message has calls")
]


class _NewMessage(RequestModel):
    """The fields every role has. (Only a tool result has a ``tool_call_id``: a message of
    another role with one, even null, is refused.)"""

    name: Name | None = None
    reasoning: str | None = Field(default=None, description="readable private reasoning")
    native: NativePayload | None = Field(
        default=None, description="the provider's own form of the message, kept as it is"
    )
    metadata: dict[str, JsonValue] = Field(default_factory=dict, description="your data")
    client_id: Identifier | None = Field(
        default=None,
        description="your id for the message, unique in the conversation: a retried append "
        "with it stores it once",
    )
    seq: Integer | None = Field(
        default=None,
        description="set by the store: ignored here (a message read back may be sent as is)",
    )
    created_at: str | None = Field(
        default=None,
        description="set by the store: ignored here (a message read back may be sent as is)",
    )
    token_estimate: Integer | None = Field(
        default=None,
        description="set by the store: ignored here (a message read back may be sent as is)",
    )


class NewUserMessage(_NewMessage):
    """What the user said."""

    role: Literal["user"]
    content: NewContent
    tool_calls: NoToolCalls = Field(default_factory=list)
    is_error: Literal[False] = False
    pinned: bool = Field(
        default=False,
        description="a standing instruction: every later handoff carries it word for word, "
        "until it is unpinned (POST .../unpin)",
    )


class NewSystemMessage(_NewMessage):
    """A system message: kept in the log, never loaded into a context (the agent sends its
    own system prompt with each call)."""

    role: Literal["system"]
    content: str
    tool_calls: NoToolCalls = Field(default_factory=list)
    is_error: Literal[False] = False
    pinned: Literal[False] = Field(default=False, description="only a user message is pinned")


class NewAssistantMessage(_NewMessage):
    """What the model said: text, tool calls, or both."""

    role: Literal["assistant"]
    content: NewContent | None = None
    tool_calls: list[NewToolCall] = Field(
        default_factory=list, description="ids unique in the message, and among open calls"
    )
    is_error: Literal[False] = False
    pinned: Literal[False] = Field(default=False, description="only a user message is pinned")


class NewToolMessage(_NewMessage):
    """A tool's result: ``tool_call_id`` is the id of the open call it answers."""

    role: Literal["tool"]
    tool_call_id: Identifier
    content: NewContent = Field(description="the result ('' for an empty one)")
    is_error: bool = Field(default=False, description="the call failed")
    tool_calls: NoToolCalls = Field(default_factory=list)
    pinned: Literal[False] = Field(default=False, description="only a user message is pinned")


NewMessage = TypeAliasType(
    "NewMessage",
    Annotated[
        NewUserMessage | NewAssistantMessage | NewToolMessage | NewSystemMessage,
        Field(discriminator="role"),
    ],
)


def message_from_episodic(sent: dict[str, Any]) -> Message:
    """The message a ``NewMessage`` sent as ``sent`` (its JSON, already valid) stands for:
    the fields the store sets are left out."""
    return Message.model_validate({k: v for k, v in sent.items() if k not in STORE_SET_FIELDS})


class ConversationHead(BaseModel):
    """A conversation's head and its compaction pressure (from the head row alone)."""

    conversation: Conversation
    pressure: EpisodicCompactionPressure


class ConversationPage(BaseModel):
    """Conversations, newest first. ``next_before`` is the cursor of the next page (None
    at the end)."""

    items: list[Conversation]
    next_before: UUID | None


class NewUsage(RequestModel):
    """Token usage a provider reported for the model call that made the messages."""

    input_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    cache_read_tokens: TokenCount = 0
    reasoning_tokens: TokenCount = 0


class WithUsage(RequestModel):
    """What every format's batch of messages may carry besides its messages."""

    usage: NewUsage | None = Field(
        default=None, description="the provider-reported usage of the call that made them"
    )


class AppendBatch(WithUsage):
    """Messages to append atomically, in order, in episodic's own format (``format`` may be
    left out). Send ``Idempotency-Key`` to make a retry harmless and ``If-Match`` (the
    head's ETag) to refuse a write behind another."""

    format: Literal["episodic"] = "episodic"
    messages: list[NewMessage] = Field(min_length=1)


class Unpin(RequestModel):
    """Which pinned user message stops being a standing instruction."""

    seq: Integer = Field(
        ge=1, le=MAX_EXACT_JSON_INT, description="the seq of a user message appended with pinned"
    )


class Appended(BaseModel):
    """The stored events, with their seqs."""

    events: list[StoredEvent]
    last_seq: int


class Retracted(BaseModel):
    """The message taken back (its retraction is in the log); null when none was in view."""

    retracted: MessageEvent | None


class Cleared(BaseModel):
    """The clear appended; null when the view was already empty (nothing was written)."""

    cleared: ClearEvent | None


class SessionView(BaseModel):
    """What a framework's session holds: the latest boundary's messages, then every message
    in view after its cut as it was appended (not composed for a model call: no pairing,
    no synthetic results, reasoning-only turns kept). ``covers_through_seq`` is the newest
    message in view (the boundary's cut when there is none after it)."""

    conversation_id: UUID
    messages: list[Message]
    covers_through_seq: int
    boundary_seq: int | None
    last_seq: int


class EventPage(BaseModel):
    """Events with seq above ``after_seq``, oldest first; ``next_after_seq`` continues
    (None at the end)."""

    events: list[StoredEvent]
    next_after_seq: int | None


class SearchResults(BaseModel):
    """The conversation's messages holding the query's words, best first (each word weighed
    by how rare it is in the conversation), then the newest; their seqs say where they stand
    in the log."""

    conversation_id: UUID
    query: str
    events: list[MessageEvent]


class LoadedContext(BaseModel):
    """What the next model call should see: the handoff summary and retained user messages
    of the latest boundary, then everything after it, in the format asked for."""

    conversation_id: UUID
    format: ContextFormat
    messages: list[Any] = Field(description="messages in the format asked for")
    estimated_tokens: int
    last_seq: int
    boundary_seq: int | None


class ErasureRequest(BaseModel):
    """Why the conversation is erased (recorded in its tombstone)."""

    model_config = ConfigDict(extra="forbid")

    #: no NUL: the tombstone's text column cannot hold it (the store refuses it; the pattern
    #: says so in the schema)
    reason: str = Field(min_length=1, max_length=2_000, pattern=r"^[^\x00]*$")


class Health(BaseModel):
    """The process (``/healthz``) or the database (``/readyz``)."""

    status: Literal["ok"]


class CompactionRun(BaseModel):
    """What a "compact now" did: its outcome (``succeeded``, ``fallback``,
    ``nothing_to_compact``, ``failed``...), the context's tokens before and after, and the
    error of a failed attempt. Recorded like every attempt (``GET /v1/compaction``)."""

    outcome: str
    tokens_before: int | None
    tokens_after: int | None
    error: str | None
    seconds: float
