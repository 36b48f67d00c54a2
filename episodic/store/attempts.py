"""The compaction worker's side of the head: claims, leases, the queue and the attempts ledger.

The values the worker and ``episodic status`` see, and the pure rules the queue runs on, each
the Python twin of the SQL that decides the same on PostgreSQL (``postgres/schema.sql``,
``postgres/queries.py``). The SQLite backend asks these functions; tests/contract/test_twins.py
runs both sides on the same generated heads and compares them.

- :func:`claimable`: ``episodic_claim``'s predicate (written twice there: the pick of
  candidates and the re-check of each under its row lock);
- :func:`claim_columns`: ``episodic_claim``'s ``UPDATE ... SET``;
- :func:`claimable_by_hand`, :func:`claim_conversation_columns`:
  ``episodic_claim_conversation``'s ``WHERE`` and ``SET``;
- :func:`end_attempt_columns`, :func:`end_attempt_outcome`: ``episodic_end_attempt``'s
  ``SET`` and what it records;
- :func:`in_queue`, :func:`queue_state`, :func:`queue_order`: ``queries.QUEUE``'s ``WHERE``,
  state ``CASE`` and ``ORDER BY``; :func:`queue_counts`: ``queries.QUEUE_COUNTS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from pydantic import ConfigDict

from episodic.models import EpisodicModel
from episodic.store.codec import utc

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
#: The order ``episodic status`` lists them in: what needs a person first (the ARRAY in
#: ``queries.QUEUE``'s ORDER BY).
QUEUE_STATES: tuple[QueueState, ...] = ("dead", "leased", "failing", "due")


# ---- the queue's rules: pure twins of the SQL ------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueHead:
    """The columns of a head the compaction queue decides on, timestamps in UTC."""

    conversation_id: UUID
    due_since: datetime | None = None
    dead_since: datetime | None = None
    deleted_at: datetime | None = None
    next_attempt_at: datetime | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    compaction_attempts: int = 0

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> QueueHead:
        """From a head row (a mapping of its columns); SQLite's naive timestamps are UTC."""

        def when(name: str) -> datetime | None:
            value = row[name]
            return utc(value) if value is not None else None

        return cls(
            conversation_id=row["conversation_id"],
            due_since=when("due_since"),
            dead_since=when("dead_since"),
            deleted_at=when("deleted_at"),
            next_attempt_at=when("next_attempt_at"),
            lease_expires_at=when("lease_expires_at"),
            last_error=row["last_error"],
            compaction_attempts=row["compaction_attempts"],
        )


def lease_free(head: QueueHead, now: datetime) -> bool:
    """Whether no worker holds the conversation's lease at ``now``: none was taken, or it has
    expired. Twin of ``(c.lease_expires_at IS NULL OR c.lease_expires_at <= now())``, part of
    the predicates of ``episodic_claim`` and ``episodic_claim_conversation``."""
    return head.lease_expires_at is None or head.lease_expires_at <= now


def claimable(head: QueueHead, now: datetime) -> bool:
    """Whether a worker's claim takes the conversation at ``now``: due, not dead, not
    deleted, its next attempt's time come, and no lease held on it. Twin of the predicate
    ``episodic_claim`` (postgres/schema.sql) writes twice, in its pick of candidates and in
    its re-check of each under the row lock; claims take the claimable in ``next_attempt_at``
    order. (The scope's tenant filter is the backend's, as every read's.)"""
    return (
        head.due_since is not None
        and head.dead_since is None
        and head.deleted_at is None
        and head.next_attempt_at is not None
        and head.next_attempt_at <= now
        and lease_free(head, now)
    )


def claim_columns(
    head: QueueHead, *, owner: str, token: UUID, lease_seconds: float, now: datetime
) -> dict[str, Any]:
    """The head columns a claim writes: ``owner``'s lease (``token``, until ``lease_seconds``
    after ``now``) and one more attempt counted. Twin of the ``UPDATE ... SET`` of
    ``episodic_claim`` (and the lease part of ``episodic_claim_conversation``'s)."""
    return {
        "lease_owner": owner,
        "lease_token": token,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "compaction_attempts": head.compaction_attempts + 1,
    }


def claimable_by_hand(head: QueueHead, now: datetime) -> bool:
    """Whether an operator's claim (``episodic compact ID``) takes the conversation at
    ``now``, due or not, dead or not: not deleted, and no lease held on it. Twin of the
    ``WHERE`` of ``episodic_claim_conversation``."""
    return head.deleted_at is None and lease_free(head, now)


