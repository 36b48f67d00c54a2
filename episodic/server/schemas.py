"""The HTTP API's request and response bodies (named schemas in /openapi.json). Messages,
heads and events are episodic's own models, so their documentation is the library's."""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from episodic.models import Conversation, Message, StoredEvent, Usage
from episodic.policy import EpisodicCompactionPressure

ContextFormat = Literal["episodic", "openai", "responses", "anthropic"]


class NewConversation(BaseModel):
    """A conversation to create; every field may be left out."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: UUID | None = Field(default=None, description="an id of yours (a UUID)")
    metadata: dict[str, Any] | None = Field(
        default=None, description="your data, and per-conversation compaction overrides"
    )


class ConversationHead(BaseModel):
    """A conversation's head and its compaction pressure (from the head row alone)."""

    conversation: Conversation
    pressure: EpisodicCompactionPressure


class ConversationPage(BaseModel):
    """Conversations, newest first. ``next_before`` is the cursor of the next page (None
    at the end)."""

    items: list[Conversation]
    next_before: UUID | None


class AppendBatch(BaseModel):
    """Messages to append atomically, in order. Send ``Idempotency-Key`` to make a retry
    harmless and ``If-Match`` (the head's ETag) to refuse a write behind another."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(min_length=1)
    usage: Usage | None = Field(
        default=None, description="the provider-reported usage of the call that made them"
    )


class Appended(BaseModel):
    """The stored events, with their seqs."""

    events: list[StoredEvent]
    last_seq: int


class EventPage(BaseModel):
    """Events with seq above ``after_seq``, oldest first; ``next_after_seq`` continues
    (None at the end)."""

    events: list[StoredEvent]
    next_after_seq: int | None


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
