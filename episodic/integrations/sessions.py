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
from uuid import UUID

from pydantic import JsonValue

from episodic.errors import ConflictError, ErasedConversationError
from episodic.store import EpisodicStore


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


__all__ = ["create_session_conversation", "named_conversation_id"]
