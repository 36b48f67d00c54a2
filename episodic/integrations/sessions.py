"""What every framework's session shares: the conversation a session id names, and its
creation by the first write.

A framework names its sessions with strings; episodic names conversations with UUIDs. Each
integration maps a session id to a UUID in its own namespace (two frameworks' sessions of the
same name are two conversations, since each keeps its own format in them), derived from the
tenant and the id, so every process finds the same conversation without a lookup.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

from pydantic import JsonValue

from episodic.context import boundary_messages
from episodic.errors import ConflictError, ErasedConversationError, NotFoundError
from episodic.models import Message, MessageEvent
from episodic.store import EpisodicStore
from episodic.view import in_view


def named_conversation_id(namespace: UUID, session_id: str, tenant_id: str) -> UUID:
    """The conversation ``session_id`` names for ``tenant_id`` in a framework's
    ``namespace``: the same id, the same conversation, in every process."""
    return uuid.uuid5(namespace, f"{tenant_id}\x00{session_id}")


async def create_session_conversation(
    store: EpisodicStore,
    conversation_id: UUID,
    *,
    metadata: Mapping[str, JsonValue],
    app_name: str | None = None,
    user_id: str | None = None,
) -> None:
    """Create the conversation a session's first write needs, unless a concurrent first
    write created it meanwhile. An erased session stays erased
    (:class:`ErasedConversationError`): a late write must not bring it back."""
    try:
        await store.create_conversation(
            conversation_id=conversation_id, metadata=metadata, app_name=app_name, user_id=user_id
        )
    except ErasedConversationError:
        raise
    except ConflictError:
        pass  # created meanwhile by a concurrent first write


@dataclass(frozen=True, slots=True)
class SessionView:
    """What a framework's session holds now: the latest boundary's messages (the handoff and
    retained user messages, or a framework's own compaction items), then every message in
    view after its cut, as they were appended (not composed for a model call: no pairing, no
    synthetic results, reasoning-only turns kept), with where the log stood when read."""

    messages: list[Message]
    #: the seq of the newest message in view (the boundary's cut when there is none after it)
    covers_through_seq: int
    boundary_seq: int | None
    last_seq: int


async def session_view(store: EpisodicStore, conversation_id: UUID) -> SessionView | None:
    """The conversation's :class:`SessionView`, in one read; None when it does not exist."""
    try:
        context, tail = await store.load_context_and_tail(conversation_id)
    except NotFoundError:
        return None
    boundary = context.boundary  # None after a clear, though the head keeps it
    messages: list[Message] = boundary_messages(boundary) if boundary is not None else []
    covers = boundary.covers_through_seq if boundary is not None else 0
    for event in in_view(tail):
        if isinstance(event, MessageEvent):
            messages.append(event.message)
            covers = event.seq
    return SessionView(messages, covers, context.boundary_seq, context.last_seq)


__all__ = ["SessionView", "create_session_conversation", "named_conversation_id", "session_view"]