def claim_conversation_columns(
    head: QueueHead,
    *,
    owner: str,
    token: UUID,
    lease_seconds: float,
    reason: str,
    now: datetime,
) -> dict[str, Any]:
    """The head columns an operator's claim writes: a claim's (:func:`claim_columns`), and
    the conversation made due for ``reason`` (since the earlier of when it became due and
    ``now``), to be tried now, and alive again. Twin of the ``UPDATE ... SET`` of
    ``episodic_claim_conversation`` (``due_since = LEAST(c.due_since, now)``: LEAST skips a
    NULL)."""
    due_since = now if head.due_since is None else min(head.due_since, now)
    return {
        **claim_columns(head, owner=owner, token=token, lease_seconds=lease_seconds, now=now),
        "due_since": due_since,
        "due_reason": reason,
        "next_attempt_at": now,
        "dead_since": None,
    }


def end_attempt_columns(end: AttemptEnd, *, error: str | None, now: datetime) -> dict[str, Any]:
    """The head columns ending an attempt that wrote no boundary writes, while the ending
    worker still holds the lease: the lease released, the attempt's error kept, and then as
    ``end`` says: the due state cleared (``clear_due``) or the next try ``retry_in`` seconds
    after ``now``, and dead since ``now`` (``dead``; a dead conversation stays dead). A column
    left out keeps its value. Twin of ``episodic_end_attempt``'s ``UPDATE ... SET``."""
    columns: dict[str, Any] = {
        "lease_owner": None,
        "lease_token": None,
        "lease_expires_at": None,
        "last_error": error,
    }
    if end.clear_due:
        columns.update(due_since=None, due_reason=None, compaction_attempts=0, next_attempt_at=None)
    else:
        columns["next_attempt_at"] = now + timedelta(seconds=end.retry_in)
    if end.dead:
        columns["dead_since"] = now
    return columns


def end_attempt_outcome(outcome: AttemptOutcome, *, found: bool, held: bool) -> AttemptOutcome:
    """What ending an attempt records and answers: ``gone`` when the conversation is not
    there any more (erased meanwhile: no attempt row outlives it), ``lease_lost`` when
    another worker holds the lease now (the head is left alone), else the worker's
    ``outcome``. Twin of ``episodic_end_attempt``'s ``RETURN 'gone'`` and of the outcome its
    INSERT into the ledger records."""
    if not found:
        return "gone"
    return outcome if held else "lease_lost"


def leased(head: QueueHead, now: datetime) -> bool:
    """Whether a worker's lease on the conversation runs past ``now`` (``lease_expires_at >
    now()`` in ``queries.QUEUE`` and ``queries.QUEUE_COUNTS``)."""
    return head.lease_expires_at is not None and head.lease_expires_at > now


def in_queue(head: QueueHead, now: datetime) -> bool:
    """Whether ``episodic status`` lists the conversation: due, dead or leased. Twin of
    ``queries.QUEUE``'s ``WHERE``."""
    return head.due_since is not None or head.dead_since is not None or leased(head, now)


def queue_state(head: QueueHead, now: datetime) -> QueueState:
    """The state ``episodic status`` shows a conversation of the queue in: dead, else leased,
    else failing (an error on record), else due. Twin of ``queries.QUEUE``'s ``CASE``."""
    if head.dead_since is not None:
        return "dead"
    if leased(head, now):
        return "leased"
    if head.last_error is not None:
        return "failing"
    return "due"


def queue_order(head: QueueHead, now: datetime) -> tuple[int, bool, datetime, str]:
    """The sort key of the queue's listing: by state (:data:`QUEUE_STATES`, what needs a
    person first), then by next attempt (none last), then by id. Twin of ``queries.QUEUE``'s
    ``ORDER BY`` (a uuid sorts as its text does)."""
    when = head.next_attempt_at
    return (
        QUEUE_STATES.index(queue_state(head, now)),
        when is None,
        when or datetime.max.replace(tzinfo=UTC),
        str(head.conversation_id),
    )


def queue_counts(heads: Iterable[QueueHead], now: datetime) -> dict[QueueState, int]:
    """The counts ``episodic status`` shows, which may overlap (a dead conversation can
    still be leased): due (and not dead), leased, failing (due with an error on record) and
    dead. Twin of ``queries.QUEUE_COUNTS``. Only heads :func:`in_queue` count at all."""
    counts: dict[QueueState, int] = {"due": 0, "leased": 0, "failing": 0, "dead": 0}
    for head in heads:
        due = head.due_since is not None and head.dead_since is None
        counts["due"] += due
        counts["leased"] += leased(head, now)
        counts["failing"] += due and head.last_error is not None
        counts["dead"] += head.dead_since is not None
    return counts


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
    "QueueHead",
    "QueueState",
    "StoreLayout",
    "claim_columns",
    "claim_conversation_columns",
    "claimable",
    "claimable_by_hand",
    "end_attempt_columns",
    "end_attempt_outcome",
    "in_queue",
    "lease_free",
    "leased",
    "queue_counts",
    "queue_order",
    "queue_state",
]
