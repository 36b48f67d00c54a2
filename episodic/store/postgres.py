"""The PostgreSQL backend: asyncpg directly on the request path.

Appends and run completions are one call to a PL/pgSQL function (created by the migrations),
so each is one round trip with no explicit BEGIN/COMMIT; asyncpg prepares each statement once
per connection and reuses it. SQLAlchemy is used only to run the migrations.

A backend scoped to a tenant (``for_tenant``) calls the ``episodic_scoped_*`` forms, which set
the tenant for row-level security inside the same statement, so scoping adds no round trip on
the request path or in the worker; the operator's operations without such a form (claims by
hand or by a scoped worker, listing, paging events) run in a transaction that sets the tenant first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from episodic.errors import ConflictError, SchemaNotMigratedError
from episodic.models import Conversation, StoredEvent
from episodic.policy import EpisodicCompactionConfig
from episodic.store.attempts import (
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    Claim,
    CompactionQueueEntry,
    CompactionStatus,
)
from episodic.store.backend import Closer, LoadedTail, PlanBoundary, WriteOutcome
from episodic.store.batch import PreparedBatch
from episodic.store.boundaries import BoundaryWrite
from episodic.store.codec import decode_conversation, decode_event_row, decode_head_state
from episodic.store.engine import DatabaseUrl
from episodic.store.migrate import SchemaMigration, upgrade_to_head
from episodic.store.translate import connection_refused, translated_errors

READ_REVISION = "SELECT version_num FROM episodic_alembic_version"

APPEND = """
SELECT o_outcome, o_seq, o_created_at, o_detail
  FROM episodic_append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                       $16, $17, $18, $19)
"""

# The tenant-scoped forms (migration 0004) set the transaction's tenant for row-level
# security and check the conversation belongs to it, still in one statement.
SCOPED_APPEND = """
SELECT o_outcome, o_seq, o_created_at, o_detail
  FROM episodic_scoped_append($20, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                              $15, $16, $17, $18, $19)
"""

SCOPED_MARK_RUN_COMPLETED = """
SELECT o_outcome, o_seq, o_created_at, o_detail
  FROM episodic_scoped_mark_run_completed($7, $1, $2, $3, $4, $5, $6)
"""

SCOPED_CREATE_CONVERSATION = """
SELECT episodic_scoped_create_conversation($2, $1, $3, $4)
"""

SCOPED_LOAD_TAIL = """
SELECT o_last_seq AS last_seq, o_boundary_seq AS boundary_seq, o_seq AS seq, o_kind AS kind,
       o_created_at AS created_at, o_token_estimate AS token_estimate, o_payload AS payload,
       o_usage AS usage
  FROM episodic_scoped_load_tail($2, $1)
"""

# Everything else a scoped store does runs in a transaction that starts with this.
SET_TENANT = "SELECT episodic_set_tenant($1)"

MARK_RUN_COMPLETED = """
SELECT o_outcome, o_seq, o_created_at, o_detail
  FROM episodic_mark_run_completed($1, $2, $3, $4, $5, $6)
"""

CREATE_CONVERSATION = """
INSERT INTO episodic_conversations (conversation_id, tenant_id, created_at, metadata,
                                    open_tool_calls)
VALUES ($1, $2, $3, $4, '{}'::jsonb)
ON CONFLICT (conversation_id) DO NOTHING
"""

READ_EVENTS = """
SELECT seq, kind, created_at, token_estimate, payload, usage
  FROM episodic_events
 WHERE conversation_id = $1 AND seq > $2 AND ($4::text IS NULL OR tenant_id = $4)
 ORDER BY seq
 LIMIT $3
"""

# One statement, a function call: it reads the head's cut, then the events after it with a
# range scan of the primary key planned on every call (see migration 0003 for why), so the
# cost is the rows returned, whatever the length of the history.
LOAD_TAIL = """
SELECT o_last_seq AS last_seq, o_boundary_seq AS boundary_seq, o_seq AS seq, o_kind AS kind,
       o_created_at AS created_at, o_token_estimate AS token_estimate, o_payload AS payload,
       o_usage AS usage
  FROM episodic_load_tail($1)
"""

#: The range query episodic_load_tail runs, for plan tests.
TAIL_RANGE = """
SELECT e.seq, e.kind, e.created_at, e.token_estimate, e.payload, e.usage
  FROM episodic_events e
 WHERE e.conversation_id = $1 AND e.seq > $2 AND e.seq <= $3
 ORDER BY e.seq
