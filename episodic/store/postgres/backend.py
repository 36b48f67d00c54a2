"""The PostgreSQL backend: asyncpg directly on the request path.

Appends, run completions and loads are one call each to a PL/pgSQL function (defined in
``postgres/schema.sql``, created by the migrations), by parameter name, so each is one round trip
with no explicit BEGIN/COMMIT; asyncpg prepares each statement once per connection and reuses
it. SQLAlchemy is used only to run the migrations.

A backend scoped to a tenant (``for_tenant``) passes the tenant as the functions' ``p_scope``,
which they set for row-level security inside the same statement, so scoping adds no round trip
on the request path or in the worker; the operator's operations that are no function
(listing, paging events, status) run in a transaction that sets the tenant first.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from episodic.errors import ConflictError, ErasedConversationError, SchemaNotMigratedError
from episodic.models import Conversation, StoredEvent
from episodic.policy import EpisodicCompactionConfig
from episodic.store.attempts import (
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    Claim,
    CompactionQueueEntry,
    CompactionStatus,
    StoreLayout,
)
from episodic.store.backend import (
    BoundaryPlanner,
    Closer,
    CreateOutcome,
    NewConversation,
    PlanEvent,
    WriteOutcome,
)
from episodic.store.batch import PreparedBatch
from episodic.store.boundaries import BoundaryWrite
from episodic.store.codec import (
    Tail,
    decode_conversation,
    decode_event_row,
    decode_head_state,
    decode_tail,
)
from episodic.store.db_errors import connection_refused, translated, translated_errors
from episodic.store.engine import DatabaseUrl, dsn_hosts
from episodic.store.erasure import Erasure, erasure_from_row
from episodic.store.export_format import ConversationHeader, EventRow, HeadImage, SharedStateRow
from episodic.store.migrate import SchemaMigration, upgrade_to_head
from episodic.store.planned_events import PlannedEvent
from episodic.store.postgres.citus import (
    CITUS_INSTALLED,
    DEFAULT_SHARD_COUNT,
    LAYOUT,
    WORKER_NODES,
    on_node,
)
from episodic.store.postgres.coalesce import AppendCoalescer, CallRolledBack
from episodic.store.postgres.listen import DueListener
from episodic.store.postgres.pool import Pool
from episodic.store.postgres.queries import (
    APPEND,
    APPEND_MANY,
    APPEND_WITH_STATE,
    ATTEMPT_ROWS,
    BOUNDARY_WRITE_TRIES,
    CLAIM,
    CLAIM_CONVERSATION,
    CONVERSATION_IDS,
    CREATE_CONVERSATION,
    DUE_CHANNEL,
    END_ATTEMPT,
    ERASE_CONVERSATION,
    ERASE_TENANT,
    ERASED_SQLSTATE,
    EVENT_ROWS,
    HEAD,
    IMPORT_ATTEMPTS,
    IMPORT_EVENTS,
    IMPORT_HEAD,
    LIST_BY_USER,
    LIST_CONVERSATIONS,
    LOAD_TAIL,
    MARK_RUN_COMPLETED,
    QUEUE,
    QUEUE_COUNTS,
    READ_EVENTS,
    READ_HEAD,
    READ_REVISION,
    READ_STATE,
    READ_TAIL_AFTER,
    RECENT_ATTEMPTS,
    SEARCH_EVENTS,
    SET_TENANT,
    SHARED_STATES,
    SWEEP_DUE,
    TENANT_NOT_EMPTY_SQLSTATE,
    WRITE_BOUNDARY,
    WRITE_EVENT,
    WRITE_SHARED_STATES,
)
from episodic.store.state import StateSnapshot

T = TypeVar("T")


def _json_default(value: object) -> str:
    # asyncpg hands back its own UUID type (a claim's conversation id), which orjson does not
    # take for a uuid.UUID.
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _encode_json(value: object) -> str:
    return orjson.dumps(value, default=_json_default).decode()


async def _init_connection(connection: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await connection.set_type_codec(
            name, encoder=_encode_json, decoder=orjson.loads, schema="pg_catalog"
        )


def connector(url: str, timeout: float) -> Callable[..., Awaitable[asyncpg.Connection]]:
    """``asyncpg.connect(dsn, ...)`` for the pools and the listener (the key store's lookups
    too), with a refused connection raised as the
    :class:`~episodic.errors.DatabaseUnavailableError` that says what to fix, however deep in
    a pool it was opened.

    A DSN naming several hosts is tried host by host, each given ``timeout`` (libpq's
    ``connect_timeout`` semantics): asyncpg's own timeout spans every host, so a primary that
    stopped answering without refusing (a frozen machine, a dropped route) would use it all
    up and the standby after it would never be tried."""

    async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
        kwargs.setdefault("timeout", timeout)
        hosts = dsn_hosts(dsn)
        try:
            if not hosts:
                return await asyncpg.connect(dsn, **kwargs)
            failure: Exception | None = None
            for host, port in hosts:
                try:
                    return await asyncpg.connect(dsn, host=host, port=port, **kwargs)
                except (OSError, TimeoutError, asyncpg.TargetServerAttributeNotMatched) as exc:
                    failure = exc  # down, silent or not writable: the next host
            assert failure is not None
            raise failure
        except Exception as exc:
            refused = connection_refused(exc, url, several_hosts=bool(hosts))
            if refused is None:
                raise
            raise refused from exc

    return connect


#: One append as a coalesced call sends it: the values of APPEND_REQUEST, in order.
AppendRequest = tuple[Any, ...]
#: What the appends of one call share: the tenant they are scoped to, and the trigger.
AppendKey = tuple[str | None, EpisodicCompactionConfig]


class PostgresBackend:
    dialect = "postgresql"

    def __init__(
        self,
        url: DatabaseUrl,
        pool: Pool,
        connect: Callable[..., Awaitable[asyncpg.Connection]],
        tenant: str | None = None,
        appends: AppendCoalescer[AppendRequest, AppendKey, WriteOutcome] | None = None,
        citus_shard_count: int = DEFAULT_SHARD_COUNT,
        distributed: bool = False,
    ) -> None:
        self._url = url
        self._pool = pool
        self._connect = connect
        #: shared by every backend on this pool, whatever its tenant (None: no coalescing)
        self._appends = appends
        #: None: whatever the connecting role may see (everything, for a superuser or an
        #: episodic_all_tenants member). Else every statement runs under this tenant.
        self.tenant = tenant
        self.location = url.masked
        self._citus_shard_count = citus_shard_count
        #: the database has the citus extension: its tables are (or will be, once migrated)
        #: distributed, and its delegated calls run on the worker nodes
        self.distributed = distributed

    def for_tenant(self, tenant: str) -> PostgresBackend:
        """The same pool, every operation scoped to ``tenant``."""
        return PostgresBackend(
            self._url,
            self._pool,
            self._connect,
            tenant,
            self._appends,
            self._citus_shard_count,
            self.distributed,
        )

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; for a scoped backend, inside a transaction whose tenant is
        set (transaction-local, so it ends with the transaction)."""
        async with self._pool.acquire() as connection:
            if self.tenant is None:
                yield connection
                return
            async with connection.transaction():
                await connection.execute(SET_TENANT, self.tenant)
                yield connection

    @classmethod
    async def connect(
        cls,
        url: DatabaseUrl,
        *,
        min_size: int = 1,
        max_size: int = 10,
        server_settings: dict[str, str] | None = None,
        connect_timeout: float = 10.0,
        append_calls: int = 2,
        citus_shard_count: int = DEFAULT_SHARD_COUNT,
    ) -> PostgresBackend:
        connect = connector(url.masked, connect_timeout)
        dsn = url.asyncpg

        async def pooled() -> asyncpg.Connection:
            connection = await connect(dsn, server_settings=server_settings)
            try:
                await _init_connection(connection)
            except BaseException:
                connection.terminate()
                raise
            return connection

        with translated_errors():
            pool = await Pool.open(pooled, min_size=min_size, max_size=max_size)
            distributed = bool(await pool.fetchval(CITUS_INSTALLED))
        # On Citus each append is its own call, delegated to the node holding its
        # conversation; a coalesced call spans conversations, so it would run on the
        # coordinator and route every statement of every append from there.
        coalesce = append_calls > 0 and not distributed
        appends = _coalescer(pool, append_calls) if coalesce else None
        return cls(
            url,
            pool,
            connect,
            appends=appends,
            citus_shard_count=citus_shard_count,
            distributed=distributed,
        )

    async def migrate(self) -> SchemaMigration:
        engine = create_async_engine(
            self._url.sqlalchemy, poolclass=NullPool, async_creator=self._migration_connection
        )
        try:
            with translated_errors():
                return await upgrade_to_head(engine, citus_shard_count=self._citus_shard_count)
        finally:
            await engine.dispose()

    async def _migration_connection(self) -> asyncpg.Connection:
        # Alembic's connection is opened like the pool's, so a refusal reads the same.
        assert self._url.asyncpg is not None
        return await self._connect(self._url.asyncpg)

    async def schema_revision(self) -> str | None:
        """The database's schema revision; None when it has no episodic schema."""
        with translated_errors():
            try:
                revision: str | None = await self._pool.fetchval(READ_REVISION)
                return revision
            except asyncpg.UndefinedTableError:
                return None
            except asyncpg.InsufficientPrivilegeError as exc:
                raise SchemaNotMigratedError(
                    f"the database {self.location} does not let this role read its schema "
                    "revision: it is older than this episodic, or the role is not granted "
                    "episodic_app, episodic_worker or episodic_all_tenants; run `episodic "
                    "migrate` as the tables' owner",
                    revision=None,
                    expected=None,
                ) from exc

    async def create_conversation(self, new: NewConversation) -> CreateOutcome:
        app_name, user_id = new.listed if new.listed is not None else (None, None)
        with translated_errors():
            try:
                outcome: CreateOutcome = await self._pool.fetchval(
                    CREATE_CONVERSATION,
                    new.conversation_id,
                    new.tenant_id,
                    new.created_at,
                    new.metadata,
                    self.tenant,
                    app_name,
                    user_id,
                    new.touched_at,
                    new.state_json,
                    new.reuse_erased,
                )
            except asyncpg.PostgresError as exc:
                if exc.sqlstate != ERASED_SQLSTATE:
                    raise
                return "erased"
        return outcome

    async def erase_conversation(
        self, conversation_id: UUID, erasure_id: UUID, reason: str
    ) -> Erasure | None:
        with translated_errors():
            row = await self._pool.fetchrow(
                ERASE_CONVERSATION, conversation_id, erasure_id, reason, self.tenant
            )
        return erasure_from_row(row) if row is not None else None

    async def erase_tenant(
        self,
        tenant_id: str,
        erasure_id: UUID,
        reason: str,
        totals: tuple[int, int, int],
    ) -> Erasure | None:
        with translated_errors():
            try:
                row = await self._pool.fetchrow(
                    ERASE_TENANT, tenant_id, erasure_id, reason, *totals
                )
            except asyncpg.PostgresError as exc:
                if exc.sqlstate != TENANT_NOT_EMPTY_SQLSTATE:
                    raise
                return None
        assert row is not None
        return erasure_from_row(row)

    async def conversation_ids(self, tenant_id: str, after: UUID | None, limit: int) -> list[UUID]:
        with translated_errors():
            async with self.for_tenant(tenant_id)._session() as connection:
                rows = await connection.fetch(CONVERSATION_IDS, tenant_id, after, limit)
        return [row[0] for row in rows]

    async def read_event_rows(
        self, conversation_id: UUID, after_seq: int, through_seq: int, limit: int
    ) -> list[EventRow]:
        with translated_errors():
            async with self._session() as connection:
                rows = await connection.fetch(
                    EVENT_ROWS, conversation_id, after_seq, through_seq, limit, self.tenant
                )
        return [EventRow(*row) for row in rows]

    async def read_attempts(self, conversation_id: UUID) -> list[AttemptRecord]:
        with translated_errors():
            async with self._session() as connection:
                rows = await connection.fetch(ATTEMPT_ROWS, conversation_id, self.tenant)
        return [AttemptRecord(**dict(row)) for row in rows]

    async def read_shared_states(self, tenant_id: str) -> list[SharedStateRow]:
        with translated_errors():
            async with self.for_tenant(tenant_id)._session() as connection:
                rows = await connection.fetch(SHARED_STATES, tenant_id)
        return [SharedStateRow(*row) for row in rows]

    async def write_shared_states(self, rows: Sequence[SharedStateRow]) -> None:
        by_tenant: dict[str, list[SharedStateRow]] = {}
        for row in rows:
            by_tenant.setdefault(row.tenant_id, []).append(row)
        with translated_errors():
            async with self._pool.acquire() as connection, connection.transaction():
                for tenant, scoped in by_tenant.items():
                    await connection.execute(SET_TENANT, tenant)
                    await connection.execute(
                        WRITE_SHARED_STATES,
                        [row.tenant_id for row in scoped],
                        [row.scope for row in scoped],
                        [row.state for row in scoped],
                        [row.updated_at for row in scoped],
                    )

    @asynccontextmanager
    async def importing(
        self, header: ConversationHeader, tenant_id: str, *, reuse_erased: bool
    ) -> AsyncIterator[_PostgresImport]:
        cid = header.conversation_id
        with translated_errors():
            async with self._pool.acquire() as connection, connection.transaction():
                try:
                    outcome = await connection.fetchval(
                        CREATE_CONVERSATION,
                        cid,
                        tenant_id,
                        header.created_at,
                        header.metadata,
                        tenant_id,
                        header.app_name,
                        header.user_id,
                        header.touched_at,
                        None,
                        reuse_erased,
                    )
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate != ERASED_SQLSTATE:
                        raise
                    raise ErasedConversationError(cid) from None
                if outcome == "taken":
                    raise ConflictError(f"conversation {cid} already exists", conversation_id=cid)
                yield _PostgresImport(connection, cid, tenant_id)

    async def read_state(
        self, conversation_id: UUID | None, tenant_id: str, scopes: Sequence[str]
    ) -> StateSnapshot | None:
        with translated_errors():
            rows = await self._pool.fetch(
                READ_STATE, conversation_id, tenant_id, list(scopes), self.tenant
            )
        own = next((row for row in rows if row[0] is None), None)
        if conversation_id is not None and own is None:
            return None
        return StateSnapshot(
            conversation=own[1] if own is not None else {},
            shared={row[0]: row[1] for row in rows if row[0] is not None},
            last_seq=own[2] if own is not None else None,
            touched_at=own[3] if own is not None else None,
        )

    async def list_by_user(
        self,
        tenant_id: str,
        app_name: str,
        user_id: str | None,
        after: tuple[str, UUID] | None,
        limit: int,
    ) -> list[Conversation]:
        after_user, after_id = after if after is not None else (None, None)
        with translated_errors():
            rows = await self._pool.fetch(
                LIST_BY_USER, tenant_id, app_name, user_id, after_user, after_id, limit,
                self.tenant,
            )  # fmt: skip
        return [decode_conversation(row) for row in rows]

    async def append(
        self, conversation_id: UUID, batch: PreparedBatch, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome:
        request = (
            conversation_id,
            batch.expected_seq,
            batch.idempotency_key,
            batch.request_hash,
            batch.payloads,
            batch.token_estimates,
            # NULL, not an array, where there is nothing: most batches (see episodic_append).
            batch.client_ids if any(batch.client_ids) else None,
            batch.usage_json,
            batch.usage_input_tokens,
            batch.user_messages,
            batch.token_sum,
            batch.called_ids or None,
            batch.opened_ids or None,
            batch.opened_offsets or None,
            batch.closed_ids or None,
        )
        if batch.state_json is not None or batch.touched_at is not None:
            return await _write(
                self._pool,
                APPEND_WITH_STATE,
                *request,
                trigger_document(trigger),
                self.tenant,
                batch.state_json,
                batch.touched_at,
            )
        if self._appends is None:
            return await _write(
                self._pool, APPEND, *request, trigger_document(trigger), self.tenant
            )
        return await self._appends.append(request, (self.tenant, trigger))

    async def mark_run_completed(
        self, conversation_id: UUID, tokens_per_abandoned: int, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome:
        return await _write(
            self._pool,
            MARK_RUN_COMPLETED,
            conversation_id,
            tokens_per_abandoned,
            trigger_document(trigger),
            self.tenant,
        )

    async def write_boundary(
        self, conversation_id: UUID, planner: BoundaryPlanner
    ) -> BoundaryWrite | None:
        async def attempt(connection: asyncpg.Connection) -> tuple[bool, BoundaryWrite | None]:
            return await self._try_boundary(connection, conversation_id, planner)

        return await self._until_written(conversation_id, "its boundary", attempt)

    async def _until_written(
        self,
        conversation_id: UUID,
        what: str,
        attempt: Callable[[asyncpg.Connection], Awaitable[tuple[bool, T]]],
    ) -> T:
        """Run ``attempt`` (read, plan, write if nothing moved: done and its result) until it
        is done, at most :data:`BOUNDARY_WRITE_TRIES` times."""
        for _ in range(BOUNDARY_WRITE_TRIES):
            with translated_errors():
                async with self._pool.acquire() as connection:
                    done, result = await attempt(connection)
            if done:
                return result
        raise ConflictError(
            f"conversation {conversation_id} kept changing while {what} was written "
            f"({BOUNDARY_WRITE_TRIES} tries); nothing was written",
            conversation_id=conversation_id,
        )

    async def _try_boundary(
        self, connection: asyncpg.Connection, conversation_id: UUID, planner: BoundaryPlanner
    ) -> tuple[bool, BoundaryWrite | None]:
        """One optimistic try: (done, write). Done with None when the conversation is not
        there; not done when it changed between the reads and the write."""
        head = await connection.fetchrow(READ_HEAD, conversation_id, self.tenant)
        rows = await connection.fetch(
            READ_TAIL_AFTER, conversation_id, planner.covers_through_seq, self.tenant
        )
        if head is None or head["deleted_at"] is not None:
            return True, None
        # The tail was read a moment after the head: keep it consistent with the head read
        # (the conditional write refuses if the head moved, and the loop plans again).
        last = head["last_seq"]
        tail = [
            decode_event_row(conversation_id, row)
            for row in rows
            if row["seq"] is not None and row["seq"] <= last
        ]
        write = planner.plan(decode_head_state(head), tail, head["database_now"])
        event, after = write.event, write.counters
        attempt = planner.attempt
        done = attempt.with_boundary(event.seq, event.tokens_after) if attempt else None
        written = await connection.fetchval(
            WRITE_BOUNDARY,
            conversation_id,
            head["last_seq"],
            head["boundary_seq"],
            write.lease_token,
            event.seq,
            after.covers_through_seq,
            after.user_messages_since_boundary,
            after.run_completed_since_boundary,
            after.user_messages_since_run_completed,
            after.context_tokens,
            event.created_at,
            event.token_estimate,
            write.payload,
            done.row() if done is not None else None,
            self.tenant,
        )
        return (True, write) if written else (False, None)

    async def write_event(
        self, conversation_id: UUID, plan: PlanEvent, trigger: EpisodicCompactionConfig
    ) -> tuple[bool, PlannedEvent | None]:
        async def attempt(
            connection: asyncpg.Connection,
        ) -> tuple[bool, tuple[bool, PlannedEvent | None]]:
            return await self._try_event(connection, conversation_id, plan, trigger)

        return await self._until_written(conversation_id, "an event", attempt)

    async def _try_event(
        self,
        connection: asyncpg.Connection,
        conversation_id: UUID,
        plan: PlanEvent,
        trigger: EpisodicCompactionConfig,
    ) -> tuple[bool, tuple[bool, PlannedEvent | None]]:
        """One optimistic try, like :meth:`_try_boundary`: (done, (found, written))."""
        head = await connection.fetchrow(READ_HEAD, conversation_id, self.tenant)
        if head is None or head["deleted_at"] is not None:
            return True, (False, None)
        rows = await connection.fetch(READ_TAIL_AFTER, conversation_id, None, self.tenant)
        state = decode_head_state(head)
        last = state.counters.last_seq
        tail = [
            decode_event_row(conversation_id, row)
            for row in rows
            if row["seq"] is not None and row["seq"] <= last
        ]
        planned = plan(state, tail, head["database_now"])
        if planned is None:
            return True, (True, None)
        event, after = planned.event, planned.counters
        written = await connection.fetchval(
            WRITE_EVENT,
            conversation_id,
            last,
            event.seq,
            event.kind,
            event.created_at,
            planned.payload,
            after.covers_through_seq,
            after.total_user_messages,
            after.user_messages_since_boundary,
            after.run_completed_since_boundary,
            after.user_messages_since_run_completed,
            after.context_tokens,
            after.usage_input_tokens,
            after.tokens_since_usage,
            dict(after.open_tool_calls),
            planned.context_since,
            trigger_document(trigger),
            self.tenant,
        )
        return bool(written), (True, planned)

    async def claim(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        with translated_errors():
            rows = await self._pool.fetch(CLAIM, limit, owner, float(lease_seconds), self.tenant)
        return [_claim(row) for row in rows]

    async def claim_conversation(
        self, conversation_id: UUID, owner: str, lease_seconds: float, reason: str
    ) -> Claim | None:
        with translated_errors():
            row = await self._pool.fetchrow(
                CLAIM_CONVERSATION,
                conversation_id,
                owner,
                float(lease_seconds),
                reason,
                self.tenant,
            )
        return _claim(row) if row is not None else None

    async def listen_for_due(self, wake: Callable[[], None]) -> Closer:
        # A dedicated connection: LISTEN is session state, which pooled connections must
        # not carry (the pool gives them back as they are, with no reset: episodic leaves no
        # session state behind, its settings and advisory locks being transaction-local).
        # It is opened again when it is lost (store/postgres/listen.py).
        # On Citus a delegated append runs, and so sends its NOTIFY, on the worker node that
        # holds the conversation (when its transaction commits there): one listener per node.
        dsn = self._url.asyncpg
        assert dsn is not None
        dsns = [dsn]
        with translated_errors():
            if self.distributed:
                nodes = await self._pool.fetch(WORKER_NODES)
                dsns += [on_node(dsn, row["nodename"], row["nodeport"]) for row in nodes]
            listeners = [
                DueListener(self._listener_connect(one), DUE_CHANNEL, wake) for one in dsns
            ]
            try:
                for listener in listeners:
                    await listener.start()
            except BaseException:
                for listener in listeners:
                    await listener.close()
                raise

        async def close() -> None:
            for listener in listeners:
                await listener.close()

        return close

    def _listener_connect(self, dsn: str) -> Callable[[], Awaitable[asyncpg.Connection]]:
        return lambda: self._connect(dsn)

    async def end_attempt(
        self, claim: Claim, end: AttemptEnd, attempt: AttemptRecord
    ) -> AttemptOutcome:
        with translated_errors():
            async with self._pool.acquire() as connection:
                outcome: AttemptOutcome = await connection.fetchval(
                    END_ATTEMPT,
                    claim.conversation_id,
                    claim.lease_token,
                    end.clear_due,
                    float(end.retry_in),
                    end.dead,
                    attempt.row(),
                    self.tenant,
                )
        return outcome

    async def sweep_due(self, trigger: EpisodicCompactionConfig) -> int:
        with translated_errors():
            rows = await self._pool.fetch(SWEEP_DUE, trigger_document(trigger))
        return len(rows)

    async def queue_status(self, recent: int, limit: int) -> CompactionStatus:
        with translated_errors():
            async with self._session() as connection:
                counts = await connection.fetchrow(QUEUE_COUNTS, self.tenant)
                queue = await connection.fetch(QUEUE, limit, self.tenant)
                attempts = await connection.fetch(RECENT_ATTEMPTS, recent, self.tenant)
            layout = StoreLayout()
            if self.distributed:
                layout = StoreLayout.model_validate(dict(await self._pool.fetchrow(LAYOUT)))
        return CompactionStatus(
            due=counts["due"],
            leased=counts["leased"],
            failing=counts["failing"],
            dead=counts["dead"],
            conversations=[CompactionQueueEntry.model_validate(dict(row)) for row in queue],
            recent_attempts=[dict(row) for row in attempts],
            layout=layout,
        )

    async def load_tail(
        self, conversation_id: UUID, *, with_events: bool, stored: bool = False
    ) -> Tail | None:
        with translated_errors():
            rows = await self._pool.fetch(LOAD_TAIL, conversation_id, self.tenant)
        if not rows:
            return None
        first = rows[0]
        return decode_tail(
            conversation_id,
            rows if first["seq"] is not None else (),
            last_seq=first["last_seq"],
            boundary_seq=first["boundary_seq"],
            with_events=with_events,
            stored=stored,
        )

    async def read_events(
        self, conversation_id: UUID, after_seq: int, limit: int
    ) -> list[StoredEvent]:
        with translated_errors():
            async with self._session() as connection:
                rows = await connection.fetch(
                    READ_EVENTS, conversation_id, after_seq, limit, self.tenant
                )
        return [decode_event_row(conversation_id, row) for row in rows]

    async def search_events(
        self, conversation_id: UUID, terms: Sequence[str], limit: int
    ) -> list[StoredEvent]:
        with translated_errors():
            async with self._session() as connection:
                rows = await connection.fetch(
                    SEARCH_EVENTS, conversation_id, list(terms), limit, self.tenant
                )
        return [decode_event_row(conversation_id, row) for row in rows]

    async def head(self, conversation_id: UUID) -> Conversation | None:
        with translated_errors():
            row = await self._pool.fetchrow(HEAD, conversation_id, self.tenant)
        return decode_conversation(row) if row is not None else None

    async def list_conversations(self, limit: int, before: UUID | None) -> list[Conversation]:
        with translated_errors():
            async with self._session() as connection:
                rows = await connection.fetch(LIST_CONVERSATIONS, self.tenant, limit, before)
        return [decode_conversation(row) for row in rows]

    async def close(self) -> None:
        await self._pool.close()


class _PostgresImport:
    """An import's writes, on the connection whose transaction created the head."""

    def __init__(self, connection: asyncpg.Connection, conversation_id: UUID, tenant: str):
        self._connection = connection
        self._cid = conversation_id
        self._tenant = tenant

    async def add_events(self, rows: Sequence[EventRow]) -> None:
        columns = list(zip(*((
            r.seq, r.kind, r.created_at, r.token_estimate, r.payload, r.usage, r.client_id,
            r.idempotency_key, r.request_hash, r.batch_size,
        ) for r in rows), strict=True))  # fmt: skip
        await self._connection.execute(
            IMPORT_EVENTS, self._cid, self._tenant, *(list(column) for column in columns)
        )

    async def add_attempts(self, records: Sequence[AttemptRecord]) -> None:
        await self._connection.execute(
            IMPORT_ATTEMPTS, [{**record.row(), "tenant_id": self._tenant} for record in records]
        )

    async def finish(self, head: HeadImage, touched_at: float | None) -> None:
        c = head.counters
        await self._connection.execute(
            IMPORT_HEAD,
            self._cid,
            c.last_seq,
            c.boundary_seq,
            c.covers_through_seq,
            c.total_user_messages,
            c.user_messages_since_boundary,
            c.run_completed_since_boundary,
            c.user_messages_since_run_completed,
            c.context_tokens,
            c.usage_input_tokens,
            c.tokens_since_usage,
            dict(c.open_tool_calls),
            head.state or None,
            head.boundary_at,
            head.deleted_at,
            touched_at,
        )


async def _write(pool: Pool, statement: str, *arguments: Any) -> WriteOutcome:
    """A request-path write: one call that answers an outcome row (not an exception)."""
    try:
        row = await pool.fetchrow(statement, *arguments)
    except Exception as exc:
        raise translated(exc) from exc
    return _outcome(row)


def _outcome(row: Any) -> WriteOutcome:
    # By position: the OUTCOME columns, in order (after o_index in a coalesced call's rows).
    return WriteOutcome(row[-4], row[-3], row[-2], row[-1])


async def _append_one(pool: Pool, request: AppendRequest, key: AppendKey) -> WriteOutcome:
    tenant, trigger = key
    return await _write(pool, APPEND, *request, trigger_document(trigger), tenant)


def _coalescer(pool: Pool, calls: int) -> AppendCoalescer[AppendRequest, AppendKey, WriteOutcome]:
    """Appends on ``pool``, at most ``calls`` calls at once; the others together."""

    def one(request: AppendRequest, key: AppendKey) -> Awaitable[WriteOutcome]:
        return _append_one(pool, request, key)

    async def many(requests: Sequence[AppendRequest], key: AppendKey) -> list[WriteOutcome]:
        tenant, trigger = key
        try:
            rows = await pool.fetch(APPEND_MANY, requests, trigger_document(trigger), tenant)
        except asyncpg.PostgresError as exc:  # the server's: the statement rolled back
            raise CallRolledBack from exc
        except Exception as exc:
            raise translated(exc) from exc
        by_index = {row[0]: _outcome(row) for row in rows}
        return [by_index[index] for index in range(1, len(requests) + 1)]

    return AppendCoalescer(one, many, max_calls=calls)


def _claim(row: Any) -> Claim:
    return Claim(
        conversation_id=row["conversation_id"],
        tenant_id=row["tenant_id"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        attempt=row["compaction_attempts"],
        reason=row["due_reason"] or "manual_recovery",
        boundary_seq=row["boundary_seq"],
        claimed_at=row["claimed_at"],
    )


@functools.lru_cache(maxsize=64)
def trigger_document(trigger: EpisodicCompactionConfig) -> dict[str, Any]:
    """The thresholds as the one jsonb the functions take (computed once per config; the
    driver encodes the dict, never mutated, on each call)."""
    return trigger.model_dump(mode="json")


__all__ = ["PostgresBackend", "connector"]
