"""``EpisodicStore``: the public face of the log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Self, TypeVar
from uuid import UUID, uuid4

import orjson
from pydantic import JsonValue

from episodic.context import Context, compose_context, compose_messages
from episodic.errors import (
    ConflictError,
    ConversationDeletedError,
    DuplicateToolCallError,
    ErasedConversationError,
    ErasureDeniedError,
    IdempotencyMismatchError,
    NotFoundError,
    NotPinnedError,
    OrphanToolResultError,
    TenantDeniedError,
    ValidationError,
)
from episodic.models import (
    BoundaryEvent,
    ClearEvent,
    Conversation,
    DeletionEvent,
    Message,
    MessageEvent,
    RunCompletedEvent,
    StateChange,
    StoredEvent,
    UnpinEvent,
    Usage,
    UsageEvent,
    construct_valid,
)
from episodic.policy import EpisodicCompactionConfig, EpisodicCompactionPressure
from episodic.search import check_search_limit, query_terms
from episodic.settings import EpisodicSettings, load_settings
from episodic.store.attempts import (
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    Claim,
    CompactionStatus,
)
from episodic.store.backend import (
    Backend,
    BoundaryPlanner,
    Closer,
    NewConversation,
    PlanEvent,
    WriteOutcome,
)
from episodic.store.batch import PreparedBatch, prepare_batch
from episodic.store.boundaries import BoundaryRequest, BoundaryWrite, plan_boundary
from episodic.store.checks import (
    MAX_CLAIM_TEXT_LENGTH,
    MAX_LEASE_SECONDS,
    MAX_LISTING_LENGTH,
    MAX_READ_LIMIT,
    MAX_TENANT_ID_LENGTH,
    check_int,
    check_lease,
    check_limit,
    check_seq,
    check_tenant,
    check_text,
    checked_usage,
    parse_conversation_id,
)
from episodic.store.codec import Tail, encode_json, utc
from episodic.store.connect import open_backend
from episodic.store.due import check_overrides, pressure_from
from episodic.store.engine import parse_database_url
from episodic.store.erasure import Erasure, check_reason
from episodic.store.migrate import HEAD_REVISION, SchemaMigration, check_revision, runs_on
from episodic.store.planned_events import (
    PlannedEvent,
    plan_clear,
    plan_deletion,
    plan_retraction,
    plan_unpin,
    plan_usage,
)
from episodic.store.projection import HeadState, abandoned_result_tokens, counters_of
from episodic.store.retry import retry_transient
from episodic.store.state import (
    MAX_SCOPE_LENGTH,
    StateSnapshot,
    check_touched_at,
    encode_state_change,
)
from episodic.store.stored_context import StoredContext
from episodic.store.transfer import (
    ImportedConversation,
    ImportSummary,
    Lines,
    export_conversation,
    export_tenant,
    import_lines,
)
from episodic.tokens import TokenEstimator, estimator_from_name

DEFAULT_TENANT = "default"

T = TypeVar("T")


class _SchemaState:
    """Whether the database's schema is known to be the one this episodic needs, shared by a
    store and its tenant-scoped copies. Until it is, every call reads the revision first (one
    query), so an unmigrated database is a clear :class:`SchemaNotMigratedError` on the first
    call, not a missing-table error from the middle of an append; once it is, the check costs
    an attribute read."""

    __slots__ = ("current",)

    def __init__(self, revision: str | None) -> None:
        self.current = runs_on(revision)


class EpisodicStore:
    """An append-only log of agent conversations. Open one per process with
    :meth:`open` and share it between tasks; it holds a connection pool."""

    def __init__(
        self,
        backend: Backend,
        *,
        estimator: TokenEstimator,
        max_message_bytes: int,
        trigger: EpisodicCompactionConfig | None = None,
        owns_backend: bool = True,
        schema: _SchemaState | None = None,
    ) -> None:
        self._backend = backend
        self._owns_backend = owns_backend
        self._schema = schema or _SchemaState(HEAD_REVISION)
        self.estimator = estimator
        self.max_message_bytes = max_message_bytes
        #: when appends mark a conversation due for compaction (per-conversation overrides in
        #: metadata["compaction"])
        self.trigger = trigger or EpisodicCompactionConfig()
        self._abandoned_tokens = abandoned_result_tokens(estimator)

    @classmethod
    async def open(
        cls,
        url: str | None = None,
        *,
        settings: EpisodicSettings | None = None,
        estimator: TokenEstimator | None = None,
        max_message_bytes: int | None = None,
        trigger: EpisodicCompactionConfig | None = None,
    ) -> EpisodicStore:
        """Connect to ``url`` (default: ``EPISODIC_DATABASE_URL``, else ``./episodic.db``).

        A database that cannot be reached or refuses the connection raises
        :class:`DatabaseUnavailableError` here, saying what to fix. Does not create tables:
        call :meth:`migrate` (or run ``episodic migrate``); until the schema is current, every
        other call raises :class:`SchemaNotMigratedError`. A SQLite file is created by
        :meth:`migrate` only."""
        settings = settings or load_settings()
        parsed = parse_database_url(url or settings.database_url)
        chosen_estimator = estimator or estimator_from_name(settings.token_estimator)
        backend = await open_backend(parsed, settings)
        try:
            revision = await backend.schema_revision()
        except BaseException:
            await backend.close()
            raise
        return cls(
            backend,
            estimator=chosen_estimator,
            max_message_bytes=max_message_bytes or settings.max_message_bytes,
            trigger=trigger or settings.trigger_config(),
            schema=_SchemaState(revision),
        )

    def for_tenant(self, tenant_id: str) -> EpisodicStore:
        """This store, scoped to one tenant: the way a multi-tenant server should use it.

        Every operation runs under ``tenant_id``: another tenant's conversations are not
        found (:class:`NotFoundError`) and can be neither read nor written. On PostgreSQL the
        database enforces it too, with row-level security (the tenant is set per transaction,
        never per connection); on SQLite the store does. Shares this store's connections;
        closing it does nothing, close the store it came from."""
        check_tenant(tenant_id)
        self._refuse_other_tenant(tenant_id, f"it cannot act for {tenant_id!r}")
        return EpisodicStore(
            self._backend.for_tenant(tenant_id),
            estimator=self.estimator,
            max_message_bytes=self.max_message_bytes,
            trigger=self.trigger,
            owns_backend=False,
            schema=self._schema,
        )

    @property
    def tenant_id(self) -> str | None:
        """The tenant this store is scoped to (:meth:`for_tenant`), or None."""
        return self._backend.tenant

    @property
    def location(self) -> str:
        """The database's URL with its password masked: what messages and logs may show."""
        return self._backend.location

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return self._backend.dialect

    async def migrate(self) -> SchemaMigration:
        """Create or upgrade the schema (``alembic upgrade head``) and say from which revision
        (``before`` is None when there was none). Safe to call from many processes at once."""
        done = await self._backend.migrate()
        self._schema.current = True
        return done

    async def _ready(self) -> None:
        """Raise :class:`SchemaNotMigratedError` unless the schema is current. Once it has
        been seen current, an attribute read."""
        if self._schema.current:
            return
        revision = await retry_transient(self._backend.schema_revision, safe=True)
        check_revision(revision, where=self._backend.location)
        self._schema.current = True

    async def close(self) -> None:
        if self._owns_backend:
            await self._backend.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ---- conversations ------------------------------------------------------------------

    async def create_conversation(
        self,
        *,
        tenant_id: str | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        conversation_id: UUID | str | None = None,
        app_name: str | None = None,
        user_id: str | None = None,
        state: StateChange | None = None,
        touched_at: float | None = None,
        reuse_erased_id: bool = False,
    ) -> UUID:
        """Start a conversation and return its id (a new UUID unless you pass one).
        ``tenant_id`` defaults to the store's tenant (:meth:`for_tenant`), else ``"default"``;
        a scoped store refuses another with :class:`TenantDeniedError`.

        ``app_name`` and ``user_id`` (both or neither) list it for :meth:`list_by_user`;
        ``state`` is its initial state (the log's first event, applied to the shared scopes
        it names in the same transaction); ``touched_at`` is the caller's time of creation
        (:attr:`Conversation.touched_at`). An id erased in this tenant is refused with
        :class:`ErasedConversationError` unless ``reuse_erased_id``: then a new, empty
        conversation starts under it. (Tombstones are the tenant's, like the rows they
        replace: another tenant does not see them.)"""
        await self._ready()
        tenant_id = self._tenant_for(tenant_id, "create a conversation for")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValidationError("metadata must be a mapping", field="metadata")
        meta = dict(metadata or {})
        check_overrides(meta)
        encoded = encode_json(meta, what="metadata")
        if len(encoded) > self.max_message_bytes:
            raise ValidationError(
                f"metadata is {len(encoded):,} bytes encoded, over {self.max_message_bytes:,}",
                field="metadata",
            )
        listed = _listing(app_name, user_id)
        state_json = (
            encode_state_change(state, max_bytes=self.max_message_bytes)
            if state is not None
            else None
        )
        cid = uuid4() if conversation_id is None else parse_conversation_id(conversation_id)
        new = NewConversation(
            cid,
            tenant_id,
            orjson.loads(encoded),
            datetime.now(UTC),
            listed=listed,
            touched_at=check_touched_at(touched_at),
            state_json=state_json,
            reuse_erased=reuse_erased_id is True,
        )
        created = await self._backend.create_conversation(new)
        if created == "erased":
            raise ErasedConversationError(cid)
        if created == "taken":
            raise ConflictError(f"conversation {cid} already exists", conversation_id=cid)
        return cid

    async def get_conversation(self, conversation_id: UUID | str) -> Conversation:
        """The conversation's head: tenant, metadata and counters."""
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        head = await self._head(cid)
        if head is None:
            raise NotFoundError(cid)
        return head

    async def _head(self, cid: UUID) -> Conversation | None:
        """The head, deleted or not, or None: a read, retried on a transient error."""
        return await retry_transient(lambda: self._backend.head(cid), safe=True)

    async def list_by_user(
        self,
        app_name: str,
        user_id: str | None = None,
        *,
        limit: int = 100,
        after: Conversation | None = None,
        tenant_id: str | None = None,
    ) -> list[Conversation]:
        """The conversations listed under ``app_name`` (and ``user_id``; every user's when
        None) that are not deleted, at most ``limit``, in (user id, conversation id) order:
        one page of an index range, never a scan. For the next page, pass the last one as
        ``after``. ``tenant_id``: the scoped store's, else ``"default"``."""
        await self._ready()
        check_limit(limit)
        check_text(app_name, field="app_name", max_length=MAX_LISTING_LENGTH)
        if user_id is not None:
            check_text(user_id, field="user_id", max_length=MAX_LISTING_LENGTH, min_length=0)
        tenant = self._tenant_for(tenant_id)
        cursor = None
        if after is not None:
            if not isinstance(after, Conversation) or after.user_id is None:
                raise ValidationError(
                    "after must be a listed Conversation from the previous page", field="after"
                )
            cursor = (after.user_id, after.conversation_id)
        return await retry_transient(
            lambda: self._backend.list_by_user(tenant, app_name, user_id, cursor, limit),
            safe=True,
        )

    async def read_state(
        self,
        conversation_id: UUID | str | None,
        *,
        shared: Sequence[str] = (),
        tenant_id: str | None = None,
    ) -> StateSnapshot:
        """The conversation's own state and the tenant's ``shared`` scopes, as of one
        statement (with the seq its log ended at). ``conversation_id`` None reads the scopes
        alone, of ``tenant_id`` (the scoped store's, else ``"default"``). A scope never
        written is left out. :class:`NotFoundError` for a conversation not there or deleted."""
        await self._ready()
        if isinstance(shared, str) or not isinstance(shared, Sequence):
            raise ValidationError("shared must be a list of scope names", field="shared")
        scopes = [check_text(s, field="shared", max_length=MAX_SCOPE_LENGTH) for s in shared]
        cid = parse_conversation_id(conversation_id) if conversation_id is not None else None
        tenant = self._tenant_for(tenant_id)
        found = await retry_transient(
            lambda: self._backend.read_state(cid, tenant, scopes), safe=True
        )
        if found is None:
            assert cid is not None
            raise NotFoundError(cid)
        return found

    def _tenant_for(self, tenant_id: str | None, action: str = "read") -> str:
        """The tenant an operation is for: the one given (a scoped store refuses another
        than its own, saying it cannot ``action`` it), else the scope's, else the default."""
        if tenant_id is None:
            return self._backend.tenant or DEFAULT_TENANT
        check_tenant(tenant_id)
        self._refuse_other_tenant(
            tenant_id,
            f"it cannot {action} tenant {tenant_id!r}; use store.for_tenant({tenant_id!r})",
        )
        return tenant_id

    def _refuse_other_tenant(self, tenant_id: str, refusal: str) -> None:
        """The one check that a scoped store acts for its own tenant alone: when this store is
        scoped to another tenant than ``tenant_id``, :class:`TenantDeniedError`, its message
        the scope then ``refusal`` (what was refused)."""
        scope = self._backend.tenant
        if scope is not None and tenant_id != scope:
            raise TenantDeniedError(
                f"this store is scoped to tenant {scope!r}; {refusal}", tenant_id=tenant_id
            )

    async def list_conversations(
        self, *, limit: int = 100, before: UUID | str | None = None
    ) -> list[Conversation]:
        """Conversations, newest first, at most ``limit``: the scoped tenant's (see
        :meth:`for_tenant`), else every one the connection may see. For the next page, pass
        the last one's id as ``before``."""
        await self._ready()
        check_limit(limit)
        cursor = parse_conversation_id(before) if before is not None else None
        return await retry_transient(
            lambda: self._backend.list_conversations(limit, cursor), safe=True
        )

    # ---- the log ------------------------------------------------------------------------

    async def append(
        self,
        conversation_id: UUID | str,
        messages: Sequence[Message],
        *,
        idempotency_key: str | None = None,
        expected_seq: int | None = None,
        usage: Usage | None = None,
        state: StateChange | None = None,
        touched_at: float | None = None,
    ) -> list[MessageEvent]:
        """Append a batch atomically and return the stored events, with their seqs.

        ``idempotency_key``: re-sending the same key with the same batch returns the first
        result and writes nothing (a batch whose first message has a ``client_id`` is keyed by
        it when no key is given). ``expected_seq``: refuse with :class:`ConflictError` unless
        the conversation's last seq is this. ``usage``: the provider-reported usage of the
        model call that produced these messages. ``state``: a :class:`StateChange` the
        batch makes, appended after its messages (one more seq) and applied in the same
        transaction. ``touched_at``: the caller's time of the write
        (:attr:`Conversation.touched_at`). One round trip on PostgreSQL.

        A dropped connection is retried only when the batch is keyed (idempotency key or
        client ids), since only then is a retry of a write that did commit harmless; otherwise
        it surfaces as :class:`TransientDatabaseError`, and the caller decides.
        """
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        batch = prepare_batch(
            cid,
            messages,
            estimator=self.estimator,
            max_message_bytes=self.max_message_bytes,
            idempotency_key=idempotency_key,
            expected_seq=expected_seq,
            usage=usage,
            state=state,
            touched_at=touched_at,
        )
        result = await retry_transient(
            lambda: self._backend.append(cid, batch, self.trigger),
            safe=batch.idempotency_key is not None,
        )
        _raise_for_refusal(cid, result, expected_seq=expected_seq, key=idempotency_key)
        assert result.seq is not None
        assert result.created_at is not None
        return _stored_batch(cid, batch, result.seq, result.created_at)

    async def mark_run_completed(self, conversation_id: UUID | str) -> RunCompletedEvent:
        """Record that an agent run ended cleanly. Tool calls still waiting for a result are
        closed as abandoned: compaction can cut past them, loading pairs each with a
        synthetic error result, and a late result for one is refused."""
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        result = await self._backend.mark_run_completed(cid, self._abandoned_tokens, self.trigger)
        _raise_for_refusal(cid, result, expected_seq=None, key=None)
        assert result.seq is not None
        assert result.created_at is not None
        abandoned = tuple(orjson.loads(result.detail)) if result.detail else ()
        return RunCompletedEvent(
            conversation_id=cid,
            seq=result.seq,
            created_at=utc(result.created_at),
            token_estimate=self._abandoned_tokens * len(abandoned),
            abandoned_tool_call_ids=abandoned,
        )

    async def retract_last(self, conversation_id: UUID | str) -> MessageEvent | None:
        """Take back the newest message in view after the latest cut, whatever its role, and
        return it; None when there is none. The log keeps it: a
        :class:`RetractionEvent` is appended, and from then on the message is out of the
        context, the head's counters (its tokens, its user message, its calls; a retracted
        tool result's call waits again) and every later boundary's transcript. Concurrent
        retractions take back one message each. The handoff and retained messages of a
        boundary are not messages of the log and are never retracted."""
        cid = await self._parsed(conversation_id)
        written = await self._write_planned(
            cid, lambda head, tail, now: plan_retraction(cid, head, tail, now)
        )
        return written.retracted if written is not None else None

    async def clear(self, conversation_id: UUID | str) -> ClearEvent | None:
        """Empty the view: ``load_context`` returns only what is appended after this (no
        handoff either), and the context's counters start again. The log keeps every event
        (a :class:`ClearEvent` is appended); erasing is another operation. Calls still
        waiting for a result are dropped with the view. None when the view is already
        empty (nothing is written)."""
        cid = await self._parsed(conversation_id)
        written = await self._write_planned(
            cid, lambda head, tail, now: plan_clear(cid, head, tail, now)
        )
        if written is None:
            return None
        assert isinstance(written.event, ClearEvent)
        return written.event.model_copy(update={"created_at": utc(written.event.created_at)})

    async def delete_conversation(self, conversation_id: UUID | str) -> DeletionEvent | None:
        """Delete the conversation: a :class:`DeletionEvent` is appended and from then on it
        is not listed, not compacted, loads as not found and takes no write (an append is
        refused with :class:`ConversationDeletedError`, any other write as not found); its
        log is kept (:meth:`read_events` still reads it) and its id stays taken until an
        erasure. None when it was already deleted."""
        cid = await self._parsed(conversation_id)
        written = await self._write_planned(
            cid, lambda head, tail, now: plan_deletion(cid, head, now), deleted_too=True
        )
        if written is None:
            return None  # deleted already (or meanwhile, by another caller)
        assert isinstance(written.event, DeletionEvent)
        return written.event.model_copy(update={"created_at": utc(written.event.created_at)})

    async def report_usage(self, conversation_id: UUID | str, usage: Usage) -> UsageEvent:
        """Record a provider's usage for the messages appended before it (when it comes after
        them: an agent framework saves a turn, then reports its usage): the pressure signal
        starts from its ``input_tokens``, as if it had been passed with the append, and the
        trigger is asked on the new head. A :class:`UsageEvent` in the log."""
        cid = await self._parsed(conversation_id)
        checked = checked_usage(usage)
        written = await self._write_planned(
            cid, lambda head, tail, now: plan_usage(cid, checked, head, now)
        )
        assert written is not None
        assert isinstance(written.event, UsageEvent)
        return written.event.model_copy(update={"created_at": utc(written.event.created_at)})

    async def unpin(self, conversation_id: UUID | str, seq: int) -> UnpinEvent:
        """Stop carrying the pinned user message at ``seq`` as a standing instruction: an
        :class:`UnpinEvent` is appended, and the handoffs written after it leave the message
        out (the message stays in the log and, while in view, in the context). A seq that is
        not a pinned user message of this conversation is a :class:`ValidationError`, and
        nothing is written (:class:`NotPinnedError`, a ``ValidationError``)."""
        cid = await self._parsed(conversation_id)
        check_seq(seq, "seq")
        found = await self.read_events(cid, after_seq=seq - 1, limit=1) if seq >= 1 else []
        target = found[0] if found and found[0].seq == seq else None
        if not isinstance(target, MessageEvent) or not target.message.pinned:
            what = "no event" if target is None else f"a {_what_event(target)}"
            raise NotPinnedError(
                f"seq {seq} of conversation {cid} is {what}, not a pinned user message: only a "
                "message appended with pinned=True can be unpinned",
                conversation_id=cid,
                seq=seq,
            )
        written = await self._write_planned(
            cid, lambda head, tail, now: plan_unpin(cid, seq, head, now)
        )
        assert written is not None
        assert isinstance(written.event, UnpinEvent)
        return written.event.model_copy(update={"created_at": utc(written.event.created_at)})

    async def _parsed(self, conversation_id: UUID | str) -> UUID:
        await self._ready()
        return parse_conversation_id(conversation_id)

    async def _write_planned(
        self, cid: UUID, plan: PlanEvent, *, deleted_too: bool = False
    ) -> PlannedEvent | None:
        """A retraction, a clear, a usage report or a deletion, as ``plan`` decides from the
        head and the events after its cut (store/planned_events.py); None when it decides
        nothing. A conversation that is not there is :class:`NotFoundError`, and so is a
        deleted one (the backend finds neither) unless ``deleted_too``: then None."""
        found, written = await self._backend.write_event(cid, plan, self.trigger)
        if found:
            return written
        if deleted_too and await self._head(cid) is not None:
            return None
        raise NotFoundError(cid)

    async def read_events(
        self, conversation_id: UUID | str, after_seq: int = 0, limit: int = 1_000
    ) -> list[StoredEvent]:
        """Events with seq > ``after_seq``, oldest first, at most ``limit`` (for audits and
        exports; the request path uses ``load_context``)."""
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        check_seq(after_seq, "after_seq")
        check_limit(limit)
        found = await retry_transient(
            lambda: self._backend.read_events(cid, after_seq, limit), safe=True
        )
        if not found and await self._head(cid) is None:
            raise NotFoundError(cid)
        return found

    async def search(
        self, conversation_id: UUID | str, query: str, *, limit: int = 10
    ) -> list[MessageEvent]:
        """The conversation's messages that hold the words of ``query`` (tool outputs
        included), with their seqs: best first (each word weighed by how rare it is in the
        conversation), then the newest, at most ``limit``. Finds what any compaction
        summarized away, since the log keeps it; retracted messages, those before a clear,
        and erased conversations are not found.
        ``query`` is a few words (stop words are ignored; see episodic/search.py)."""
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        terms = query_terms(query)
        check_search_limit(limit)
        found = await retry_transient(
            lambda: self._backend.search_events(cid, terms, limit), safe=True
        )
        if not found and await self._head(cid) is None:
            raise NotFoundError(cid)
        return [event for event in found if isinstance(event, MessageEvent)]

    async def read_attempts(self, conversation_id: UUID | str) -> list[AttemptRecord]:
        """The conversation's compaction attempts, in the order they ended (the inspector
        shows them; exports carry them too)."""
        cid = await self._parsed(conversation_id)
        found = await retry_transient(lambda: self._backend.read_attempts(cid), safe=True)
        if not found and await self._head(cid) is None:
            raise NotFoundError(cid)
        return found

    # ---- erasure, export, import ----------------------------------------------------------

    async def erase_conversation(self, conversation_id: UUID | str, *, reason: str) -> Erasure:
        """Remove the conversation completely: every event, compaction attempt and its head,
        in one transaction, leaving only a tombstone (:class:`Erasure`: counts, ``reason``,
        when, by which role; no content) in the append-only ``episodic_erasures`` ledger.

        The one path that removes history. On PostgreSQL only a member of
        ``episodic_eraser`` (or the tables' owner) may take it; any other role gets
        :class:`ErasureDeniedError` and nothing changes. An append racing the erasure lands
        before it (and is erased) or gets :class:`NotFoundError`; the id is not re-created
        by accident (see :meth:`create_conversation`). Erasing it again returns the first
        tombstone. :class:`NotFoundError` for an id never seen, or another tenant's."""
        cid = await self._parsed(conversation_id)
        why = check_reason(reason)
        erased = await self._erasing(lambda: self._backend.erase_conversation(cid, uuid4(), why))
        if erased is None:
            raise NotFoundError(cid)
        return erased

    async def erase_tenant(self, tenant_id: str, *, reason: str) -> Erasure:
        """Erase every conversation of the tenant (one transaction each, as
        :meth:`erase_conversation`, so a crash half way leaves whole conversations and a
        second call finishes), then its shared state, and return the tenant's tombstone,
        whose counts are the totals. Conversations created while it runs are erased too.
        Erasing a tenant with nothing left returns its earlier tombstone."""
        await self._ready()
        tenant = self._tenant_for(tenant_id, "erase")
        why = check_reason(reason)
        totals = [0, 0, 0]
        for _ in range(ERASE_TENANT_ROUNDS):
            while page := await self._backend.conversation_ids(tenant, None, MAX_READ_LIMIT):
                backend = self._backend.for_tenant(tenant)
                for cid in page:
                    erasure_id = uuid4()
                    erased = await self._erasing(
                        lambda: backend.erase_conversation(cid, erasure_id, why)  # noqa: B023
                    )
                    # (an older tombstone: erased meanwhile by another caller, counted there)
                    if erased is not None and erased.erasure_id == erasure_id:
                        totals[0] += 1
                        totals[1] += erased.events
                        totals[2] += erased.compaction_attempts
            done = await self._erasing(
                lambda: self._backend.erase_tenant(
                    tenant, uuid4(), why, (totals[0], totals[1], totals[2])
                )
            )
            if done is not None:
                return done
        raise ConflictError(
            f"tenant {tenant!r} kept gaining conversations while it was erased; what was "
            "erased stays erased: stop its writers and erase it again",
            conversation_id=UUID(int=0),
        )

    async def _erasing(self, erase: Callable[[], Awaitable[T]]) -> T:
        """Run an erasure, a refusal of the role said as what it is."""
        try:
            return await erase()
        except TenantDeniedError as exc:
            raise ErasureDeniedError(
                f"this database role may not erase ({exc}); erasing needs a role that is a "
                "member of episodic_eraser (GRANT episodic_eraser TO <login>), or the tables' "
                "owner; nothing was erased"
            ) from exc

    async def export_conversation(self, conversation_id: UUID | str) -> AsyncIterator[str]:
        """The conversation's whole log as JSON lines, each ending in a newline: a header
        (format version, schema revision, the conversation, its head, the counts and the
        SHA-256 of the lines that follow), then every event (every kind, with seq,
        timestamps and idempotency keys), then its compaction attempts. Streamed: memory
        stays flat however long the log. Deleted conversations export too."""
        cid = await self._parsed(conversation_id)
        async for line in export_conversation(self._backend, cid, schema_revision=HEAD_REVISION):
            yield line

    async def export_tenant(
        self, tenant_id: str, *, progress: Callable[[int], None] | None = None
    ) -> AsyncIterator[str]:
        """Every conversation of the tenant, as :meth:`export_conversation` writes each, then
        its shared state (a line per scope). ``progress(n)`` is called after each
        conversation."""
        await self._ready()
        tenant = self._tenant_for(tenant_id, "export")
        async for line in export_tenant(
            self._backend.for_tenant(tenant), tenant, schema_revision=HEAD_REVISION,
            progress=progress,
        ):  # fmt: skip
            yield line

    async def count_conversations(self, tenant_id: str) -> int:
        """How many conversations the tenant has, deleted ones included (what an export of
        it will write)."""
        await self._ready()
        tenant = self._tenant_for(tenant_id)
        count = 0
        after: UUID | None = None
        while page := await self._backend.conversation_ids(tenant, after, MAX_READ_LIMIT):
            count += len(page)
            after = page[-1]
        return count

    async def import_conversation(
        self,
        lines: Lines,
        *,
        tenant_id: str | None = None,
        reuse_erased_ids: bool = False,
    ) -> ImportedConversation:
        """Recreate one exported conversation (the lines :meth:`export_conversation` wrote,
        from this store or another backend): seqs, timestamps, boundaries, run completions
        and idempotency keys as they were, the head rebuilt from the log and checked against
        the export's header. All or nothing: a truncated or changed file, an unknown format
        version or a checksum mismatch is an :class:`ImportFormatError` naming the line; an
        id that exists is a :class:`ConflictError` (an erased one an
        :class:`ErasedConversationError`, unless ``reuse_erased_ids``); either way nothing is
        written. ``tenant_id``: the tenant to import it into (default: the file's)."""
        summary = await self._import(lines, tenant_id, reuse_erased_ids, single=True)
        if not summary.conversations:
            raise ValidationError("the file holds shared state but no conversation")
        return summary.conversations[0]

    async def import_conversations(
        self,
        lines: Lines,
        *,
        tenant_id: str | None = None,
        reuse_erased_ids: bool = False,
        check_only: bool = False,
    ) -> ImportSummary:
        """Import every conversation of an export file (a tenant's, or several
        conversations' one after another) and its shared state, in order, each as
        :meth:`import_conversation` does: all or nothing per conversation, so on an error
        the ones before it stay imported. ``check_only``: read and check the whole file,
        write nothing (what ``episodic import`` does first)."""
        return await self._import(lines, tenant_id, reuse_erased_ids, check_only=check_only)

    async def _import(
        self,
        lines: Lines,
        tenant_id: str | None,
        reuse_erased: bool,
        *,
        single: bool = False,
        check_only: bool = False,
    ) -> ImportSummary:
        await self._ready()
        scope = self._backend.tenant
        tenant = self._tenant_for(tenant_id, "import into") if tenant_id is not None else scope
        try:
            return await import_lines(
                self._backend,
                lines,
                tenant_id=tenant,
                reuse_erased=reuse_erased is True,
                check_only=check_only,
                single=single,
            )
        except TenantDeniedError as exc:
            raise TenantDeniedError(
                f"this database role may not import ({exc}): an import writes heads, events "
                "and compaction attempts, which episodic_app may not; import as the tables' "
                "owner or a member of episodic_all_tenants. Nothing was written for the "
                "conversation it stopped at",
                tenant_id=exc.tenant_id,
            ) from exc

    # ---- boundaries and the request path ------------------------------------------------

    async def write_boundary(
        self,
        conversation_id: UUID | str,
        request: BoundaryRequest,
        *,
        attempt: AttemptRecord | None = None,
    ) -> BoundaryEvent:
        """Append the summary boundary ``request`` describes: from now on ``load_context``
        returns its summary (the finalized handoff text), its retained user texts, and every
        message after its ``covers_through_seq``.

        One transaction that refuses (and writes nothing) when a newer boundary than
        ``expected_boundary_seq`` exists (:class:`ConflictError`), when ``lease_token`` no
        longer holds the compaction lease (:class:`LeaseLostError`), or when the cut would
        separate a tool call from its result (:class:`UnsafeCutError`). Messages appended
        after the cut, even while the summary was being written, stay in the context.
        ``attempt`` (the compaction worker's) is recorded in the same transaction. The
        request's fields were checked when it was made; the summary (and each of
        ``handoff_items``, a framework's own compaction the context then starts with) is held
        here to ``max_message_bytes``, like a message. With ``expected_last_seq``, the write
        is refused (:class:`ConflictError`) unless the log still ends at that seq.
        """
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        if not isinstance(request, BoundaryRequest):
            raise ValidationError(
                "write_boundary takes an episodic.BoundaryRequest", field="request"
            )
        request.check_size(self.max_message_bytes)

        def plan(head: HeadState, tail: list[StoredEvent], now: datetime) -> BoundaryWrite:
            return plan_boundary(cid, request, head, tail, now=now, estimator=self.estimator)

        planner = BoundaryPlanner(request.covers_through_seq, plan, attempt)
        written = await self._backend.write_boundary(cid, planner)
        if written is None:
            raise NotFoundError(cid)
        return written.event.model_copy(update={"created_at": utc(written.event.created_at)})

    async def load_context(
        self, conversation_id: UUID | str, *, max_tool_result_tokens: int | None = None
    ) -> Context:
        """What the next model call should see: the latest boundary's handoff and retained
        user messages, then every message after its cut, with each tool call followed by its
        results (a call with none gets a synthetic error result). Without a boundary, the
        whole history. No system message.

        One statement on PostgreSQL, reading only the rows it returns. Tool results over
        ``max_tool_result_tokens`` are cut here with a visible marker; the log keeps them whole.
        """
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        if max_tool_result_tokens is not None and (
            isinstance(max_tool_result_tokens, bool)
            or not isinstance(max_tool_result_tokens, int)
            or max_tool_result_tokens < 1
        ):
            raise ValidationError(
                "max_tool_result_tokens must be a positive integer", field="max_tool_result_tokens"
            )
        loaded = await retry_transient(
            lambda: self._backend.load_tail(cid, with_events=False), safe=True
        )
        if loaded is None:
            raise NotFoundError(cid)
        return self._compose(cid, loaded, max_tool_result_tokens)

    async def load_stored_context(self, conversation_id: UUID | str) -> StoredContext:
        """``load_context`` for an answer in episodic's own JSON: the same context, its
        stored messages left as the log holds them (:mod:`episodic.store.stored_context`).
        The same one statement."""
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        loaded = await retry_transient(
            lambda: self._backend.load_tail(cid, with_events=False, stored=True), safe=True
        )
        if loaded is None:
            raise NotFoundError(cid)
        assert loaded.stored is not None
        messages, estimated = compose_messages(loaded.boundary, loaded.stored, self.estimator)
        return StoredContext(
            cid,
            messages,
            estimated,
            loaded.last_seq,
            # the head's: a tail holds a boundary only when it is the head's latest
            loaded.boundary_seq,
        )

    async def load_context_and_tail(
        self, conversation_id: UUID | str
    ) -> tuple[Context, list[StoredEvent]]:
        """``load_context`` plus the raw events after the latest cut, for the compaction
        worker, which needs them to find a safe cut (still one statement)."""
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        loaded = await retry_transient(
            lambda: self._backend.load_tail(cid, with_events=True), safe=True
        )
        if loaded is None:
            raise NotFoundError(cid)
        assert loaded.events is not None
        return self._compose(cid, loaded, None), loaded.events

    def _compose(self, cid: UUID, loaded: Tail, max_tool_result_tokens: int | None) -> Context:
        return compose_context(
            cid,
            boundary=loaded.boundary,
            tail=loaded.messages,
            last_seq=loaded.last_seq,
            estimator=self.estimator,
            max_tool_result_tokens=max_tool_result_tokens,
            boundary_seq=loaded.boundary_seq,
        )

    # ---- the compaction worker's queue ----------------------------------------------------

    async def claim_due(self, owner: str, *, limit: int, lease_seconds: float) -> list[Claim]:
        """Lease up to ``limit`` conversations due for compaction and count the attempt, in
        one call (on PostgreSQL each candidate is leased with ``FOR UPDATE SKIP LOCKED`` on its
        own row, also on Citus): any number of workers can share the queue without waiting
        on each other, and a crashed worker's lease simply expires. ``lease_seconds`` is
        above 0 and at most :data:`MAX_LEASE_SECONDS` (a week); ``limit`` at most 10,000."""
        await self._ready()
        check_lease(owner, lease_seconds)
        check_limit(limit)
        return await self._backend.claim(owner, limit, lease_seconds)

    async def claim_conversation(
        self,
        conversation_id: UUID | str,
        owner: str,
        *,
        lease_seconds: float,
        reason: str = "manual_recovery",
    ) -> Claim | None:
        """Lease one conversation now, due or not, for an operator-forced compaction. None
        when a worker holds its lease; :class:`NotFoundError` when it does not exist."""
        await self._ready()
        cid = parse_conversation_id(conversation_id)
        check_lease(owner, lease_seconds)
        check_text(reason, field="reason", max_length=MAX_CLAIM_TEXT_LENGTH)
        claim = await self._backend.claim_conversation(cid, owner, lease_seconds, reason)
        if claim is None:
            await self.get_conversation(cid)  # raises NotFoundError for an unknown id
        return claim

    async def listen_for_due(self, wake: Callable[[], None]) -> Closer | None:
        """Call ``wake`` whenever a conversation becomes due (PostgreSQL NOTIFY). Returns a
        coroutine function that stops listening, or None where only polling works."""
        await self._ready()
        return await self._backend.listen_for_due(wake)

    async def end_attempt(
        self, claim: Claim, end: AttemptEnd, attempt: AttemptRecord
    ) -> AttemptOutcome:
        """Finish an attempt that wrote no boundary: release the lease, schedule the retry or
        the dead state, and record the attempt, all fenced by the lease token. Returns the
        outcome recorded (``lease_lost`` when another worker holds the lease now)."""
        await self._ready()
        self._refuse_other_tenant(
            claim.tenant_id,
            f"the claim on conversation {claim.conversation_id} is tenant {claim.tenant_id!r}'s",
        )
        return await self._backend.end_attempt(claim, end, attempt)

    async def mark_due_by_age(self) -> int:
        """The periodic sweep: mark due the conversations whose context is old enough for the
        age rule. Returns how many became due (the backend's ``sweep_due``)."""
        await self._ready()
        return await self._backend.sweep_due(self.trigger)

    async def compaction_status(self, *, recent: int = 10, limit: int = 50) -> CompactionStatus:
        """Counts of due, leased, failing and dead conversations, up to ``limit`` of those
        conversations (dead first, then leased, failing, due), and the ``recent`` latest
        attempts. The scoped tenant's only, for a scoped store."""
        await self._ready()
        check_int(recent, field="recent", low=0, high=MAX_READ_LIMIT)
        check_int(limit, field="limit", low=0, high=MAX_READ_LIMIT)
        return await retry_transient(lambda: self._backend.queue_status(recent, limit), safe=True)

    async def pressure(
        self, conversation_id: UUID | str, *, now: datetime | None = None
    ) -> EpisodicCompactionPressure:
        """The compaction pressure, from the head row alone (no scan of the log).

        ``estimated_context_tokens`` is the larger of the stored estimate of the current
        context and the latest provider-reported ``input_tokens`` plus what was appended
        after it. A summarizer's own usage never counts here.
        """
        return self.pressure_of(await self.get_conversation(conversation_id), now=now)

    @staticmethod
    def pressure_of(
        head: Conversation, *, now: datetime | None = None
    ) -> EpisodicCompactionPressure:
        """The compaction pressure of a head already read (:meth:`get_conversation`), with
        no read of its own."""
        return pressure_from(
            counters_of(head),
            created_at=head.created_at,
            boundary_at=head.boundary_at,
            now=now or datetime.now(UTC),
        )


