"""A context as the log holds it, for an answer in episodic's own JSON.

:meth:`EpisodicStore.load_context` makes a model of every message it loads. A server that
answers ``GET .../context?format=episodic`` would only serialize those models back into the
JSON the log already holds, so :meth:`EpisodicStore.load_stored_context` composes the same
context (the same rules: :func:`episodic.context.compose_messages`) from
:class:`~episodic.store.codec.StoredMessage` views and leaves the JSON to
:meth:`StoredContext.messages_json`. Parsed, that JSON equals the model's dump without
nulls (tests/integration/test_stored_context.py)."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from episodic.models import Message
from episodic.store.codec import MESSAGE_ADAPTER, StoredMessage


@dataclass(frozen=True, slots=True)
class StoredContext:
    """:class:`~episodic.context.Context`'s fields, its messages stored views where they came
    from the log as they are (models where composing made them: the handoff, the retained
    user messages, a synthetic result)."""

    conversation_id: UUID
    messages: list[StoredMessage | Message]
    estimated_tokens: int
    last_seq: int
    boundary_seq: int | None

    def messages_json(self) -> bytes:
        """The messages as a JSON array, each as :class:`Message` dumps it without nulls."""
        # one str joined and encoded once: 200 small encodes cost more than the join
        return (
            "["
            + ",".join(
                message.episodic_json()
                if isinstance(message, StoredMessage)
                else MESSAGE_ADAPTER.dump_json(message, exclude_none=True).decode()
                for message in self.messages
            )
            + "]"
        ).encode()


__all__ = ["StoredContext"]