"""

# A boundary is written optimistically, without holding a lock while Python plans it: read
# the head, then the events after the cut (through episodic_load_tail, planned per call), plan,
# then write in one statement that applies only if the head is still the one read (same last
# seq, same boundary, lease still held). If anything moved, plan again on the new state. Three
# round trips, no explicit transaction.
READ_HEAD = """
SELECT *, now() AS database_now FROM episodic_conversations WHERE conversation_id = $1
"""

SCOPED_READ_HEAD = """
SELECT *, now() AS database_now FROM episodic_scoped_head($2, $1)
"""

READ_TAIL_AFTER = """
SELECT o_seq AS seq, o_kind AS kind, o_created_at AS created_at,
       o_token_estimate AS token_estimate, o_payload AS payload, o_usage AS usage
  FROM episodic_load_tail($1, $2)
 WHERE o_seq IS NOT NULL
"""

SCOPED_READ_TAIL_AFTER = """
SELECT o_seq AS seq, o_kind AS kind, o_created_at AS created_at,
       o_token_estimate AS token_estimate, o_payload AS payload, o_usage AS usage
  FROM episodic_scoped_load_tail($3, $1, $2)
 WHERE o_seq IS NOT NULL
"""

# Migration 0004's function, which also sets the tenant of a scoped caller (one round trip).
WRITE_BOUNDARY = """
SELECT episodic_write_boundary($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                               $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25)
"""

#: Plans of a boundary that a busy conversation may force before the write gives up.
BOUNDARY_WRITE_TRIES = 20

# Claims in one statement: SKIP LOCKED lets any number of workers share the queue without
# waiting on each other or on appends that hold a head row.
CLAIM = """
WITH next AS (
    SELECT conversation_id
      FROM episodic_conversations
     WHERE due_since IS NOT NULL AND dead_since IS NULL AND next_attempt_at <= now()
       AND (lease_expires_at IS NULL OR lease_expires_at <= now())
       AND ($4::text IS NULL OR tenant_id = $4)
     ORDER BY next_attempt_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE episodic_conversations c
   SET lease_owner = $2,
       lease_token = gen_random_uuid(),
       lease_expires_at = now() + make_interval(secs => $3),
       compaction_attempts = c.compaction_attempts + 1
  FROM next
 WHERE c.conversation_id = next.conversation_id
RETURNING c.conversation_id, c.tenant_id, c.lease_token, c.lease_expires_at,
          c.compaction_attempts, c.due_reason, c.boundary_seq, now() AS claimed_at
"""

CLAIM_CONVERSATION = """
UPDATE episodic_conversations
   SET lease_owner = $2,
       lease_token = gen_random_uuid(),
       lease_expires_at = now() + make_interval(secs => $3),
       compaction_attempts = compaction_attempts + 1,
       due_since = COALESCE(due_since, now()),
       due_reason = $4,
       next_attempt_at = now(),
       dead_since = NULL
 WHERE conversation_id = $1 AND (lease_expires_at IS NULL OR lease_expires_at <= now())
   AND ($5::text IS NULL OR tenant_id = $5)
RETURNING conversation_id, tenant_id, lease_token, lease_expires_at, compaction_attempts,
          due_reason, boundary_seq, now() AS claimed_at
"""

DUE_CHANNEL = "episodic_due"

# Ends an attempt that wrote no boundary, fenced by the lease token, and records it, in one
# statement. A worker whose lease was taken over changes nothing but the ledger.
END_ATTEMPT = """
SELECT episodic_end_attempt($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                            $16)
"""

MARK_DUE_BY_AGE = """
WITH aged AS (
    SELECT conversation_id,
           COALESCE((metadata -> 'compaction' ->> 'trigger_age_days')::bigint, $1) AS days,
           COALESCE((metadata -> 'compaction' ->> 'trigger_age_turn_count')::bigint, $2) AS turns
      FROM episodic_conversations
     WHERE due_since IS NULL AND dead_since IS NULL
       AND last_seq > COALESCE(boundary_seq, 0)
), marked AS (
    UPDATE episodic_conversations c
       SET due_since = now(), due_reason = 'age_and_turns', next_attempt_at = now(),
           compaction_attempts = 0, last_error = NULL
      FROM aged
     WHERE c.conversation_id = aged.conversation_id
       AND COALESCE(c.boundary_at, c.created_at) <= now() - make_interval(days => aged.days::int)
       AND c.total_user_messages >= aged.turns
    RETURNING c.conversation_id
)
SELECT conversation_id, pg_notify('episodic_due', conversation_id::text) FROM marked
"""

STATUS = """
SELECT count(*) FILTER (WHERE due_since IS NOT NULL AND dead_since IS NULL) AS due,
       count(*) FILTER (WHERE lease_expires_at > now()) AS leased,
       count(*) FILTER (WHERE due_since IS NOT NULL AND dead_since IS NULL
                          AND last_error IS NOT NULL) AS failing,
       count(*) FILTER (WHERE dead_since IS NOT NULL) AS dead
  FROM episodic_conversations
 WHERE $1::text IS NULL OR tenant_id = $1
"""

# The conversations behind the counts, what needs a person first (dead, then leased, failing,
# due). An operator's query: it reads every head, like the counts.
QUEUE = """
SELECT conversation_id, tenant_id, due_reason AS reason, compaction_attempts AS attempts,
       last_error, next_attempt_at, lease_owner, lease_expires_at,
       CASE WHEN dead_since IS NOT NULL THEN 'dead'
            WHEN lease_expires_at > now() THEN 'leased'
            WHEN last_error IS NOT NULL THEN 'failing'
            ELSE 'due' END AS state
  FROM episodic_conversations
 WHERE (due_since IS NOT NULL OR dead_since IS NOT NULL OR lease_expires_at > now())
   AND ($2::text IS NULL OR tenant_id = $2)
 ORDER BY array_position(ARRAY['dead', 'leased', 'failing', 'due'],
                         CASE WHEN dead_since IS NOT NULL THEN 'dead'
                              WHEN lease_expires_at > now() THEN 'leased'
                              WHEN last_error IS NOT NULL THEN 'failing'
                              ELSE 'due' END),
          next_attempt_at NULLS LAST, conversation_id
 LIMIT $1
"""

RECENT_ATTEMPTS = """
SELECT conversation_id, worker, reason, outcome, error, started_at, finished_at, model,
       tokens_before, tokens_after, boundary_seq
  FROM episodic_compaction_attempts
 WHERE $2::text IS NULL OR tenant_id = $2
 ORDER BY finished_at DESC
 LIMIT $1
"""

GET_CONVERSATION = """
SELECT * FROM episodic_conversations WHERE conversation_id = $1
"""

LIST_CONVERSATIONS = """
SELECT * FROM episodic_conversations c
 WHERE ($1::text IS NULL OR c.tenant_id = $1)
   AND ($3::uuid IS NULL OR (c.created_at, c.conversation_id) < (
        SELECT p.created_at, p.conversation_id FROM episodic_conversations p
         WHERE p.conversation_id = $3))
 ORDER BY c.created_at DESC, c.conversation_id DESC
 LIMIT $2
"""

SCOPED_GET_CONVERSATION = """
SELECT * FROM episodic_scoped_head($2, $1)
"""


async def _init_connection(connection: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await connection.set_type_codec(
            name,
            encoder=lambda value: orjson.dumps(value).decode(),
            decoder=orjson.loads,
            schema="pg_catalog",
        )


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Pool reset that sends nothing. asyncpg's default sends RESET ALL and friends on every
    release, a round trip per request; episodic leaves no session state behind (settings are
    transaction-local, advisory locks transaction-scoped, LISTEN on dedicated connections)."""


def _connector(url: str, timeout: float) -> Callable[..., Awaitable[asyncpg.Connection]]:
    """``asyncpg.connect`` for the pool and the listener, with a refused connection raised
    as the :class:`~episodic.errors.DatabaseUnavailableError` that says what to fix, however
    deep in a pool it was opened."""

    async def connect(*args: Any, **kwargs: Any) -> asyncpg.Connection:
        kwargs.setdefault("timeout", timeout)
        try:
            return await asyncpg.connect(*args, **kwargs)
        except Exception as exc:
            refused = connection_refused(exc, url)
            if refused is None:
                raise
            raise refused from exc

    return connect


class PostgresBackend:
    dialect = "postgresql"

    def __init__(
        self,
        url: DatabaseUrl,
        pool: asyncpg.Pool,
        connect: Callable[..., Awaitable[asyncpg.Connection]],
        tenant: str | None = None,
    ) -> None:
        self._url = url
        self._pool = pool
        self._connect = connect
        #: None: whatever the connecting role may see (everything, for a superuser or an
        #: episodic_all_tenants member). Else every statement runs under this tenant.
        self.tenant = tenant
        self.location = url.masked

    def for_tenant(self, tenant: str) -> PostgresBackend:
        """The same pool, every operation scoped to ``tenant``."""
        return PostgresBackend(self._url, self._pool, self._connect, tenant)

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
    ) -> PostgresBackend:
        connect = _connector(url.masked, connect_timeout)
        with translated_errors():
            pool = await asyncpg.create_pool(
                url.asyncpg,
                min_size=min_size,
                max_size=max_size,
                server_settings=server_settings,
                init=_init_connection,
                reset=_keep_session,
                connect=connect,
            )
        return cls(url, pool, connect)

    async def migrate(self) -> SchemaMigration:
        engine = create_async_engine(
            self._url.sqlalchemy, poolclass=NullPool, async_creator=self._migration_connection
        )
        try:
            with translated_errors():
                return await upgrade_to_head(engine)
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

    async def create_conversation(
        self, conversation_id: UUID, tenant_id: str, metadata: dict[str, Any], created_at: datetime
    ) -> bool:
        with translated_errors():
            if self.tenant is not None:
                created = await self._pool.fetchval(
                    SCOPED_CREATE_CONVERSATION, conversation_id, tenant_id, created_at, metadata
                )
                return bool(created)
            status = await self._pool.execute(
                CREATE_CONVERSATION, conversation_id, tenant_id, created_at, metadata
            )
        return bool(status == "INSERT 0 1")

    async def append(
        self,
        conversation_id: UUID,
        batch: PreparedBatch,
        expected_seq: int | None,
        trigger: EpisodicCompactionConfig,
    ) -> WriteOutcome:
        with translated_errors():
            scoped = self.tenant is not None
            row = await self._pool.fetchrow(
                SCOPED_APPEND if scoped else APPEND,
                conversation_id,
                expected_seq,
                batch.idempotency_key,
                batch.request_hash,
                batch.payloads,
                batch.token_estimates,
                batch.client_ids,
                batch.usage_json,
                batch.usage_input_tokens,
                batch.user_messages,
                batch.token_sum,
                batch.called_ids,
                batch.opened_ids,
                batch.opened_offsets,
                batch.closed_ids,
                *_thresholds(trigger),
                *((self.tenant,) if scoped else ()),
            )
        return _outcome(row)

    async def mark_run_completed(
        self, conversation_id: UUID, tokens_per_abandoned: int, trigger: EpisodicCompactionConfig
    ) -> WriteOutcome:
        with translated_errors():
            scoped = self.tenant is not None
            row = await self._pool.fetchrow(
                SCOPED_MARK_RUN_COMPLETED if scoped else MARK_RUN_COMPLETED,
                conversation_id,
                tokens_per_abandoned,
                *_thresholds(trigger),
                *((self.tenant,) if scoped else ()),
            )
        return _outcome(row)

    async def write_boundary(
        self,
        conversation_id: UUID,
        covers_through_seq: int,
        plan: PlanBoundary,
        attempt: AttemptRecord | None,
    ) -> BoundaryWrite | None:
        for _ in range(BOUNDARY_WRITE_TRIES):
            with translated_errors():
                async with self._pool.acquire() as connection:
                    done, write = await self._try_boundary(
                        connection, conversation_id, covers_through_seq, plan, attempt
                    )
            if done:
                return write
        raise ConflictError(
            f"conversation {conversation_id} kept changing while its boundary was written "
            f"({BOUNDARY_WRITE_TRIES} tries); nothing was written",
            conversation_id=conversation_id,
        )

    async def _try_boundary(
        self,
        connection: asyncpg.Connection,
        conversation_id: UUID,
        covers_through_seq: int,
        plan: PlanBoundary,
        attempt: AttemptRecord | None,
    ) -> tuple[bool, BoundaryWrite | None]:
        """One optimistic try: (done, write). Done with None when the conversation is not
        there; not done when it changed between the reads and the write."""
        if self.tenant is None:
            head = await connection.fetchrow(READ_HEAD, conversation_id)
            rows = await connection.fetch(READ_TAIL_AFTER, conversation_id, covers_through_seq)
        else:
            head = await connection.fetchrow(SCOPED_READ_HEAD, conversation_id, self.tenant)
            rows = await connection.fetch(
                SCOPED_READ_TAIL_AFTER, conversation_id, covers_through_seq, self.tenant
            )
        if head is None:
            return True, None
        # The tail was read a moment after the head: keep it consistent with the head read
        # (the conditional write refuses if the head moved, and the loop plans again).
        tail = [
            decode_event_row(conversation_id, row) for row in rows if row["seq"] <= head["last_seq"]
        ]
        write = plan(decode_head_state(head), tail, head["database_now"])
        event, after = write.event, write.counters
        done = attempt.with_boundary(event.seq, event.tokens_after) if attempt else None
        written = await connection.fetchval(
            WRITE_BOUNDARY,
            conversation_id,
            head["last_seq"],
            event.seq,
            after.covers_through_seq,
            after.user_messages_since_boundary,
            after.run_completed_since_boundary,
            after.user_messages_since_run_completed,
            after.context_tokens,
            event.created_at,
            head["boundary_seq"],
            write.lease_token,
            event.token_estimate,
            write.payload,
            *_attempt_values(done),
            self.tenant,
        )
        return (True, write) if written else (False, None)

    async def claim(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        with translated_errors():
            async with self._session() as connection:
                rows = await connection.fetch(
                    CLAIM, limit, owner, float(lease_seconds), self.tenant
                )
        return [_claim(row) for row in rows]

    async def claim_conversation(
        self, conversation_id: UUID, owner: str, lease_seconds: float, reason: str
    ) -> Claim | None:
        with translated_errors():
            async with self._session() as connection:
                row = await connection.fetchrow(
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
        # not carry (the pool does not reset them, see _keep_session).
        assert self._url.asyncpg is not None
        with translated_errors():
            connection = await self._connect(self._url.asyncpg)
            await connection.add_listener(DUE_CHANNEL, lambda *_: wake())

        async def close() -> None:
            await connection.close()

        return close

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
                    attempt.error,
                    attempt.attempt_id,
                    attempt.tenant_id,
                    attempt.worker,
                    attempt.reason,
                    attempt.outcome,
                    attempt.started_at,
                    attempt.usage,
                    attempt.model,
                    attempt.tokens_before,
                    self.tenant,
                )
        return outcome

    async def mark_due_by_age(self, trigger: EpisodicCompactionConfig) -> int:
        with translated_errors():
            rows = await self._pool.fetch(
                MARK_DUE_BY_AGE, trigger.trigger_age_days, trigger.trigger_age_turn_count
            )
        return len(rows)

    async def status(self, recent: int, limit: int) -> CompactionStatus:
        with translated_errors():
            async with self._session() as connection:
                counts = await connection.fetchrow(STATUS, self.tenant)
                queue = await connection.fetch(QUEUE, limit, self.tenant)
                attempts = await connection.fetch(RECENT_ATTEMPTS, recent, self.tenant)
        return CompactionStatus(
            due=counts["due"],
            leased=counts["leased"],
            failing=counts["failing"],
            dead=counts["dead"],
            conversations=[CompactionQueueEntry.model_validate(dict(row)) for row in queue],
            recent_attempts=[dict(row) for row in attempts],
        )

    async def load_tail(self, conversation_id: UUID) -> LoadedTail | None:
        with translated_errors():
            if self.tenant is not None:
                rows = await self._pool.fetch(SCOPED_LOAD_TAIL, conversation_id, self.tenant)
            else:
                rows = await self._pool.fetch(LOAD_TAIL, conversation_id)
        if not rows:
            return None
        first = rows[0]
        events = [decode_event_row(conversation_id, r) for r in rows if r["seq"] is not None]
        return LoadedTail(
            last_seq=first["last_seq"], boundary_seq=first["boundary_seq"], events=events
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

    async def get_conversation(self, conversation_id: UUID) -> Conversation | None:
        with translated_errors():
            if self.tenant is None:
                row = await self._pool.fetchrow(GET_CONVERSATION, conversation_id)
            else:
                row = await self._pool.fetchrow(
                    SCOPED_GET_CONVERSATION, conversation_id, self.tenant
                )
        return decode_conversation(row) if row is not None else None

    async def list_conversations(self, limit: int, before: UUID | None) -> list[Conversation]:
        with translated_errors():
            async with self._session() as connection:
                rows = await connection.fetch(LIST_CONVERSATIONS, self.tenant, limit, before)
        return [decode_conversation(row) for row in rows]

    async def close(self) -> None:
        await self._pool.close()


def _attempt_values(attempt: AttemptRecord | None) -> tuple[Any, ...]:
    if attempt is None:
        return (None,) * 11
    return (
        attempt.attempt_id,
        attempt.worker,
        attempt.reason,
        attempt.outcome,
        attempt.error,
        attempt.started_at,
        attempt.finished_at,
        attempt.usage,
        attempt.model,
        attempt.tokens_before,
        attempt.tokens_after,
    )


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


def _thresholds(trigger: EpisodicCompactionConfig) -> tuple[int | None, int, int, int]:
    return (
        trigger.trigger_context_tokens,
        trigger.trigger_unfinished_turns,
        trigger.trigger_age_days,
        trigger.trigger_age_turn_count,
    )


def _outcome(row: Any) -> WriteOutcome:
    return WriteOutcome(
        outcome=row["o_outcome"],
        seq=row["o_seq"],
        created_at=row["o_created_at"],
        detail=row["o_detail"],
    )


__all__ = ["PostgresBackend"]