def _stored_batch(
    cid: UUID, batch: PreparedBatch, first_seq: int, created_at: datetime
) -> list[MessageEvent]:
    created = utc(created_at)
    # Built from the batch's messages, validated moments ago: no validation again.
    return [
        construct_valid(
            MessageEvent,
            {
                "conversation_id": cid,
                "seq": first_seq + index,
                "created_at": created,
                "token_estimate": tokens,
                "kind": "message",
                "message": construct_valid(
                    Message,
                    {
                        **message.__dict__,
                        "seq": first_seq + index,
                        "created_at": created,
                        "token_estimate": tokens,
                    },
                ),
                "usage": batch.usage if index == 0 else None,
            },
        )
        for index, (message, tokens) in enumerate(
            zip(batch.messages, batch.token_estimates, strict=True)
        )
    ]


#: Rounds of (erase the tenant's conversations, then its shared state) before erase_tenant
#: gives up on a tenant that keeps gaining conversations.
ERASE_TENANT_ROUNDS = 5


def _listing(app_name: str | None, user_id: str | None) -> tuple[str, str] | None:
    if app_name is None and user_id is None:
        return None
    if app_name is None or user_id is None:
        raise ValidationError(
            "a conversation is listed under an app and a user: give both app_name and "
            "user_id, or neither",
            field="app_name" if app_name is None else "user_id",
        )
    check_text(app_name, field="app_name", max_length=MAX_LISTING_LENGTH)
    check_text(user_id, field="user_id", max_length=MAX_LISTING_LENGTH, min_length=0)
    return app_name, user_id


