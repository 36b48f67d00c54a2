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
from dataclasses import fields, replace
from datetime import UTC, datetime
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
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    Claim,
    CompactionQueueEntry,
    CompactionStatus,
    QueueHead,
    QueueState,
    claim_columns,
    claim_conversation_columns,
    claimable,
    claimable_by_hand,
    end_attempt_columns,
    end_attempt_outcome,
    in_queue,
    queue_counts,
    queue_order,
    queue_state,
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
from episodic.store.due import (
    CLEARED_COMPACTION_STATE,
    DueState,
    due_marking,
    sweep_due_candidate,
)
from episodic.store.engine import DatabaseUrl
from episodic.store.erasure import Erasure, erasure_from_row
from episodic.store.export_format import ConversationHeader, EventRow, HeadImage, SharedStateRow
from episodic.store.migrate import SchemaMigration, upgrade_to_head
from episodic.store.planned_events import PlannedEvent, write_event_columns
from episodic.store.projection import HeadCounters
from episodic.store.rules import (
    PriorBatch,
    abandoned_in,
    append_refusal,
    create_conversation_outcome,
    needs_abandoned_calls,
)
from episodic.store.schema import (
    compaction_attempts,
    conversations,
    erasures,
    events,
    shared_state,
)
from episodic.store.sqlite.search import search_events
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

    async def create_conversation(self, new: NewConversation) -> CreateOutcome:
        # episodic_create_conversation's twin: the outcome is rules.create_conversation_outcome's.
        app_name, user_id = new.listed if new.listed is not None else (None, None)
        change = orjson.loads(new.state_json) if new.state_json is not None else {}
        async with self._write() as conn:
            outcome = await _create_outcome(
                conn, new.conversation_id, new.tenant_id, new.reuse_erased
            )
            if outcome != "created":
                return outcome
            await conn.execute(
                insert(conversations).values(
                    conversation_id=new.conversation_id,
                    tenant_id=new.tenant_id,
                    created_at=new.created_at,
                    metadata=new.metadata,
                    open_tool_calls={},
                    app_name=app_name,
                    user_id=user_id,
                    touched_at=new.touched_at,
                    last_seq=0 if new.state_json is None else 1,
                    state=change.get("conversation"),
                )
            )
            if new.state_json is not None:
                # stamped inside the write, as every write to the scopes (one at a time here)
                now = datetime.now(UTC)
                await _apply_shared_state(conn, new.tenant_id, change.get("shared"), now)
                await _insert_event(
                    conn,
                    new.conversation_id,
                    new.tenant_id,
                    seq=1,
                    kind="state",
                    created_at=now,
                    token_estimate=0,
                    payload=new.state_json,
                )
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
            outcome = await _create_outcome(conn, cid, tenant_id, reuse_erased)
            if outcome == "erased":
                raise ErasedConversationError(cid)
            if outcome == "taken":
                raise ConflictError(f"conversation {cid} already exists", conversation_id=cid)
            await conn.execute(
                insert(conversations).values(
                    conversation_id=cid,
                    tenant_id=tenant_id,
                    created_at=header.created_at,
                    metadata=header.metadata,
                    open_tool_calls={},
                    app_name=header.app_name,
                    user_id=header.user_id,
                )
            )
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
            extra = due_marking(counters, _due_state(head), trigger, now)
            if batch.state_json is not None:
                seq = counters.last_seq + 1
                change = orjson.loads(batch.state_json)
                await _insert_event(
                    conn,
                    conversation_id,
                    head["tenant_id"],
                    seq=seq,
                    kind="state",
                    created_at=now,
                    token_estimate=0,
                    payload=batch.state_json,
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
            extra = due_marking(counters, _due_state(head), trigger, now)
            await _save_counters(conn, conversation_id, counters, **extra)
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
            await _insert_event(
                conn,
                conversation_id,
                head["tenant_id"],
                seq=event.seq,
                kind="boundary",
                created_at=event.created_at,
                token_estimate=event.token_estimate,
                payload=write.payload,
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
            await _insert_event(
                conn,
                conversation_id,
                head["tenant_id"],
                seq=event.seq,
                kind=event.kind,
                created_at=event.created_at,
                token_estimate=event.token_estimate,
                payload=planned.payload,
            )
            # episodic_write_event's twin: what else it sets is write_event_columns's.
            extra = write_event_columns(planned, _due_state(head), trigger, now)
            await _save_counters(conn, conversation_id, planned.counters, **extra)
        return True, planned

    async def claim(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        # episodic_claim's twin. Read: the rows of the due index (a superset of the
        # claimable), in the claim's order; attempts.claimable decides which are taken.
        now = datetime.now(UTC)
        head = conversations.c
        async with self._write() as conn:
            due = await conn.execute(
                select(*_QUEUE_HEAD)
                .where(
                    head.due_since.is_not(None), head.dead_since.is_(None), *_of_tenant(self.tenant)
                )
                .order_by(head.next_attempt_at)
            )
            heads = [QueueHead.of(dict(row)) for row in due.mappings()]
            taken = [h for h in heads if claimable(h, now)][:limit]
            claims = []
            for one in taken:
                lease = claim_columns(
                    one, owner=owner, token=uuid4(), lease_seconds=lease_seconds, now=now
                )
                claims.append(await _take_lease(conn, one.conversation_id, lease, now))
            return claims

    async def claim_conversation(
        self, conversation_id: UUID, owner: str, lease_seconds: float, reason: str
    ) -> Claim | None:
        # episodic_claim_conversation's twin.
        now = datetime.now(UTC)
        async with self._write_to(conversation_id) as (conn, row):
            if row is None:
                return None
            one = QueueHead.of(row)
            if not claimable_by_hand(one, now):
                return None
            columns = claim_conversation_columns(
                one,
                owner=owner,
                token=uuid4(),
                lease_seconds=lease_seconds,
                reason=reason,
                now=now,
            )
            return await _take_lease(conn, conversation_id, columns, now)

    async def listen_for_due(self, wake: Callable[[], None]) -> Closer | None:
        return None  # SQLite cannot notify; the worker polls

    async def end_attempt(
        self, claim: Claim, end: AttemptEnd, attempt: AttemptRecord
    ) -> AttemptOutcome:
        # episodic_end_attempt's twin: attempts.end_attempt_columns and end_attempt_outcome.
        now = datetime.now(UTC)
        head = conversations.c
        async with self._write() as conn:
            found = await _head(conn, claim.conversation_id, claim.tenant_id) is not None
            held = False
            if found:
                result = await conn.execute(
                    update(conversations)
                    .where(
                        head.conversation_id == claim.conversation_id,
                        head.lease_token == claim.lease_token,
                        head.tenant_id == claim.tenant_id,
                    )
                    .values(**end_attempt_columns(end, error=attempt.error, now=now))
                )
                held = result.rowcount == 1
            outcome = end_attempt_outcome(attempt.outcome, found=found, held=held)
            if outcome == "gone":
                return outcome  # erased meanwhile: no attempt row outlives it
            row = replace(attempt, outcome=outcome, finished_at=now).row()
            await conn.execute(insert(compaction_attempts).values(**row))
        return outcome

    async def sweep_due(self, trigger: EpisodicCompactionConfig) -> int:
        # episodic_sweep_due's twin.
        now = datetime.now(UTC)
        head = conversations.c
        marked = 0
        async with self._write() as conn:
            # SQLite holds one process's conversations: reading every head is cheap, and
            # leaves which ones the sweep looks at to its rule (due.sweep_due_candidate).
            rows = await conn.execute(select(conversations))
            for mapping in rows.mappings().all():
                row = dict(mapping)
                counters = decode_counters(row)
                due = _due_state(row)
                if not sweep_due_candidate(counters, due):
                    continue
                state = due_marking(counters, due, trigger, now)
                if not state:
                    continue
                await conn.execute(
                    update(conversations)
                    .where(head.conversation_id == row["conversation_id"])
                    .values(**state)
                )
                marked += 1
        return marked

    async def queue_status(self, recent: int, limit: int) -> CompactionStatus:
        # The twin of queries.QUEUE_COUNTS and QUEUE: attempts.queue_counts, in_queue,
        # queue_state and queue_order decide on the heads the queue could hold (due, dead,
        # or with a lease, expired or not), which are all that any count counts.
        now = datetime.now(UTC)
        head = conversations.c
        queue_query = select(conversations).where(
            or_(
                head.due_since.is_not(None),
                head.dead_since.is_not(None),
                head.lease_expires_at.is_not(None),
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
            queued = [dict(row) for row in (await conn.execute(queue_query)).mappings()]
            recents = (await conn.execute(recent_query)).mappings().all()
        rows = [(row, QueueHead.of(row)) for row in queued]
        counts = queue_counts((one for _, one in rows), now)
        queue = sorted(
            ((row, one) for row, one in rows if in_queue(one, now)),
            key=lambda entry: queue_order(entry[1], now),
        )
        return CompactionStatus(
            due=counts["due"],
            leased=counts["leased"],
            failing=counts["failing"],
            dead=counts["dead"],
            conversations=[_queue_entry(row, queue_state(one, now)) for row, one in queue[:limit]],
            recent_attempts=[dict(row) for row in recents],
        )

    async def load_tail(
        self, conversation_id: UUID, *, with_events: bool, stored: bool = False
    ) -> Tail | None:
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
                stored=stored,
            )

    async def read_events(
        self, conversation_id: UUID, after_seq: int, limit: int
    ) -> list[StoredEvent]:
        async with self._read() as conn:
            if self.tenant is not None and await _head(conn, conversation_id, self.tenant) is None:
                return []
            return await _events_after(conn, conversation_id, after_seq, limit)

    async def search_events(
        self, conversation_id: UUID, terms: Sequence[str], limit: int
    ) -> list[StoredEvent]:
        async with self._read() as conn:
            if self.tenant is not None and await _head(conn, conversation_id, self.tenant) is None:
                return []
            return await search_events(conn, conversation_id, terms, limit)

    async def head(self, conversation_id: UUID) -> Conversation | None:
        # episodic_head's twin.
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


#: The columns of a head that attempts.QueueHead holds.
_QUEUE_HEAD = [conversations.c[field.name] for field in fields(QueueHead)]


def _queue_entry(row: Mapping[str, Any], state: QueueState) -> CompactionQueueEntry:
    """A head in the compaction queue, in ``state`` (attempts.queue_state's)."""
    lease_end = row["lease_expires_at"]
    return CompactionQueueEntry(
        conversation_id=row["conversation_id"],
        tenant_id=row["tenant_id"],
        state=state,
        reason=row["due_reason"],
        attempts=row["compaction_attempts"],
        last_error=row["last_error"],
        next_attempt_at=utc(row["next_attempt_at"]) if row["next_attempt_at"] else None,
        lease_owner=row["lease_owner"],
        lease_expires_at=utc(lease_end) if lease_end is not None else None,
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


async def _create_outcome(
    conn: AsyncConnection, conversation_id: UUID, tenant: str, reuse_erased: bool
) -> CreateOutcome:
    """Whether a conversation may be created under the id in ``tenant`` (inside the caller's
    write transaction): the facts looked up, rules.create_conversation_outcome decides."""
    taken = await conn.scalar(
        select(conversations.c.conversation_id)
        .where(conversations.c.conversation_id == conversation_id)
        .limit(1)
    )
    # (tombstones are the tenant's)
    erased = await conn.scalar(
        select(erasures.c.erasure_id)
        .where(erasures.c.conversation_id == conversation_id, erasures.c.tenant_id == tenant)
        .limit(1)
    )
    return create_conversation_outcome(
        taken=taken is not None, erased=erased is not None, reuse_erased=reuse_erased
    )


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


async def _insert_event(
    conn: AsyncConnection,
    conversation_id: UUID,
    tenant_id: str,
    *,
    seq: int,
    kind: str,
    created_at: datetime,
    token_estimate: int,
    payload: str,
) -> None:
    """One event row that is not an appended message: a boundary, a planned event, the
    state a conversation is created with."""
    await conn.execute(
        insert(events).values(
            conversation_id=conversation_id,
            seq=seq,
            tenant_id=tenant_id,
            kind=kind,
            created_at=created_at,
            token_estimate=token_estimate,
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
    conn: AsyncConnection, conversation_id: UUID, columns: Mapping[str, Any], now: datetime
) -> Claim:
    """Write a claim's ``columns`` (attempts.claim_columns or claim_conversation_columns),
    inside the caller's write transaction, and say what was claimed."""
    await conn.execute(
        update(conversations)
        .where(conversations.c.conversation_id == conversation_id)
        .values(**columns)
    )
    row = await _head(conn, conversation_id, None)
    assert row is not None
    return Claim(
        conversation_id=conversation_id,
        tenant_id=row["tenant_id"],
        lease_token=columns["lease_token"],
        lease_expires_at=columns["lease_expires_at"],
        attempt=row["compaction_attempts"],
        reason=row["due_reason"] or "manual_recovery",
        boundary_seq=row["boundary_seq"],
        claimed_at=now,
    )


def _due_state(head: Mapping[str, Any]) -> DueState:
    """A head row's columns that decide whether it is marked due (its SQLite text decoded)."""
    return DueState(
        created_at=utc(head["created_at"]),
        boundary_at=utc(head["boundary_at"]) if head["boundary_at"] is not None else None,
        due_since=head["due_since"],
        dead_since=head["dead_since"],
        deleted_at=head["deleted_at"],
        metadata=json_value(head["metadata"]),
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
