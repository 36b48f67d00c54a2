"""What the store asks of a database backend. ``postgres.py`` and ``sqlite.py`` implement it;
everything dialect-specific lives in those two modules."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol
from uuid import UUID

from episodic.models import (
    ClearEvent,
    Conversation,
    DeletionEvent,
    MessageEvent,
    RetractionEvent,
    StoredEvent,
    UsageEvent,
)
from episodic.policy import EpisodicCompactionConfig
from episodic.store.attempts import (
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    Claim,
    CompactionStatus,
)
from episodic.store.batch import PreparedBatch
from episodic.store.boundaries import BoundaryWrite
from episodic.store.codec import Tail
from episodic.store.erasure import Erasure
from episodic.store.export_format import ConversationHeader, EventRow, HeadImage, SharedStateRow
from episodic.store.migrate import SchemaMigration
from episodic.store.projection import HeadCounters, HeadState
from episodic.store.rules import Outcome, WriteOutcome
from episodic.store.state import StateSnapshot

Closer = Callable[[], Awaitable[None]]
#: What creating a conversation came to: made, its id taken by one that exists, or by one
#: that was erased (refused unless the caller reuses erased ids).
CreateOutcome = Literal["created", "taken", "erased"]
PlanBoundary = Callable[[HeadState, list[StoredEvent], datetime], BoundaryWrite]


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    """A retraction or a clear, planned in Python from the head and the tail
    (store/planned_events.py) and written only if the head is still the one it was planned
    on."""

    event: RetractionEvent | ClearEvent | UsageEvent | DeletionEvent
    payload: str
    #: the head's counters once it is stored
    counters: HeadCounters
    #: the message a retraction takes back
    retracted: MessageEvent | None = None
    #: when the current context began, for a clear (the age rule measures from it)
    context_since: datetime | None = None


#: The plan: from the head, the events after its cut and the database's now, the event to
#: write, or None when there is nothing to write.
PlanEvent = Callable[[HeadState, list[StoredEvent], datetime], PlannedEvent | None]


@dataclass(frozen=True, slots=True)
class BoundaryPlanner:
    """A boundary write as the backend sees it: the cut whose tail it reads, the plan that
    decides the write from the head and that tail (store/boundaries.py), and the worker's
    attempt to record with it (None outside the worker)."""

    covers_through_seq: int
    plan: PlanBoundary
    attempt: AttemptRecord | None = None


class ImportSink(Protocol):
    """Where an import writes one conversation, inside the transaction that created its head:
    its events and attempts in pages, then the head rebuilt from them. Nothing is kept
    unless ``finish`` is reached and the transaction commits."""

    async def add_events(self, rows: Sequence[EventRow]) -> None: ...

    async def add_attempts(self, records: Sequence[AttemptRecord]) -> None: ...

    async def finish(self, head: HeadImage, touched_at: float | None) -> None: ...


class Backend(Protocol):
    dialect: str
    #: the tenant every operation is scoped to; None for an unscoped backend
    tenant: str | None

    @property
    def location(self) -> str:
        """The database's URL with its password masked, for messages."""
        ...

    def for_tenant(self, tenant: str) -> Backend:
        """The same connections, every operation scoped to ``tenant``: another tenant's
        conversations are not found, and writes to them are refused."""
        ...

    async def migrate(self) -> SchemaMigration: ...

    async def schema_revision(self) -> str | None:
        """The schema's Alembic revision; None when there is no episodic schema."""
        ...

    async def create_conversation(
        self,
        conversation_id: UUID,
        tenant_id: str,
        metadata: dict[str, Any],
        created_at: datetime,
        *,
        listed: tuple[str, str] | None = None,
        touched_at: float | None = None,
        state_json: str | None = None,
        reuse_erased: bool = False,
    ) -> CreateOutcome:
        """Insert the head row (listed under ``listed``, an app and a user), and with
        ``state_json`` its first event, the initial state, applied as an append's is. An id
        with a tombstone is "erased" unless ``reuse_erased``."""
        ...

    async def erase_conversation(
        self, conversation_id: UUID, erasure_id: UUID, reason: str
    ) -> Erasure | None:
        """Remove every row of the conversation and leave its tombstone, in one transaction;
        for one already erased, its latest tombstone; None for an id never seen."""
        ...

    async def erase_tenant(
        self,
        tenant_id: str,
        erasure_id: UUID,
        reason: str,
        totals: tuple[int, int, int],
    ) -> Erasure | None:
        """Once the tenant's conversations are erased: remove its shared state and write its
        tombstone with ``totals`` (conversations, events, attempts erased); for a tenant
        with nothing left and a tombstone already, that one. None while it still has
        conversations (created meanwhile: erase them, then call again)."""
        ...

    async def conversation_ids(self, tenant_id: str, after: UUID | None, limit: int) -> list[UUID]:
        """Up to ``limit`` ids of the tenant's conversations, deleted ones too, in id order
        after ``after``."""
        ...

    async def read_event_rows(
        self, conversation_id: UUID, after_seq: int, through_seq: int, limit: int
    ) -> list[EventRow]:
        """The raw rows of events ``after_seq`` < seq <= ``through_seq``, oldest first."""
        ...

    async def read_attempts(self, conversation_id: UUID) -> list[AttemptRecord]:
        """Every compaction attempt of the conversation, oldest first."""
        ...

    async def read_shared_states(self, tenant_id: str) -> list[SharedStateRow]: ...

    async def write_shared_states(self, rows: Sequence[SharedStateRow]) -> None:
        """Set each scope to the row's state (an import of a tenant's shared state)."""
        ...

    def importing(
        self, header: ConversationHeader, tenant_id: str, *, reuse_erased: bool
    ) -> AbstractAsyncContextManager[ImportSink]:
        """A transaction that creates the header's conversation under ``tenant_id`` (refused
        as :class:`ConflictError` when the id is taken, :class:`ErasedConversationError`
        when it was erased, unless ``reuse_erased``) and yields where its log goes; rolled
        back if the block raises."""
        ...

    async def read_state(
        self, conversation_id: UUID | None, tenant_id: str, scopes: Sequence[str]
    ) -> StateSnapshot | None:
        """The conversation's own state and where its log ends (unless ``conversation_id``
        is None), and the tenant's ``scopes``, in one statement. None when the conversation
        is not there, not visible, or deleted."""
        ...

    async def list_by_user(
        self,
        tenant_id: str,
        app_name: str,
        user_id: str | None,
        after: tuple[str, UUID] | None,
        limit: int,
    ) -> list[Conversation]:
        """Up to ``limit`` conversations listed under the app (and the user, unless None),
        not deleted, in (user_id, conversation_id) order after ``after``."""
        ...

    async def append(
        self, conversation_id: UUID, batch: PreparedBatch, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome:
        """Append the batch (refused as a conflict unless the last seq is its
        ``expected_seq``) and, in the same transaction, mark the conversation due when
        ``trigger`` (with the conversation's overrides) fires on the new head."""
        ...

    async def mark_run_completed(
        self, conversation_id: UUID, tokens_per_abandoned: int, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome: ...

    async def write_boundary(
        self, conversation_id: UUID, planner: BoundaryPlanner
    ) -> BoundaryWrite | None:
        """Lock the head, read the events after the planner's cut, let it decide (it raises to
        refuse), and write its result (and its attempt, completed with the boundary's seq),
        all in one transaction. None when the conversation does not exist."""
        ...

    async def write_event(
        self, conversation_id: UUID, plan: PlanEvent, trigger: EpisodicCompactionConfig
    ) -> tuple[bool, PlannedEvent | None]:
        """Read the head and the events after its cut, let ``plan`` decide, and write its
        event and counters if the head has not moved meanwhile (else plan again), marking the
        conversation due when ``trigger`` fires on the new head: (found, what was written).
        Found is False when the conversation does not exist."""
        ...

    async def claim(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        """Lease up to ``limit`` due conversations (skipping any another worker holds) and
        count the attempt, in one statement."""
        ...

    async def claim_conversation(
        self, conversation_id: UUID, owner: str, lease_seconds: float, reason: str
    ) -> Claim | None:
        """Lease one conversation now, due or not (an operator's ``episodic compact``); None
        when another worker holds its lease."""
        ...

    async def listen_for_due(self, wake: Callable[[], None]) -> Closer | None:
        """Call ``wake`` whenever a conversation becomes due; None when the database cannot
        notify (SQLite: workers poll)."""
        ...

    async def end_attempt(
        self, claim: Claim, end: AttemptEnd, attempt: AttemptRecord
    ) -> AttemptOutcome:
        """Release the lease as ``end`` says and record ``attempt``, if the lease is still
        ours (else the attempt is recorded as ``lease_lost`` and the head is left alone)."""
        ...

    async def mark_due_by_age(self, trigger: EpisodicCompactionConfig) -> int:
        """Mark due the conversations whose age rule fires (the periodic sweep)."""
        ...

    async def status(self, recent: int, limit: int) -> CompactionStatus:
        """Queue counts, up to ``limit`` of the queue's conversations (dead first), and the
        ``recent`` latest attempts; only the scoped tenant's, when scoped."""
        ...

    async def load_tail(self, conversation_id: UUID, *, with_events: bool) -> Tail | None:
        """The head's position, its latest boundary and the messages after its cut (and,
        ``with_events``, every event after it), in one statement."""
        ...

    async def read_events(
        self, conversation_id: UUID, after_seq: int, limit: int
    ) -> list[StoredEvent]: ...

    async def get_conversation(self, conversation_id: UUID) -> Conversation | None: ...

    async def list_conversations(self, limit: int, before: UUID | None) -> list[Conversation]:
        """Newest first; ``before``: continue after this conversation (the previous page's
        last). Only the scoped tenant's, when scoped."""
        ...

    async def close(self) -> None: ...


__all__ = [
    "Backend",
    "BoundaryPlanner",
    "Closer",
    "CreateOutcome",
    "ImportSink",
    "Outcome",
    "PlanBoundary",
    "PlanEvent",
    "PlannedEvent",
    "WriteOutcome",
]
