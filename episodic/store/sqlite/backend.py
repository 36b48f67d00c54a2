"""The SQLite backend: the embedded default, for the demo and single-process use.

Writes run in ``BEGIN IMMEDIATE`` transactions, which SQLite serializes per database file, so
the same guarantees hold as on PostgreSQL (gapless seqs, batches that never interleave). The
head is advanced with the projection's own fold (store/projection.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import orjson
from sqlalchemy import (
    Select,
    and_,
    column,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    table,
    update,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from episodic.errors import ConflictError, DatabaseUnavailableError, ErasedConversationError
from episodic.models import Conversation, StoredEvent
from episodic.policy import EpisodicCompactionConfig
from episodic.store.attempts import (
    QUEUE_STATES,
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    Claim,
    CompactionQueueEntry,
    CompactionStatus,
    QueueState,
)
from episodic.store.backend import (
    BoundaryPlanner,
    Closer,
    CreateOutcome,
    PlanEvent,
    PlannedEvent,
    WriteOutcome,
)
from episodic.store.batch import PreparedBatch
from episodic.store.boundaries import BoundaryWrite
from episodic.store.codec import (
    EVENT_COLUMNS,
    Tail,
    counter_values,
    decode_conversation,
    decode_counters,
    decode_event_row,
    decode_head_state,
    decode_tail,
    encode_json,
    epoch_seconds,
    json_value,
    utc,
)
from episodic.store.db_errors import translated_errors
from episodic.store.due import CLEARED_COMPACTION_STATE, due_marking, swept
from episodic.store.engine import DatabaseUrl
from episodic.store.erasure import Erasure, erasure_from_row
from episodic.store.export_format import ConversationHeader, EventRow, HeadImage, SharedStateRow
from episodic.store.migrate import SchemaMigration, upgrade_to_head
from episodic.store.projection import HeadCounters
from episodic.store.rules import PriorBatch, abandoned_in, append_refusal, needs_abandoned_calls
from episodic.store.schema import (
    compaction_attempts,
    conversations,
    erasures,
    events,
    shared_state,
)
from episodic.store.state import StateSnapshot

_WRITE = "episodic_write"

sqlite_master = table("sqlite_master", column("name"))
alembic_version = table("episodic_alembic_version", column("version_num"))


def _configure(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so BEGIN is ours to send.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: SyncConnection) -> None:
        # Writers take the write lock up front; a deferred BEGIN that upgrades later can
        # fail with SQLITE_BUSY instead of waiting for the lock.
        immediate = connection.get_execution_options().get(_WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class SqliteBackend:
    dialect = "sqlite"

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        url: DatabaseUrl,
        tenant: str | None = None,
        write_lock: asyncio.Lock | None,
    ) -> None:
        self._engine = engine
        self._url = url
        self._writer = engine.execution_options(**{_WRITE: True})
        # SQLite has one writer at a time. Queueing this process's writers here is fair and
        # prompt; leaving it to the busy handler makes them sleep and poll. Other processes
        # still wait on BEGIN IMMEDIATE.
        self._write_lock = write_lock or asyncio.Lock()
        #: SQLite has no row-level security: a scoped backend filters every read of a head
        #: by this tenant itself, so another tenant's conversation is simply not there.
        self.tenant = tenant

    @property
    def location(self) -> str:
        """The URL, and whether its file is missing (SQLite would create an empty one)."""
        if _missing(self._url.sqlite_path):
            return f"{self._url.masked} (no such file; is the path right?)"
        return self._url.masked

    def for_tenant(self, tenant: str) -> SqliteBackend:
        """The same engine (and write queue), every operation scoped to ``tenant``."""
        return SqliteBackend(
            self._engine, url=self._url, tenant=tenant, write_lock=self._write_lock
        )

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction (BEGIN IMMEDIATE), its errors translated."""
        with translated_errors(self.location):
            async with self._write_lock, self._writer.begin() as conn:
                yield conn

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        """A read, its errors translated."""
        with translated_errors(self.location):
            async with self._engine.connect() as conn:
                yield conn

    @asynccontextmanager
    async def _write_to(
        self, conversation_id: UUID, *, deleted_too: bool = False
    ) -> AsyncIterator[tuple[AsyncConnection, Mapping[str, Any] | None]]:
        """A write transaction and, read in it, the conversation's head (None when it is not
        there, or not this scope's, or deleted unless ``deleted_too``): what every write of
        one conversation starts from."""
        async with self._write() as conn:
            head = await _head(conn, conversation_id, self.tenant)
            if head is not None and head["deleted_at"] is not None and not deleted_too:
                head = None
            yield conn, head

    @classmethod
    async def connect(cls, url: DatabaseUrl) -> SqliteBackend:
        """An engine for ``url``. Connects lazily: a file that does not exist yet is created
        by :meth:`migrate` only, never by a read that mistyped its path."""
        problem = _unopenable(url.sqlite_path)
        if problem is not None:
            raise DatabaseUnavailableError(
                f"cannot open the SQLite database {url.masked}: {problem}; check "
                "EPISODIC_DATABASE_URL (sqlite+aiosqlite:///relative/file.db, or four slashes "
                "for an absolute path)",
                url=url.masked,
            )
        options: dict[str, Any] = {"connect_args": {"timeout": 30}}
        if url.sqlite_path is None:
            # Every connection to :memory: is a new empty database; share one.
            options["poolclass"] = StaticPool
        engine = create_async_engine(url.sqlalchemy, **options)
        _configure(engine)
        return cls(engine, url=url, write_lock=None)

    async def migrate(self) -> SchemaMigration:
        with translated_errors(self.location):
            return await upgrade_to_head(self._writer)

    async def schema_revision(self) -> str | None:
        """The file's schema revision; None when it has no episodic schema or does not exist
        (then it is left uncreated)."""
        if _missing(self._url.sqlite_path):
            return None
        async with self._read() as conn:
            exists = await conn.scalar(
                select(func.count())
                .select_from(sqlite_master)
                .where(sqlite_master.c.name == "episodic_alembic_version")
            )
            if not exists:
                return None
            revision: str | None = await conn.scalar(select(alembic_version.c.version_num))
            return revision

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
        # The twin of episodic_create_conversation. Only a taken or erased id is "not
        # created"; any other refusal is translated as one.
        app_name, user_id = listed if listed is not None else (None, None)
        change = orjson.loads(state_json) if state_json is not None else {}
        statement = (
            sqlite_insert(conversations)
            .values(
                conversation_id=conversation_id,
                tenant_id=tenant_id,
                created_at=created_at,
                metadata=metadata,
                open_tool_calls={},
                app_name=app_name,
                user_id=user_id,
                touched_at=touched_at,
                last_seq=0 if state_json is None else 1,
                state=change.get("conversation"),
            )
            .on_conflict_do_nothing(index_elements=["conversation_id"])
        )
        async with self._write() as conn:
            if not reuse_erased and await _erased(conn, conversation_id, tenant_id):
                return "erased"
            result = await conn.execute(statement)
            if result.rowcount != 1:
                return "taken"
            if state_json is not None:
                # stamped inside the write, as every write to the scopes (one at a time here)
                now = datetime.now(UTC)
                await _apply_shared_state(conn, tenant_id, change.get("shared"), now)
                await _insert_state_event(conn, conversation_id, tenant_id, 1, now, state_json)
        return "created"

    async def erase_conversation(
        self, conversation_id: UUID, erasure_id: UUID, reason: str
    ) -> Erasure | None:
        # The twin of episodic_erase_conversation (SQLite has no roles: "sqlite" erased it).
        async with self._write_to(conversation_id, deleted_too=True) as (conn, head):
            if head is None:
                return await _latest_tombstone(
                    conn, erasures.c.conversation_id == conversation_id, self.tenant
                )
            cid = events.c.conversation_id == conversation_id
            counted = await conn.scalar(select(func.count()).select_from(events).where(cid))
            attempts = compaction_attempts.c.conversation_id == conversation_id
            tried = await conn.scalar(
                select(func.count()).select_from(compaction_attempts).where(attempts)
            )
            tombstone = {
                "erasure_id": erasure_id,
                "tenant_id": head["tenant_id"],
                "conversation_id": conversation_id,
                "conversation_created_at": head["created_at"],
                "reason": reason,
                "conversations": 1,
                "events": counted,
                "compaction_attempts": tried,
                "shared_states": 0,
                "erased_at": datetime.now(UTC),
                "erased_by": "sqlite",
                "erased_xid": None,
            }
            await conn.execute(insert(erasures).values(**tombstone))
            # The delete triggers let a row go when its head is marked with a tombstone's id
            # (in the lease column; see migration 0012): mark it, then the log and the
            # attempts, whose triggers find the mark through the head, which goes last.
            head_row = conversations.c.conversation_id == conversation_id
            await conn.execute(update(conversations).where(head_row).values(lease_token=erasure_id))
            await conn.execute(delete(events).where(cid))
            await conn.execute(delete(compaction_attempts).where(attempts))
            await conn.execute(delete(conversations).where(head_row))
        return erasure_from_row(tombstone)

    async def erase_tenant(
        self,
        tenant_id: str,
        erasure_id: UUID,
        reason: str,
        totals: tuple[int, int, int],
    ) -> Erasure | None:
        async with self._write() as conn:
            left = await conn.scalar(
                select(func.count())
                .select_from(conversations)
                .where(conversations.c.tenant_id == tenant_id)
            )
            if left:
                return None
            scopes = shared_state.c.tenant_id == tenant_id
            states = await conn.scalar(select(func.count()).select_from(shared_state).where(scopes))
            if totals[0] == 0 and states == 0:
                earlier = await _latest_tombstone(
                    conn,
                    and_(erasures.c.tenant_id == tenant_id, erasures.c.conversation_id.is_(None)),
                    None,
                )
                if earlier is not None:
                    return earlier
            await conn.execute(delete(shared_state).where(scopes))
            conversations_erased, events_erased, attempts_erased = totals
            tombstone = {
                "erasure_id": erasure_id,
                "tenant_id": tenant_id,
                "conversation_id": None,
                "conversation_created_at": None,
                "reason": reason,
                "conversations": conversations_erased,
                "events": events_erased,
                "compaction_attempts": attempts_erased,
                "shared_states": states,
                "erased_at": datetime.now(UTC),
                "erased_by": "sqlite",
                "erased_xid": None,
            }
            await conn.execute(insert(erasures).values(**tombstone))
        return erasure_from_row(tombstone)

    async def conversation_ids(self, tenant_id: str, after: UUID | None, limit: int) -> list[UUID]:
        head = conversations.c
        query = select(head.conversation_id).where(head.tenant_id == tenant_id)
        if after is not None:
            query = query.where(head.conversation_id > after)
        async with self._read() as conn:
            rows = await conn.scalars(query.order_by(head.conversation_id).limit(limit))
            return list(rows)

    async def read_event_rows(
        self, conversation_id: UUID, after_seq: int, through_seq: int, limit: int
    ) -> list[EventRow]:
        e = events.c
        query = (
            select(
                e.seq,
                e.kind,
                e.created_at,
                e.token_estimate,
                e.payload,
                e.usage,
                e.client_id,
                e.idempotency_key,
                e.request_hash,
                e.batch_size,
            )
            .where(e.conversation_id == conversation_id, e.seq > after_seq, e.seq <= through_seq)
            .order_by(e.seq)
            .limit(limit)
        )
        if self.tenant is not None:
            query = query.where(e.tenant_id == self.tenant)
        async with self._read() as conn:
            rows = await conn.execute(query)
            return [EventRow(*tuple(row)) for row in rows]

    async def read_attempts(self, conversation_id: UUID) -> list[AttemptRecord]:
        a = compaction_attempts.c
        query = (
            select(compaction_attempts)
            .where(a.conversation_id == conversation_id)
            .order_by(a.finished_at, a.attempt_id)
        )
        if self.tenant is not None:
            query = query.where(a.tenant_id == self.tenant)
        async with self._read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [
            AttemptRecord(
                **{
                    **row,
                    "started_at": utc(row["started_at"]),
                    "finished_at": utc(row["finished_at"]),
                    "usage": json_value(row["usage"]),
                }
            )
            for row in rows
        ]

    async def read_shared_states(self, tenant_id: str) -> list[SharedStateRow]:
        s = shared_state.c
        async with self._read() as conn:
            rows = await conn.execute(
                select(s.tenant_id, s.scope, s.state, s.updated_at)
                .where(s.tenant_id == tenant_id)
                .order_by(s.scope)
            )
            return [
                SharedStateRow(tenant, scope, json_value(state), utc(updated))
                for tenant, scope, state, updated in rows
            ]

    async def write_shared_states(self, rows: Sequence[SharedStateRow]) -> None:
        async with self._write() as conn:
            for row in rows:
                statement = sqlite_insert(shared_state).values(
                    tenant_id=row.tenant_id,
                    scope=row.scope,
                    state=row.state,
                    updated_at=row.updated_at,
                )
                await conn.execute(
                    statement.on_conflict_do_update(
                        index_elements=["tenant_id", "scope"],
                        set_={
                            "state": statement.excluded.state,
                            "updated_at": statement.excluded.updated_at,
                        },
                    )
                )

    @asynccontextmanager
    async def importing(
        self, header: ConversationHeader, tenant_id: str, *, reuse_erased: bool
    ) -> AsyncIterator[_SqliteImport]:
        cid = header.conversation_id
        async with self._write() as conn:
            if not reuse_erased and await _erased(conn, cid, tenant_id):
                raise ErasedConversationError(cid)
            result = await conn.execute(
                sqlite_insert(conversations)
                .values(
                    conversation_id=cid,
                    tenant_id=tenant_id,
                    created_at=header.created_at,
                    metadata=header.metadata,
                    open_tool_calls={},
                    app_name=header.app_name,
                    user_id=header.user_id,
                )
                .on_conflict_do_nothing(index_elements=["conversation_id"])
            )
            if result.rowcount != 1:
                raise ConflictError(f"conversation {cid} already exists", conversation_id=cid)
            yield _SqliteImport(conn, cid, tenant_id)

    async def read_state(
        self, conversation_id: UUID | None, tenant_id: str, scopes: Sequence[str]
    ) -> StateSnapshot | None:
        async with self._read() as conn:
            head = None
            if conversation_id is not None:
                head = await _head(conn, conversation_id, self.tenant)
                if head is None or head["deleted_at"] is not None:
                    return None
                tenant_id = head["tenant_id"]
            elif self.tenant is not None:
                tenant_id = self.tenant
            rows = await conn.execute(
                select(shared_state.c.scope, shared_state.c.state).where(
                    shared_state.c.tenant_id == tenant_id, shared_state.c.scope.in_(list(scopes))
                )
            )
            shared = {scope: state for scope, state in rows}
        return StateSnapshot(
            conversation=(head["state"] or {}) if head is not None else {},
            shared=shared,
            last_seq=head["last_seq"] if head is not None else None,
            touched_at=head["touched_at"] if head is not None else None,
        )

    async def list_by_user(
        self,
        tenant_id: str,
        app_name: str,
        user_id: str | None,
        after: tuple[str, UUID] | None,
        limit: int,
    ) -> list[Conversation]:
        head = conversations.c
        query = (
            select(conversations)
            .where(
                head.tenant_id == (self.tenant or tenant_id),
                head.app_name == app_name,
                head.deleted_at.is_(None),
            )
            .order_by(head.user_id, head.conversation_id)
            .limit(limit)
        )
        if user_id is not None:
            query = query.where(head.user_id == user_id)
        if after is not None:
            after_user, after_id = after
            query = query.where(
                or_(
                    head.user_id > after_user,
                    and_(head.user_id == after_user, head.conversation_id > after_id),
                )
            )
        async with self._read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [decode_conversation(dict(row)) for row in rows]

    async def append(
        self, conversation_id: UUID, batch: PreparedBatch, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome:
        # The same checks, in the same order, as the PostgreSQL function episodic_append.
        async with self._write_to(conversation_id, deleted_too=True) as (conn, head):
            if head is None:
                return WriteOutcome("not_found")
            counters = decode_counters(head)
            if head["deleted_at"] is not None:
                return WriteOutcome("deleted", seq=counters.last_seq)
            prior = None
            if batch.idempotency_key is not None:
                found = (
                    await conn.execute(
                        select(events.c.seq, events.c.created_at, events.c.request_hash).where(
                            events.c.conversation_id == conversation_id,
                            events.c.idempotency_key == batch.idempotency_key,
                        )
                    )
                ).first()
                if found is not None:
                    prior = PriorBatch(found.seq, found.created_at, found.request_hash)
            reused = None
            client_ids = [cid for cid in batch.client_ids if cid is not None]
            if client_ids and prior is None:
                used = set(
                    await conn.scalars(
                        select(events.c.client_id).where(
                            events.c.conversation_id == conversation_id,
                            events.c.client_id.in_(client_ids),
                        )
                    )
                )
                # the first reused in the batch's order, as episodic_append names it
                reused = next((cid for cid in client_ids if cid in used), None)
            abandoned = None
            if needs_abandoned_calls(batch, counters.open_tool_calls):
                abandoned = await _abandoned_calls(conn, conversation_id)
            refused = append_refusal(
                batch,
                last_seq=counters.last_seq,
                open_tool_calls=counters.open_tool_calls,
                prior=prior,
                reused_client_id=reused,
                abandoned_calls=abandoned,
            )
            if refused is not None:
                return refused

            last_seq = counters.last_seq
            now = datetime.now(UTC)
            rows: list[dict[str, Any]] = []
            for index, message in enumerate(batch.messages):
                seq = last_seq + 1 + index
                first = index == 0
                counters = counters.after_message(
                    message,
                    seq=seq,
                    token_estimate=batch.token_estimates[index],
                    usage=batch.usage if first else None,
                )
                rows.append(
                    {
                        "conversation_id": conversation_id,
                        "seq": seq,
                        "tenant_id": head["tenant_id"],
                        "kind": "message",
                        "created_at": now,
                        "token_estimate": batch.token_estimates[index],
                        "payload": batch.payloads[index],
                        "client_id": batch.client_ids[index],
                        "usage": batch.usage_json if first else None,
                        "idempotency_key": batch.idempotency_key if first else None,
                        "request_hash": batch.request_hash if first else None,
                        "batch_size": len(batch.messages) if first else None,
                    }
                )
            await conn.execute(insert(events), rows)
            extra = _due_marking(head, counters, trigger, now)
            if batch.state_json is not None:
                seq = counters.last_seq + 1
                change = orjson.loads(batch.state_json)
                await _insert_state_event(
                    conn, conversation_id, head["tenant_id"], seq, now, batch.state_json
                )
                await _apply_shared_state(conn, head["tenant_id"], change.get("shared"), now)
                counters = counters.after_event(seq=seq)
                extra["state"] = {**(head["state"] or {}), **change.get("conversation", {})}
            if batch.touched_at is not None:
                extra["touched_at"] = batch.touched_at
            await _save_counters(conn, conversation_id, counters, **extra)
            return WriteOutcome("appended", seq=last_seq + 1, created_at=now)

    async def mark_run_completed(
        self, conversation_id: UUID, tokens_per_abandoned: int, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome:
        async with self._write_to(conversation_id) as (conn, head):
            if head is None:
                return WriteOutcome("not_found")
            counters = decode_counters(head)
            abandoned = counters.abandoned_ids()
            seq = counters.last_seq + 1
            tokens = tokens_per_abandoned * len(abandoned)
            now = datetime.now(UTC)
            await conn.execute(
                insert(events).values(
                    conversation_id=conversation_id,
                    seq=seq,
                    tenant_id=head["tenant_id"],
                    kind="run_completed",
                    created_at=now,
                    token_estimate=tokens,
                    payload=encode_json(
                        {"abandoned_tool_call_ids": abandoned}, what="run_completed"
                    ),
                )
            )
            counters = counters.after_run_completed(seq=seq, token_estimate=tokens)
            await _save_counters(
                conn, conversation_id, counters, **_due_marking(head, counters, trigger, now)
            )
            return WriteOutcome(
                "appended", seq=seq, created_at=now, detail=encode_json(abandoned, what="ids")
            )

    async def write_boundary(
        self, conversation_id: UUID, planner: BoundaryPlanner
    ) -> BoundaryWrite | None:
        async with self._write_to(conversation_id) as (conn, head):
            if head is None:
                return None
            tail = await _events_after(conn, conversation_id, planner.covers_through_seq, None)
            write = planner.plan(decode_head_state(head), tail, datetime.now(UTC))
            attempt = planner.attempt
            event = write.event
            await conn.execute(
                insert(events).values(
                    conversation_id=conversation_id,
                    seq=event.seq,
                    tenant_id=head["tenant_id"],
                    kind="boundary",
                    created_at=event.created_at,
                    token_estimate=event.token_estimate,
                    payload=write.payload,
                )
            )
            await _save_counters(
                conn,
                conversation_id,
                write.counters,
                **CLEARED_COMPACTION_STATE,
                boundary_at=event.created_at,
            )
            if attempt is not None:
                done = attempt.with_boundary(event.seq, event.tokens_after)
                await conn.execute(insert(compaction_attempts).values(**done.row()))
        return write

    async def write_event(
        self, conversation_id: UUID, plan: PlanEvent, trigger: EpisodicCompactionConfig
    ) -> tuple[bool, PlannedEvent | None]:
        async with self._write_to(conversation_id) as (conn, head):
            if head is None:
                return False, None
            state = decode_head_state(head)
            tail = await _events_after(
                conn, conversation_id, state.counters.covers_through_seq, None
            )
            now = datetime.now(UTC)
            planned = plan(state, tail, now)
            if planned is None:
                return True, None
            event = planned.event
            await conn.execute(
                insert(events).values(
                    conversation_id=conversation_id,
                    seq=event.seq,
                    tenant_id=head["tenant_id"],
                    kind=event.kind,
                    created_at=event.created_at,
                    token_estimate=event.token_estimate,
                    payload=planned.payload,
                )
            )
            extra = _due_marking(head, planned.counters, trigger, now)
            if planned.context_since is not None:
                extra["boundary_at"] = planned.context_since
            if event.kind == "deletion":
                # hidden, and off the worker's queue
                extra.update(deleted_at=event.created_at, due_since=None, due_reason=None)
            await _save_counters(conn, conversation_id, planned.counters, **extra)
        return True, planned

    async def claim(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        now = datetime.now(UTC)
        head = conversations.c
        async with self._write() as conn:
            rows = (
                await conn.execute(
                    select(head.conversation_id)
                    .where(
                        head.due_since.is_not(None),
                        head.dead_since.is_(None),
                        head.deleted_at.is_(None),
                        head.next_attempt_at <= now,
                        or_(head.lease_expires_at.is_(None), head.lease_expires_at <= now),
                        *_of_tenant(self.tenant),
                    )
                    .order_by(head.next_attempt_at)
                    .limit(limit)
                )
            ).all()
            return [await _take_lease(conn, cid, owner, lease_seconds, now) for (cid,) in rows]

    async def claim_conversation(
        self, conversation_id: UUID, owner: str, lease_seconds: float, reason: str
    ) -> Claim | None:
        now = datetime.now(UTC)
        async with self._write_to(conversation_id) as (conn, row):
            if row is None:
                return None
            lease_end = row["lease_expires_at"]
            if lease_end is not None and utc(lease_end) > now:
                return None
            return await _take_lease(
                conn,
                conversation_id,
                owner,
                lease_seconds,
                now,
                due_since=row["due_since"] or now,
                due_reason=reason,
                next_attempt_at=now,
                dead_since=None,
            )

    async def listen_for_due(self, wake: Callable[[], None]) -> Closer | None:
        return None  # SQLite cannot notify; the worker polls

    async def end_attempt(
        self, claim: Claim, end: AttemptEnd, attempt: AttemptRecord
    ) -> AttemptOutcome:
        now = datetime.now(UTC)
        head = conversations.c
        changes: dict[str, Any] = {
            "lease_owner": None,
            "lease_token": None,
            "lease_expires_at": None,
            "last_error": attempt.error,
        }
        if end.clear_due:
            changes.update(
                due_since=None, due_reason=None, compaction_attempts=0, next_attempt_at=None
            )
        else:
            changes["next_attempt_at"] = now + timedelta(seconds=end.retry_in)
        if end.dead:
            changes["dead_since"] = now
        async with self._write() as conn:
            if await _head(conn, claim.conversation_id, claim.tenant_id) is None:
                return "gone"  # erased meanwhile: no attempt row outlives it
            result = await conn.execute(
                update(conversations)
                .where(
                    head.conversation_id == claim.conversation_id,
                    head.lease_token == claim.lease_token,
                    head.tenant_id == claim.tenant_id,
                )
                .values(**changes)
            )
            outcome: AttemptOutcome = attempt.outcome if result.rowcount else "lease_lost"
            row = replace(attempt, outcome=outcome, finished_at=now).row()
            await conn.execute(insert(compaction_attempts).values(**row))
        return outcome

    async def mark_due_by_age(self, trigger: EpisodicCompactionConfig) -> int:
        now = datetime.now(UTC)
        head = conversations.c
        marked = 0
        async with self._write() as conn:
            # SQLite holds one process's conversations: reading every head is cheap, and
            # leaves which ones the sweep looks at to its rule (due.swept).
            rows = await conn.execute(select(conversations).where(head.deleted_at.is_(None)))
            for mapping in rows.mappings().all():
                row = dict(mapping)
                counters = decode_counters(row)
                if not swept(counters, due_since=row["due_since"], dead_since=row["dead_since"]):
                    continue
                state = _due_marking(row, counters, trigger, now)
                if not state:
                    continue
                await conn.execute(
                    update(conversations)
                    .where(head.conversation_id == row["conversation_id"])
                    .values(**state)
                )
                marked += 1
        return marked

    async def status(self, recent: int, limit: int) -> CompactionStatus:
        now = datetime.now(UTC)
        head = conversations.c
        due = and_(head.due_since.is_not(None), head.dead_since.is_(None))
        query = select(
            func.count().filter(due),
            func.count().filter(head.lease_expires_at > now),
            func.count().filter(and_(due, head.last_error.is_not(None))),
            func.count().filter(head.dead_since.is_not(None)),
        ).where(*_of_tenant(self.tenant))
        queue_query = select(conversations).where(
            or_(
                head.due_since.is_not(None),
                head.dead_since.is_not(None),
                head.lease_expires_at > now,
            ),
            *_of_tenant(self.tenant),
        )
        attempts = compaction_attempts.c
        recent_query = (
            select(
                attempts.conversation_id,
                attempts.worker,
                attempts.reason,
                attempts.outcome,
                attempts.error,
                attempts.started_at,
                attempts.finished_at,
                attempts.model,
                attempts.tokens_before,
                attempts.tokens_after,
                attempts.boundary_seq,
            )
            .where(*([] if self.tenant is None else [attempts.tenant_id == self.tenant]))
            .order_by(attempts.finished_at.desc())
            .limit(recent)
        )
        async with self._read() as conn:
            counts = (await conn.execute(query)).one()
            heads = (await conn.execute(queue_query)).mappings().all()
            rows = (await conn.execute(recent_query)).mappings().all()
        queue = sorted((_queue_entry(dict(row), now) for row in heads), key=_queue_order)
        return CompactionStatus(
            due=counts[0],
            leased=counts[1],
            failing=counts[2],
            dead=counts[3],
            conversations=queue[:limit],
            recent_attempts=[dict(row) for row in rows],
        )

    async def load_tail(self, conversation_id: UUID, *, with_events: bool) -> Tail | None:
        async with self._read() as conn:
            head = await _head(conn, conversation_id, self.tenant)
            if head is None or head["deleted_at"] is not None:
                return None
            rows = await conn.execute(_after(conversation_id, head["covers_through_seq"], None))
            return decode_tail(
                conversation_id,
                (
                    (seq, kind, epoch_seconds(created_at), tokens, payload, usage)
                    for seq, kind, created_at, tokens, payload, usage in rows
                ),
                last_seq=head["last_seq"],
                boundary_seq=head["boundary_seq"],
                with_events=with_events,
            )

    async def read_events(
        self, conversation_id: UUID, after_seq: int, limit: int
    ) -> list[StoredEvent]:
        async with self._read() as conn:
            if self.tenant is not None and await _head(conn, conversation_id, self.tenant) is None:
                return []
            return await _events_after(conn, conversation_id, after_seq, limit)

    async def get_conversation(self, conversation_id: UUID) -> Conversation | None:
        async with self._read() as conn:
            head = await _head(conn, conversation_id, self.tenant)
        return decode_conversation(head) if head is not None else None

    async def list_conversations(self, limit: int, before: UUID | None) -> list[Conversation]:
        head = conversations.c
        query = (
            select(conversations)
            .where(head.deleted_at.is_(None), *_of_tenant(self.tenant))
            .order_by(head.created_at.desc(), head.conversation_id.desc())
            .limit(limit)
        )
        async with self._read() as conn:
            if before is not None:
                cursor = (
                    await conn.execute(
                        select(head.created_at, head.conversation_id).where(
                            head.conversation_id == before
                        )
                    )
                ).first()
                if cursor is None:
                    return []
                query = query.where(
                    or_(
                        head.created_at < cursor.created_at,
                        and_(
                            head.created_at == cursor.created_at,
                            head.conversation_id < cursor.conversation_id,
                        ),
                    )
                )
            rows = (await conn.execute(query)).mappings().all()
        return [decode_conversation(dict(row)) for row in rows]

    async def close(self) -> None:
        await self._engine.dispose()


def _queue_entry(row: dict[str, Any], now: datetime) -> CompactionQueueEntry:
    """A head in the compaction queue, in the state PostgreSQL's status query gives it."""
    lease_end = utc(row["lease_expires_at"]) if row["lease_expires_at"] is not None else None
    state: QueueState = "due"
    if row["dead_since"] is not None:
        state = "dead"
    elif lease_end is not None and lease_end > now:
        state = "leased"
    elif row["last_error"] is not None:
        state = "failing"
    return CompactionQueueEntry(
        conversation_id=row["conversation_id"],
        tenant_id=row["tenant_id"],
        state=state,
        reason=row["due_reason"],
        attempts=row["compaction_attempts"],
        last_error=row["last_error"],
        next_attempt_at=utc(row["next_attempt_at"]) if row["next_attempt_at"] else None,
        lease_owner=row["lease_owner"],
        lease_expires_at=lease_end,
    )


def _queue_order(entry: CompactionQueueEntry) -> tuple[int, bool, datetime, str]:
    when = entry.next_attempt_at or datetime.max.replace(tzinfo=UTC)
    return (
        QUEUE_STATES.index(entry.state),
        entry.next_attempt_at is None,
        when,
        str(entry.conversation_id),
    )


def _missing(path: str | None) -> bool:
    return path is not None and not os.path.exists(path)


def _unopenable(path: str | None) -> str | None:
    """Why SQLite could never open a database file at ``path``, or None."""
    if path is None:
        return None
    if os.path.isdir(path):
        return "the path is a directory"
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"its directory {directory} does not exist"
    return None


class _SqliteImport:
    """An import's writes, inside the write transaction that created the head."""

    def __init__(self, conn: AsyncConnection, conversation_id: UUID, tenant: str) -> None:
        self._conn = conn
        self._cid = conversation_id
        self._tenant = tenant

    async def add_events(self, rows: Sequence[EventRow]) -> None:
        await self._conn.execute(
            insert(events),
            [
                {
                    "conversation_id": self._cid,
                    "tenant_id": self._tenant,
                    "seq": r.seq,
                    "kind": r.kind,
                    "created_at": r.created_at,
                    "token_estimate": r.token_estimate,
                    "payload": r.payload,
                    "usage": r.usage,
                    "client_id": r.client_id,
                    "idempotency_key": r.idempotency_key,
                    "request_hash": r.request_hash,
                    "batch_size": r.batch_size,
                }
                for r in rows
            ],
        )

    async def add_attempts(self, records: Sequence[AttemptRecord]) -> None:
        await self._conn.execute(
            insert(compaction_attempts),
            [{**record.row(), "tenant_id": self._tenant} for record in records],
        )

    async def finish(self, head: HeadImage, touched_at: float | None) -> None:
        await _save_counters(
            self._conn,
            self._cid,
            head.counters,
            state=head.state or None,
            boundary_at=head.boundary_at,
            deleted_at=head.deleted_at,
            touched_at=touched_at,
        )


async def _erased(conn: AsyncConnection, conversation_id: UUID, tenant: str) -> bool:
    """Whether the id has a tombstone in ``tenant`` (tombstones are the tenant's)."""
    query = select(erasures.c.erasure_id).where(
        erasures.c.conversation_id == conversation_id, erasures.c.tenant_id == tenant
    )
    return await conn.scalar(query.limit(1)) is not None


async def _latest_tombstone(
    conn: AsyncConnection, condition: Any, tenant: str | None
) -> Erasure | None:
    query = select(erasures).where(condition)
    if tenant is not None:
        query = query.where(erasures.c.tenant_id == tenant)
    row = (
        (await conn.execute(query.order_by(erasures.c.erased_at.desc()).limit(1)))
        .mappings()
        .first()
    )
    return erasure_from_row(dict(row)) if row is not None else None


async def _head(
    conn: AsyncConnection, conversation_id: UUID, tenant: str | None
) -> Mapping[str, Any] | None:
    query = select(conversations).where(conversations.c.conversation_id == conversation_id)
    if tenant is not None:
        query = query.where(conversations.c.tenant_id == tenant)
    result = await conn.execute(query)
    row = result.mappings().first()
    return dict(row) if row is not None else None


async def _insert_state_event(
    conn: AsyncConnection,
    conversation_id: UUID,
    tenant_id: str,
    seq: int,
    created_at: datetime,
    payload: str,
) -> None:
    await conn.execute(
        insert(events).values(
            conversation_id=conversation_id,
            seq=seq,
            tenant_id=tenant_id,
            kind="state",
            created_at=created_at,
            token_estimate=0,
            payload=payload,
        )
    )


async def _apply_shared_state(
    conn: AsyncConnection, tenant_id: str, shared: dict[str, Any] | None, now: datetime
) -> None:
    """The twin of episodic_apply_shared_state: each key replaces the scope's value."""
    for scope, delta in sorted((shared or {}).items()):
        stored = await conn.scalar(
            select(shared_state.c.state).where(
                shared_state.c.tenant_id == tenant_id, shared_state.c.scope == scope
            )
        )
        statement = sqlite_insert(shared_state).values(
            tenant_id=tenant_id, scope=scope, state={**(stored or {}), **delta}, updated_at=now
        )
        await conn.execute(
            statement.on_conflict_do_update(
                index_elements=["tenant_id", "scope"],
                set_={"state": statement.excluded.state, "updated_at": now},
            )
        )


def _of_tenant(tenant: str | None) -> list[Any]:
    return [] if tenant is None else [conversations.c.tenant_id == tenant]


async def _save_counters(
    conn: AsyncConnection,
    conversation_id: UUID,
    counters: HeadCounters,
    **extra: Any,
) -> None:
    await conn.execute(
        update(conversations)
        .where(conversations.c.conversation_id == conversation_id)
        .values(**counter_values(counters), **extra)
    )


async def _take_lease(
    conn: AsyncConnection,
    conversation_id: UUID,
    owner: str,
    lease_seconds: float,
    now: datetime,
    **extra: Any,
) -> Claim:
    """Lease the conversation (inside the caller's write transaction) and count the attempt."""
    head = conversations.c
    token = uuid4()
    expires = now + timedelta(seconds=lease_seconds)
    await conn.execute(
        update(conversations)
        .where(head.conversation_id == conversation_id)
        .values(
            lease_owner=owner,
            lease_token=token,
            lease_expires_at=expires,
            compaction_attempts=head.compaction_attempts + 1,
            **extra,
        )
    )
    row = await _head(conn, conversation_id, None)
    assert row is not None
    return Claim(
        conversation_id=conversation_id,
        tenant_id=row["tenant_id"],
        lease_token=token,
        lease_expires_at=expires,
        attempt=row["compaction_attempts"],
        reason=row["due_reason"] or "manual_recovery",
        boundary_seq=row["boundary_seq"],
        claimed_at=now,
    )


def _due_marking(
    head: Mapping[str, Any],
    counters: HeadCounters,
    trigger: EpisodicCompactionConfig,
    now: datetime,
) -> dict[str, Any]:
    """The columns that mark the conversation due (due.due_marking, episodic_mark_due's twin)."""
    return due_marking(
        counters,
        due_since=head["due_since"],
        dead_since=head["dead_since"],
        created_at=utc(head["created_at"]),
        boundary_at=utc(head["boundary_at"]) if head["boundary_at"] is not None else None,
        metadata=json_value(head["metadata"]),
        default=trigger,
        now=now,
    )


def _after(conversation_id: UUID, after_seq: int, limit: int | None) -> Select[Any]:
    """The events of a conversation after ``after_seq``, oldest first (rows of the
    codec's ``EVENT_COLUMNS``, which it reads by position)."""
    return (
        select(*(events.c[name] for name in EVENT_COLUMNS))
        .where(events.c.conversation_id == conversation_id, events.c.seq > after_seq)
        .order_by(events.c.seq)
        .limit(limit)
    )


async def _events_after(
    conn: AsyncConnection, conversation_id: UUID, after_seq: int, limit: int | None
) -> list[StoredEvent]:
    rows = await conn.execute(_after(conversation_id, after_seq, limit))
    return [decode_event_row(conversation_id, row) for row in rows]


async def _abandoned_calls(conn: AsyncConnection, conversation_id: UUID) -> list[str]:
    """Every call the conversation's run completions abandoned (only an orphan needs them)."""
    payloads = await conn.scalars(
        select(events.c.payload).where(
            events.c.conversation_id == conversation_id, events.c.kind == "run_completed"
        )
    )
    return abandoned_in([json_value(p) for p in payloads])


__all__ = ["SqliteBackend"]