def _raise_for_refusal(
    cid: UUID, result: WriteOutcome, *, expected_seq: int | None, key: str | None
) -> None:
    outcome = result.outcome
    if outcome in ("appended", "replayed"):
        return
    if outcome == "not_found":
        raise NotFoundError(cid)
    if outcome == "deleted":
        raise ConversationDeletedError(cid)
    if outcome == "conflict":
        raise ConflictError(
            f"conversation {cid} is at seq {result.seq}, not the expected {expected_seq}; "
            "nothing was written. Reload and decide again.",
            conversation_id=cid,
            expected_seq=expected_seq,
            actual_seq=result.seq,
        )
    if outcome == "idempotency_mismatch":
        used = f"idempotency key {key!r}" if key is not None else "the first message's client id"
        raise IdempotencyMismatchError(
            f"{used} was already used in conversation {cid} for a different batch "
            f"(stored at seq {result.seq}); use a new key for a new request",
            conversation_id=cid,
            key=key or "",
        )
    if outcome == "client_id_reused":
        raise IdempotencyMismatchError(
            f"client id {result.detail!r} is already used by another message in conversation "
            f"{cid}; client ids must be unique within a conversation",
            conversation_id=cid,
            key=result.detail or "",
        )
    if outcome == "duplicate_tool_call":
        raise DuplicateToolCallError(conversation_id=cid, tool_call_id=result.detail or "")
    if outcome in ("orphan", "orphan_abandoned"):
        raise OrphanToolResultError(
            conversation_id=cid,
            tool_call_id=result.detail or "",
            abandoned=outcome == "orphan_abandoned",
        )
    raise AssertionError(f"unknown write outcome {outcome!r}")


def _what_event(event: StoredEvent) -> str:
    if isinstance(event, MessageEvent):
        return f"{event.message.role} message that is not pinned"
    return f"{event.kind} event"


__all__ = [
    "DEFAULT_TENANT",
    "MAX_CLAIM_TEXT_LENGTH",
    "MAX_LEASE_SECONDS",
    "MAX_READ_LIMIT",
    "MAX_TENANT_ID_LENGTH",
    "EpisodicStore",
    "parse_conversation_id",
]
