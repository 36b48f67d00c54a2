"""The port: what the store (``store.py``) asks of a database backend, and the values the
backends answer with (:class:`WriteOutcome`, :data:`CreateOutcome`).

Two packages implement it, and what is specific to one database lives in its own (the
migrations, in ``migrations/``, aside): ``postgres/`` (the backend, every statement it sends in
``queries.py``, the PL/pgSQL of ``schema.sql``, the pool, the coalescer, the listener, Citus)
and ``sqlite/``. Every module at the top of ``store/`` serves both and imports neither
(import-linter holds it); only ``connect.py`` builds one. The decisions both databases make
are written once in Python as pure functions (``rules.py``, ``due.py``, ``attempts.py``,
``planned_events.py``, ``projection.py``) that the SQLite backend calls and PostgreSQL's SQL
mirrors; each names its SQL twin, and tests/contract/test_twins.py checks they agree. A
method here has the name of its SQL function where there is one (``head`` is
``episodic_head``, ``sweep_due`` ``episodic_sweep_due``), so one grep finds every side of an
operation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol
from uuid import UUID

from episodic.models import Conversation, StoredEvent
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
from episodic.store.planned_events import PlannedEvent
from episodic.store.projection import HeadState
from episodic.store.state import StateSnapshot

#: What a write of the request path came to (an append, a run completion).
Outcome = Literal[
    "appended",
    "replayed",
    "not_found",
    "deleted",
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


Closer = Callable[[], Awaitable[None]]
#: What creating a conversation came to: made, its id taken by one that exists, or by one
#: that was erased (refused unless the caller reuses erased ids): what
#: rules.create_conversation_outcome decides.
CreateOutcome = Literal["created", "taken", "erased"]


@dataclass(frozen=True, slots=True)
class NewConversation:
    """A conversation to create, checked and encoded by the store: its head row's values,
    where it is listed (an app and a user), and its initial state as an append's JSON."""

    conversation_id: UUID
    tenant_id: str
    metadata: dict[str, Any]
    created_at: datetime
    listed: tuple[str, str] | None = None
    touched_at: float | None = None
    state_json: str | None = None
    #: create it although the tenant erased this id before (else "erased")
    reuse_erased: bool = False


PlanBoundary = Callable[[HeadState, list[StoredEvent], datetime], BoundaryWrite]


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
    """A database behind the store: ``PostgresBackend`` or ``SqliteBackend``. Each method is
    one operation, named as its SQL function is where there is one."""

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

    async def create_conversation(self, new: NewConversation) -> CreateOutcome:
        """Insert the head row (listed under ``new.listed``, an app and a user), and with
        ``new.state_json`` its first event, the initial state, applied as an append's is. An id
        with a tombstone is "erased" unless ``reuse_erased`` (``episodic_create_conversation``;
        the outcome is rules.create_conversation_outcome's)."""
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
        ``trigger`` (with the conversation's overrides) fires on the new head
        (``episodic_append``; the refusals are rules.append_refusal's)."""
        ...

    async def mark_run_completed(
        self, conversation_id: UUID, tokens_per_abandoned: int, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome:
        """Append a run completion that abandons the calls still open, and mark the
        conversation due when ``trigger`` fires on the new head
        (``episodic_mark_run_completed``; the head is HeadCounters.after_run_completed's)."""
        ...

    async def write_boundary(
        self, conversation_id: UUID, planner: BoundaryPlanner
    ) -> BoundaryWrite | None:
        """Lock the head, read the events after the planner's cut, let it decide (it raises to
        refuse), and write its result (and its attempt, completed with the boundary's seq),
        all in one transaction. None when the conversation does not exist
        (``episodic_write_boundary``; what it clears is due.CLEARED_COMPACTION_STATE)."""
        ...

    async def write_event(
        self, conversation_id: UUID, plan: PlanEvent, trigger: EpisodicCompactionConfig
    ) -> tuple[bool, PlannedEvent | None]:
        """Read the head and the events after its cut, let ``plan`` decide, and write its
        event and counters if the head has not moved meanwhile (else plan again), marking the
        conversation due when ``trigger`` fires on the new head: (found, what was written).
        Found is False when the conversation does not exist (or is deleted)
        (``episodic_write_event``; what it sets besides the counters is
        planned_events.write_event_columns)."""
        ...

    async def claim(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        """Lease up to ``limit`` due conversations (skipping any another worker holds) and
        count the attempt, in one statement (``episodic_claim``; which ones and what is
        written are attempts.claimable and attempts.claim_columns)."""
        ...

    async def claim_conversation(
        self, conversation_id: UUID, owner: str, lease_seconds: float, reason: str
    ) -> Claim | None:
        """Lease one conversation now, due or not (an operator's ``episodic compact``); None
        when another worker holds its lease (``episodic_claim_conversation``;
        attempts.claimable_by_hand and attempts.claim_conversation_columns)."""
        ...

    async def listen_for_due(self, wake: Callable[[], None]) -> Closer | None:
        """Call ``wake`` whenever a conversation becomes due; None when the database cannot
        notify (SQLite: workers poll)."""
        ...

    async def end_attempt(
        self, claim: Claim, end: AttemptEnd, attempt: AttemptRecord
    ) -> AttemptOutcome:
        """Release the lease as ``end`` says and record ``attempt``, if the lease is still
        ours (else the attempt is recorded as ``lease_lost`` and the head is left alone)
        (``episodic_end_attempt``; attempts.end_attempt_columns and
        attempts.end_attempt_outcome)."""
        ...

    async def sweep_due(self, trigger: EpisodicCompactionConfig) -> int:
        """The periodic sweep: mark due the conversations ``trigger`` fires on now (the age
        rule fires with time alone); how many it marked (``episodic_sweep_due``; which heads
        it looks at is due.sweep_due_candidate, what it marks due.due_marking)."""
        ...

    async def queue_status(self, recent: int, limit: int) -> CompactionStatus:
        """Queue counts, up to ``limit`` of the queue's conversations (dead first), and the
        ``recent`` latest attempts; only the scoped tenant's, when scoped (queries
        ``QUEUE_COUNTS``, ``QUEUE`` and ``RECENT_ATTEMPTS``; attempts.queue_counts,
        queue_state and queue_order)."""
        ...

    async def load_tail(
        self, conversation_id: UUID, *, with_events: bool, stored: bool = False
    ) -> Tail | None:
        """The head's position, its latest boundary and the messages after its cut (and,
        ``with_events``, every event after it; ``stored``, the messages as
        :class:`~episodic.store.codec.StoredMessage` views), in one statement."""
        ...

    async def read_events(
        self, conversation_id: UUID, after_seq: int, limit: int
    ) -> list[StoredEvent]:
        """Up to ``limit`` events after ``after_seq``, oldest first; none for a conversation
        that is not there or not the scope's."""
        ...

    async def search_events(
        self, conversation_id: UUID, terms: Sequence[str], limit: int
    ) -> list[StoredEvent]:
        """Up to ``limit`` messages holding any of ``terms`` (episodic/search.py: the most of
        them first, then the newest); none for a conversation that is not there or not the
        scope's."""
        ...

    async def head(self, conversation_id: UUID) -> Conversation | None:
        """The conversation's head, deleted or not; None when it is not there or not the
        scope's (``episodic_head``; the store's ``get_conversation``)."""
        ...

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
    "WriteOutcome",
]
