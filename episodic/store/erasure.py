"""What an erasure leaves behind: its tombstone in ``episodic_erasures``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import ConfigDict

from episodic.models import EpisodicModel
from episodic.store.checks import check_text
from episodic.store.codec import utc

#: The longest reason an erasure records.
MAX_REASON_LENGTH = 2_000


class Erasure(EpisodicModel):
    """A tombstone: what an erasure removed, why, when and by which database role. Never
    what the conversation said.

    ``conversation_id`` is None for a tenant's tombstone (:meth:`EpisodicStore.erase_tenant`),
    whose counts are the totals of the conversations it erased, plus its shared state."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    erasure_id: UUID
    tenant_id: str
    conversation_id: UUID | None
    #: when the erased conversation had been created
    conversation_created_at: datetime | None
    reason: str
    conversations: int
    events: int
    compaction_attempts: int
    shared_states: int
    erased_at: datetime
    #: the database role that erased (SQLite: "sqlite", which has no roles)
    erased_by: str


def check_reason(reason: object) -> str:
    """A reason an erasure can record: required, one to 2,000 characters."""
    return check_text(reason, field="reason", max_length=MAX_REASON_LENGTH)


def erasure_from_row(row: Mapping[str, Any]) -> Erasure:
    """An ``episodic_erasures`` row as a model."""
    created = row["conversation_created_at"]
    return Erasure(
        erasure_id=row["erasure_id"],
        tenant_id=row["tenant_id"],
        conversation_id=row["conversation_id"],
        conversation_created_at=utc(created) if created is not None else None,
        reason=row["reason"],
        conversations=row["conversations"],
        events=row["events"],
        compaction_attempts=row["compaction_attempts"],
        shared_states=row["shared_states"],
        erased_at=utc(row["erased_at"]),
        erased_by=row["erased_by"],
    )


__all__ = ["MAX_REASON_LENGTH", "Erasure", "check_reason", "erasure_from_row"]
