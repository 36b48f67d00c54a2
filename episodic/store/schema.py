"""The tables, described once in SQLAlchemy Core.

Alembic revisions in ``migrations/`` create them; ``alembic check`` (run by the tests) proves
the revisions and this description agree. Every primary and unique key starts with
``conversation_id`` so the log can be partitioned or distributed by conversation.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import TextClause

from episodic.models import EVENT_KINDS

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

#: jsonb on PostgreSQL, JSON text on SQLite.
JsonDocument = JSON().with_variant(JSONB(), "postgresql")
Timestamp = DateTime(timezone=True)


def _zero() -> TextClause:
    return text("0")


conversations = Table(
    "episodic_conversations",
    metadata,
    Column("conversation_id", Uuid(), primary_key=True),
    Column("tenant_id", Text(), nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("metadata", JsonDocument, nullable=False),
    # The counters below are a projection of the log (see store/projection.py); they are what
    # keeps append, load_context and pressure O(1) in the length of the history.
    Column("last_seq", BigInteger(), nullable=False, server_default=_zero()),
    Column("boundary_seq", BigInteger(), nullable=True),
    Column("covers_through_seq", BigInteger(), nullable=False, server_default=_zero()),
    Column("total_user_messages", BigInteger(), nullable=False, server_default=_zero()),
    Column("user_messages_since_boundary", BigInteger(), nullable=False, server_default=_zero()),
    Column("run_completed_since_boundary", BigInteger(), nullable=False, server_default=_zero()),
    Column(
        "user_messages_since_run_completed", BigInteger(), nullable=False, server_default=_zero()
    ),
    Column("context_tokens", BigInteger(), nullable=False, server_default=_zero()),
    Column("usage_input_tokens", BigInteger(), nullable=True),
    Column("tokens_since_usage", BigInteger(), nullable=False, server_default=_zero()),
    # {tool_call_id: seq of the assistant message that made the call}, for calls still
    # waiting for their result. The smallest seq bounds the safe cut.
    Column("open_tool_calls", JsonDocument, nullable=False),
    # Compaction state, written by the worker.
    Column("due_since", Timestamp, nullable=True),
    Column("due_reason", Text(), nullable=True),
    Column("lease_owner", Text(), nullable=True),
    Column("lease_token", Uuid(), nullable=True),
    Column("lease_expires_at", Timestamp, nullable=True),
    Column("compaction_attempts", Integer(), nullable=False, server_default=_zero()),
    Column("next_attempt_at", Timestamp, nullable=True),
    Column("last_error", Text(), nullable=True),
    Column("dead_since", Timestamp, nullable=True),
    # When the latest boundary was written: the age the age_and_turns rule measures is that
    # of the current context, so an old conversation just compacted is not due again at once.
    Column("boundary_at", Timestamp, nullable=True),
    # Who the conversation is listed under, given at creation (list_by_user).
    Column("app_name", Text(), nullable=True),
    Column("user_id", Text(), nullable=True),
    # The caller's time of its latest write, in seconds since the epoch, exact.
    Column("touched_at", Float(), nullable=True),
    # The conversation's own state: a projection of its state events.
    Column("state", JsonDocument, nullable=True),
    # When it was deleted: hidden, closed to writes, its log kept.
    Column("deleted_at", Timestamp, nullable=True),
    # The worker's queue: conversations due for compaction, by when they may next be tried.
    # A tenant's conversations, newest first (list_conversations).
    Index("ix_episodic_conversations_tenant_created", "tenant_id", "created_at", "conversation_id"),
    # An app's conversations, by user (not by touched_at: every write moves it).
    Index(
        "ix_episodic_conversations_listed",
        "tenant_id",
        "app_name",
        "user_id",
        "conversation_id",
        postgresql_where=text("app_name IS NOT NULL AND deleted_at IS NULL"),
        sqlite_where=text("app_name IS NOT NULL AND deleted_at IS NULL"),
    ),
    Index(
        "ix_episodic_conversations_due",
        "next_attempt_at",
        postgresql_where=text("due_since IS NOT NULL AND dead_since IS NULL"),
        sqlite_where=text("due_since IS NOT NULL AND dead_since IS NULL"),
    ),
)

events = Table(
    "episodic_events",
    metadata,
    # No foreign key to the head: every insert already holds the head row's lock, and a
    # per-row RI check would cost a lookup per event on the hot path.
    Column("conversation_id", Uuid(), primary_key=True),
    Column("seq", BigInteger(), primary_key=True),
    Column("tenant_id", Text(), nullable=False),
    Column("kind", Text(), nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("token_estimate", Integer(), nullable=False),
    # The event body as JSON text, encoded once at append and decoded by the client. Text,
    # not jsonb: the database never looks inside on the request path, and jsonb would be
    # parsed on every insert and re-serialized on every load (and refuses \u0000).
    Column("payload", Text(), nullable=False),
    Column("client_id", Text(), nullable=True),
    # Provider-reported usage passed with the batch (JSON text, on its first event): the
    # pressure signal starts from its input_tokens, and rebuilding the head needs it.
    Column("usage", Text(), nullable=True),
    # Set on the first event of a batch appended with an idempotency key (or whose first
    # message has a client id); request_hash tells a true retry from a reused key.
    Column("idempotency_key", Text(), nullable=True),
    Column("request_hash", Text(), nullable=True),
    Column("batch_size", Integer(), nullable=True),
    CheckConstraint(f"kind IN ({', '.join(repr(kind) for kind in EVENT_KINDS)})", name="kind"),
    CheckConstraint("seq > 0", name="seq_positive"),
    # Partial: almost every row has neither, and NULLs would otherwise be indexed on every
    # append. Partial also keeps these indexes out of the planner's way for load_context: a
    # full index on (conversation_id, client_id) is one it can pick for a conversation's
    # range (it did, on a table not yet analyzed) and then filter every event by seq.
    Index(
        "uq_episodic_events_conversation_id_idempotency_key",
        "conversation_id",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
        sqlite_where=text("idempotency_key IS NOT NULL"),
    ),
    Index(
        "uq_episodic_events_conversation_id_client_id",
        "conversation_id",
        "client_id",
        unique=True,
        postgresql_where=text("client_id IS NOT NULL"),
        sqlite_where=text("client_id IS NOT NULL"),
    ),
)

compaction_attempts = Table(
    "episodic_compaction_attempts",
    metadata,
    Column("conversation_id", Uuid(), primary_key=True),
    Column("attempt_id", Uuid(), primary_key=True),
    Column("tenant_id", Text(), nullable=False),
    Column("worker", Text(), nullable=False),
    Column("reason", Text(), nullable=False),
    Column("outcome", Text(), nullable=False),
    Column("error", Text(), nullable=True),
    Column("started_at", Timestamp, nullable=False),
    Column("finished_at", Timestamp, nullable=False),
    Column("usage", JsonDocument, nullable=True),
    Column("model", Text(), nullable=True),
    Column("tokens_before", BigInteger(), nullable=True),
    Column("tokens_after", BigInteger(), nullable=True),
    Column("boundary_seq", BigInteger(), nullable=True),
)

# State shared by a tenant's conversations, by scope: a projection of their state events.
shared_state = Table(
    "episodic_shared_state",
    metadata,
    Column("tenant_id", Text(), primary_key=True),
    Column("scope", Text(), primary_key=True),
    Column("state", JsonDocument, nullable=False),
    Column("updated_at", Timestamp, nullable=False),
)

# The erasure ledger: a tombstone per erased conversation (and per erased tenant), counts and
# no content, append-only. On PostgreSQL, erased_xid is the erasing transaction: the delete
# triggers let only it remove the conversation's rows.
erasures = Table(
    "episodic_erasures",
    metadata,
    Column("tenant_id", Text(), primary_key=True),
    Column("erasure_id", Uuid(), primary_key=True),
    # NULL for a tenant's tombstone (its shared state, and its totals)
    Column("conversation_id", Uuid(), nullable=True),
    Column("conversation_created_at", Timestamp, nullable=True),
    Column("reason", Text(), nullable=False),
    Column("conversations", BigInteger(), nullable=False),
    Column("events", BigInteger(), nullable=False),
    Column("compaction_attempts", BigInteger(), nullable=False),
    Column("shared_states", BigInteger(), nullable=False),
    Column("erased_at", Timestamp, nullable=False),
    Column("erased_by", Text(), nullable=False),
    Column("erased_xid", BigInteger(), nullable=True),
    Index("ix_episodic_erasures_conversation_id", "conversation_id"),
    Index("ix_episodic_erasures_tenant_id_erased_at", "tenant_id", "erased_at"),
)

# API keys of the HTTP server (`episodic keys`): each names a tenant, and an operator key may
# also see every tenant's compaction status. Only a hash of the secret is kept; revoking
# stamps revoked_at. Not a tenant table (the server reads it before it knows the tenant).
api_keys = Table(
    "episodic_api_keys",
    metadata,
    Column("key_id", Text(), primary_key=True),
    Column("tenant_id", Text(), nullable=False),
    Column("secret_sha256", Text(), nullable=False),
    Column("operator", Boolean(), nullable=False),
    Column("label", Text(), nullable=True),
    Column("created_at", Timestamp, nullable=False),
    Column("revoked_at", Timestamp, nullable=True),
)

__all__ = [
    "NAMING_CONVENTION",
    "api_keys",
    "compaction_attempts",
    "conversations",
    "erasures",
    "events",
    "metadata",
    "shared_state",
]
