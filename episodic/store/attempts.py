"""The compaction worker's side of the head: claims, leases and the attempts ledger."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import ConfigDict

from episodic.models import EpisodicModel

AttemptOutcome = Literal[
    "succeeded",
    "fallback",
    "failed",
    "dead",
    "nothing_to_compact",
    "conflict",
    "released",
    "lease_lost",
    # the conversation was deleted or erased while the worker held it: nothing was written
    "gone",
]


@dataclass(frozen=True, slots=True)
class Claim:
    """A conversation a worker holds the compaction lease on."""

    conversation_id: UUID
    tenant_id: str
    lease_token: UUID
    lease_expires_at: datetime
    attempt: int
    reason: str
    boundary_seq: int | None
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One row of ``episodic_compaction_attempts``: written once, when the attempt ends."""

    conversation_id: UUID
    attempt_id: UUID
    tenant_id: str
    worker: str
    reason: str
    outcome: AttemptOutcome
    started_at: datetime
    finished_at: datetime
    error: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    boundary_seq: int | None = None

    def with_boundary(self, seq: int, tokens_after: int | None) -> AttemptRecord:
        return replace(self, boundary_seq=seq, tokens_after=tokens_after)

    def row(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "attempt_id": self.attempt_id,
            "tenant_id": self.tenant_id,
            "worker": self.worker,
            "reason": self.reason,
            "outcome": self.outcome,
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "usage": self.usage,
            "model": self.model,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "boundary_seq": self.boundary_seq,
        }


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How an attempt that wrote no boundary leaves the conversation.

    ``retry_in`` seconds until the next try (with the due state kept); ``dead`` stops
    retrying; ``clear_due`` ends the due state without a boundary (nothing to compact).
    """

    retry_in: float = 0.0
    dead: bool = False
    clear_due: bool = False


QueueState = Literal["dead", "leased", "failing", "due"]
#: The order ``episodic status`` lists them in: what needs a person first.
QUEUE_STATES: tuple[QueueState, ...] = ("dead", "leased", "failing", "due")


class CompactionQueueEntry(EpisodicModel):
    """A conversation the compaction queue holds: due, leased by a worker, failing (due
    again after an error) or dead (out of attempts; ``episodic compact`` revives it)."""

    model_config = ConfigDict(frozen=True)

    conversation_id: UUID
    tenant_id: str
    state: QueueState
    reason: str | None
    attempts: int
    last_error: str | None
    next_attempt_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None


class StoreLayout(EpisodicModel):
    """Where the store's rows live: one database, or distributed by Citus over ``nodes``
    nodes (the coordinator and its workers) in ``shards`` shards per table."""

    model_config = ConfigDict(frozen=True)

    distributed: bool = False
    nodes: int = 1
    shards: int = 0

    def describe(self) -> str:
        if not self.distributed:
            return "one database (not distributed)"
        return f"distributed by Citus over {self.nodes} nodes, {self.shards} shards per table"


class CompactionStatus(EpisodicModel):
    """What ``episodic status`` shows: counts, the conversations behind them (dead first, at
    most the limit asked for), and the latest attempts."""

    model_config = ConfigDict(frozen=True)

    due: int
    leased: int
    failing: int
    dead: int
    conversations: list[CompactionQueueEntry]
    recent_attempts: list[dict[str, Any]]
    layout: StoreLayout = StoreLayout()


__all__ = [
    "QUEUE_STATES",
    "AttemptEnd",
    "AttemptOutcome",
    "AttemptRecord",
    "Claim",
    "CompactionQueueEntry",
    "CompactionStatus",
    "QueueState",
    "StoreLayout",
]
