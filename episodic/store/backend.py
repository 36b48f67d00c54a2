"""What the store asks of a database backend. ``postgres.py`` and ``sqlite.py`` implement it;
everything dialect-specific lives in those two modules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol
from uuid import UUID

from episodic.models import Conversation, StoredEvent
from episodic.store.batch import PreparedBatch

Outcome = Literal[
    "appended",
    "replayed",
    "not_found",
    "conflict",
    "idempotency_mismatch",
    "client_id_reused",
    "duplicate_tool_call",
    "orphan",
    "orphan_abandoned",
]


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What a write reported. ``seq`` is the first seq written (or replayed, or the actual
    last seq on a conflict); ``detail`` names the offending id on a refusal."""

    outcome: Outcome
    seq: int | None = None
    created_at: datetime | None = None
    detail: str | None = None


class Backend(Protocol):
    dialect: str

    async def migrate(self) -> None: ...

    async def create_conversation(
        self, conversation_id: UUID, tenant_id: str, metadata: dict[str, Any], created_at: datetime
    ) -> bool:
        """Insert the head row; False when the id is taken."""
        ...

    async def append(
        self, conversation_id: UUID, batch: PreparedBatch, expected_seq: int | None
    ) -> WriteOutcome: ...

    async def mark_run_completed(
        self, conversation_id: UUID, tokens_per_abandoned: int
    ) -> WriteOutcome: ...

    async def read_events(
        self, conversation_id: UUID, after_seq: int, limit: int
    ) -> list[StoredEvent]: ...

    async def get_conversation(self, conversation_id: UUID) -> Conversation | None: ...

    async def close(self) -> None: ...


__all__ = ["Backend", "Outcome", "WriteOutcome"]
