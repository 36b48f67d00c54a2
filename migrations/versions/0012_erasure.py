"""Erasure: the one audited path that removes history, and the ledger of what it removed.

- ``episodic_erasures``, append-only: a tombstone per erased conversation (and per erased
  tenant), with counts of the rows removed, the reason, when and by which role; no content.
- ``episodic_eraser``, a new role (NOLOGIN, like the others): the only one granted DELETE,
  on the tables a conversation has rows in, and INSERT on the ledger. The app, the worker and
  episodic_all_tenants still get 42501 for any DELETE.
- The delete triggers of the log, the attempts ledger and the heads now let a row go only
  when the transaction removing it wrote the conversation's tombstone first (PostgreSQL:
  ``erased_xid``; SQLite, which has one writer and no roles: a head the erasing transaction
  marked with its tombstone's id). UPDATE and TRUNCATE are refused as before.
- ``episodic_create_conversation`` refuses an erased id unless ``p_reuse_erased`` (and now
  answers 'created', 'taken' or 'erased' through its raise); ``episodic_end_attempt`` writes
  no attempt for a conversation erased meanwhile ('gone'); ``episodic_append`` names the first
  reused client id in the batch's order (it named the index's first).

(Frozen once it ships: the current definitions are episodic/store/sql/schema.sql and
episodic/store/schema.py.)
"""

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0012_erasure"
down_revision: str | None = "0011_state_listings_deletion"

EARLIER_CREATE_SIGNATURE = (
    "episodic_create_conversation(uuid, text, timestamptz, jsonb, text, text, text, "
    "double precision, text)"
)
NEW_FUNCTIONS = (
    "episodic_create_conversation(uuid, text, timestamptz, jsonb, text, text, text, "
    "double precision, text, boolean)",
    "episodic_erase_conversation(uuid, uuid, text, text)",
    "episodic_erase_tenant(text, uuid, text, bigint, bigint, bigint)",
    "episodic_refuse_unrecorded_delete()",
    "episodic_erasing(uuid)",
)
TENANT = "current_setting('episodic.tenant_id', true)"
ERASABLE = (
    "episodic_conversations",
    "episodic_events",
    "episodic_compaction_attempts",
    "episodic_shared_state",
)
LEDGER = "episodic_erasures"
READERS = "episodic_app, episodic_worker, episodic_all_tenants, episodic_eraser"
#: (table, SQLite's delete trigger there, its refusal)
SQLITE_DELETE_TRIGGERS = (
    (
        "episodic_events",
        "episodic_events_no_delete",
        "episodic_events is append-only: DELETE is not allowed",
    ),
    (
        "episodic_compaction_attempts",
        "episodic_compaction_attempts_no_delete",
        "episodic_compaction_attempts is append-only: DELETE is not allowed",
    ),
    (
        "episodic_conversations",
        "episodic_conversations_no_delete",
        "the head row of a conversation cannot be deleted: its events would be orphaned, and "
        "the log is never rewritten: DELETE on episodic_conversations is not allowed",
    ),
)


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROLE = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'episodic_eraser') THEN
        CREATE ROLE episodic_eraser NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'episodic needs the role episodic_eraser, and % may not create roles',
                    current_user
        USING HINT = 'ask a superuser to run: CREATE ROLE episodic_eraser NOLOGIN; then run '
                     'episodic migrate again';
END $$
"""

APPEND = """
CREATE FUNCTION episodic_append(
    p_conversation_id uuid,
    p_expected_seq bigint,
    p_idempotency_key text,
    p_request_hash text,
    p_payloads text[],
    p_token_estimates integer[],
    p_client_ids text[],
    p_usage text,
    p_usage_input_tokens bigint,
    p_user_messages integer,
    p_token_sum bigint,
    p_called_ids text[],
    p_opened_ids text[],
    p_opened_offsets integer[],
    p_closed_ids text[],
    p_trigger jsonb,
    p_scope text DEFAULT NULL::text,
    p_state text DEFAULT NULL::text,
    p_touched_at double precision DEFAULT NULL::double precision
) RETURNS TABLE(o_outcome text, o_seq bigint, o_created_at timestamp with time zone, o_detail text)
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_last bigint;
    v_open jsonb;
    v_n integer := cardinality(p_payloads);
    v_prior_seq bigint;
    v_prior_at timestamptz;
    v_prior_hash text;
    v_bad text;
    v_head episodic_conversations;
    v_deleted timestamptz;
    -- a state change is one more event, after the batch's messages
    v_change jsonb := p_state::jsonb;
    v_extra integer := CASE WHEN p_state IS NULL THEN 0 ELSE 1 END;
BEGIN
    IF p_scope IS NOT NULL THEN
        PERFORM episodic_set_tenant(p_scope);
    END IF;
    -- What needs the head before the write: read it under its row lock.
    IF p_idempotency_key IS NOT NULL OR p_client_ids IS NOT NULL OR p_called_ids IS NOT NULL
       OR p_closed_ids IS NOT NULL THEN
        SELECT c.last_seq, c.open_tool_calls, c.deleted_at INTO v_last, v_open, v_deleted
          FROM episodic_conversations c
         WHERE c.conversation_id = p_conversation_id
           AND (p_scope IS NULL OR c.tenant_id = p_scope)
           FOR UPDATE;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
            RETURN;
        END IF;
        IF v_deleted IS NOT NULL THEN
            RETURN QUERY SELECT 'deleted'::text, v_last, NULL::timestamptz, NULL::text;
            RETURN;
        END IF;

        IF p_idempotency_key IS NOT NULL THEN
            SELECT e.seq, e.created_at, e.request_hash
              INTO v_prior_seq, v_prior_at, v_prior_hash
              FROM episodic_events e
             WHERE e.conversation_id = p_conversation_id
               AND e.idempotency_key = p_idempotency_key;
            IF FOUND THEN
                RETURN QUERY SELECT
                    CASE WHEN v_prior_hash = p_request_hash THEN 'replayed'
                         ELSE 'idempotency_mismatch' END,
                    v_prior_seq, v_prior_at, NULL::text;
                RETURN;
            END IF;
        END IF;

        IF p_expected_seq IS NOT NULL AND v_last <> p_expected_seq THEN
            RETURN QUERY SELECT 'conflict'::text, v_last, NULL::timestamptz, NULL::text;
            RETURN;
        END IF;

        IF p_client_ids IS NOT NULL THEN
            -- the first reused in the batch's order (the twin's), not the index's
            SELECT e.client_id INTO v_bad
              FROM episodic_events e
             WHERE e.conversation_id = p_conversation_id AND e.client_id = ANY (p_client_ids)
             ORDER BY array_position(p_client_ids, e.client_id)
             LIMIT 1;
            IF FOUND THEN
                RETURN QUERY SELECT 'client_id_reused'::text, NULL::bigint, NULL::timestamptz,
                                    v_bad;
                RETURN;
            END IF;
        END IF;

        IF p_called_ids IS NOT NULL THEN
            SELECT x INTO v_bad FROM unnest(p_called_ids) AS x WHERE v_open ? x LIMIT 1;
        END IF;
        IF p_called_ids IS NOT NULL AND FOUND THEN
            RETURN QUERY SELECT 'duplicate_tool_call'::text, NULL::bigint, NULL::timestamptz,
                                v_bad;
            RETURN;
        END IF;

        IF p_closed_ids IS NOT NULL THEN
            SELECT x INTO v_bad FROM unnest(p_closed_ids) AS x WHERE NOT (v_open ? x) LIMIT 1;
        END IF;
        IF p_closed_ids IS NOT NULL AND FOUND THEN
            -- Only on this error path is the log searched, to say why the result is refused.
            RETURN QUERY SELECT
                CASE WHEN EXISTS (
                    SELECT 1 FROM episodic_events e
                     WHERE e.conversation_id = p_conversation_id
                       AND e.kind = 'run_completed'
                       AND ((e.payload::jsonb -> 'abandoned_tool_call_ids') ? v_bad)
                ) THEN 'orphan_abandoned' ELSE 'orphan' END,
                NULL::bigint, NULL::timestamptz, v_bad;
            RETURN;
        END IF;
    END IF;

    UPDATE episodic_conversations c SET
        last_seq = c.last_seq + v_n + v_extra,
        total_user_messages = c.total_user_messages + p_user_messages,
        user_messages_since_boundary = c.user_messages_since_boundary + p_user_messages,
        user_messages_since_run_completed =
            c.user_messages_since_run_completed + p_user_messages,
        context_tokens = c.context_tokens + p_token_sum,
        usage_input_tokens = COALESCE(p_usage_input_tokens, c.usage_input_tokens),
        tokens_since_usage = CASE WHEN p_usage_input_tokens IS NULL
                                  THEN c.tokens_since_usage + p_token_sum
                                  ELSE p_token_sum END,
        open_tool_calls = CASE
            WHEN p_closed_ids IS NULL AND p_opened_ids IS NULL THEN c.open_tool_calls
            ELSE episodic_open_calls_after(c.open_tool_calls, p_closed_ids, p_opened_ids,
                                           p_opened_offsets, c.last_seq)
            END,
        state = CASE WHEN p_state IS NULL THEN c.state
                     ELSE COALESCE(c.state, '{}'::jsonb)
                          || COALESCE(v_change -> 'conversation', '{}'::jsonb) END,
        touched_at = COALESCE(p_touched_at, c.touched_at)
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope)
       AND (p_expected_seq IS NULL OR c.last_seq = p_expected_seq)
       AND c.deleted_at IS NULL
    RETURNING c.* INTO v_head;
    IF NOT FOUND THEN
        -- Only without the locking read above: the head is not there, or not at p_expected_seq.
        -- A head created after this statement began is not there for the update either: that
        -- is not_found (the caller creates or retries), never a conflict nobody asked for. A
        -- deletion is for good, so a deleted head says so whenever it is seen.
        SELECT c.last_seq, c.deleted_at INTO v_last, v_deleted FROM episodic_conversations c
         WHERE c.conversation_id = p_conversation_id
           AND (p_scope IS NULL OR c.tenant_id = p_scope);
        IF FOUND AND v_deleted IS NOT NULL THEN
            RETURN QUERY SELECT 'deleted'::text, v_last, NULL::timestamptz, NULL::text;
            RETURN;
        END IF;
        IF FOUND AND p_expected_seq IS NOT NULL AND v_last <> p_expected_seq THEN
            RETURN QUERY SELECT 'conflict'::text, v_last, NULL::timestamptz, NULL::text;
            RETURN;
        END IF;
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
    v_last := v_head.last_seq - v_n - v_extra;

    IF v_n = 1 THEN
        INSERT INTO episodic_events (
            conversation_id, seq, tenant_id, kind, created_at, token_estimate, payload,
            client_id, usage, idempotency_key, request_hash, batch_size
        ) VALUES (
            p_conversation_id, v_last + 1, v_head.tenant_id, 'message', now(),
            p_token_estimates[1], p_payloads[1], p_client_ids[1], p_usage, p_idempotency_key,
            p_request_hash, 1
        );
    ELSE
        INSERT INTO episodic_events (
            conversation_id, seq, tenant_id, kind, created_at, token_estimate, payload,
            client_id, usage, idempotency_key, request_hash, batch_size
        )
        SELECT p_conversation_id, v_last + t.i, v_head.tenant_id, 'message', now(), t.tokens,
               t.payload, t.client_id,
               CASE WHEN t.i = 1 THEN p_usage END,
               CASE WHEN t.i = 1 THEN p_idempotency_key END,
               CASE WHEN t.i = 1 THEN p_request_hash END,
               CASE WHEN t.i = 1 THEN v_n END
          FROM unnest(p_payloads, p_token_estimates, p_client_ids)
               WITH ORDINALITY AS t(payload, tokens, client_id, i);
    END IF;
    IF p_state IS NOT NULL THEN
        -- Stamped once the shared scopes' rows are locked: a concurrent writer to the same
        -- scope committed before this one is stamped earlier, so the log, in created_at
        -- order, folds into the scopes as they were applied (episodic/store/state.py).
        PERFORM episodic_apply_shared_state(v_head.tenant_id, v_change -> 'shared');
        INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                     token_estimate, payload)
        VALUES (p_conversation_id, v_last + v_n + 1, v_head.tenant_id, 'state',
                clock_timestamp(), 0, p_state);
    END IF;

    -- episodic_mark_due's own tests first, written out: most appends leave the head not
    -- due, and then no further function is called.
    IF v_head.due_since IS NULL AND v_head.dead_since IS NULL
       AND episodic_trigger_reason(v_head, p_trigger, now()) IS NOT NULL THEN
        PERFORM episodic_mark_due(v_head, p_trigger);
    END IF;
    RETURN QUERY SELECT 'appended'::text, v_last + 1, now(), NULL::text;
END
$fn$;
"""

ERASING = """
CREATE FUNCTION episodic_erasing(p_conversation_id uuid) RETURNS boolean
    LANGUAGE sql STABLE
    AS $fn$
    SELECT EXISTS (SELECT FROM episodic_erasures e
                    WHERE e.conversation_id = p_conversation_id
                      AND e.erased_xid = pg_current_xact_id()::text::bigint)
$fn$;
"""

REFUSE_UNRECORDED_DELETE = """
CREATE FUNCTION episodic_refuse_unrecorded_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF episodic_erasing(OLD.conversation_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'feature_not_supported',
              HINT = 'the log is never rewritten; only episodic erase removes a conversation, '
                     'and it leaves a tombstone in episodic_erasures';
END
$$;
"""

REFUSE_HEAD_REMOVAL = """
CREATE FUNCTION episodic_refuse_head_removal() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_LEVEL = 'ROW' AND episodic_erasing(OLD.conversation_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '%: % on % is not allowed',
        'the head row of a conversation cannot be deleted: its events would be orphaned, and '
        'the log is never rewritten', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'feature_not_supported',
              HINT = 'conversations are removed only by the erasure path of episodic';
END
$$;
"""

CREATE_CONVERSATION = """
CREATE FUNCTION episodic_create_conversation(
    p_conversation_id uuid,
    p_tenant_id text,
    p_created_at timestamp with time zone,
    p_metadata jsonb,
    p_scope text DEFAULT NULL::text,
    p_app_name text DEFAULT NULL::text,
    p_user_id text DEFAULT NULL::text,
    p_touched_at double precision DEFAULT NULL::double precision,
    p_state text DEFAULT NULL::text,
    p_reuse_erased boolean DEFAULT false
) RETURNS text
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_change jsonb := p_state::jsonb;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    INSERT INTO episodic_conversations (conversation_id, tenant_id, created_at, metadata,
                                        open_tool_calls, app_name, user_id, touched_at,
                                        last_seq, state)
    VALUES (p_conversation_id, p_tenant_id, p_created_at, p_metadata, '{}'::jsonb,
            p_app_name, p_user_id, p_touched_at, CASE WHEN p_state IS NULL THEN 0 ELSE 1 END,
            v_change -> 'conversation')
    ON CONFLICT (conversation_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'taken';
    END IF;
    -- An erased id comes back only when the caller says so. Checked after the insert, which
    -- waits for an erasure of the same id in flight: then this statement sees its tombstone,
    -- and the raise takes the insert back.
    IF NOT p_reuse_erased AND EXISTS (SELECT FROM episodic_erasures e
                                       WHERE e.conversation_id = p_conversation_id
                                         AND e.tenant_id = p_tenant_id) THEN
        RAISE EXCEPTION 'conversation % was erased', p_conversation_id
            USING ERRCODE = 'EP410';
    END IF;
    -- An initial state is the log's first event, so the state is still a fold of the log.
    IF p_state IS NOT NULL THEN
        -- Stamped once the scopes are locked, as in episodic_append.
        PERFORM episodic_apply_shared_state(p_tenant_id, v_change -> 'shared');
        INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                     token_estimate, payload)
        VALUES (p_conversation_id, 1, p_tenant_id, 'state', clock_timestamp(), 0, p_state);
    END IF;
    RETURN 'created';
END
$fn$;
"""

END_ATTEMPT = """
CREATE FUNCTION episodic_end_attempt(
    p_conversation_id uuid,
    p_lease_token uuid,
    p_clear_due boolean,
    p_retry_in_seconds double precision,
    p_dead boolean,
    p_attempt jsonb,
    p_scope text DEFAULT NULL::text
) RETURNS text
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_held boolean;
    v_outcome text;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    PERFORM FROM episodic_conversations c
      WHERE c.conversation_id = p_conversation_id AND c.tenant_id = p_attempt ->> 'tenant_id'
        FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN 'gone';
    END IF;
    UPDATE episodic_conversations
       SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
           due_since = CASE WHEN p_clear_due THEN NULL ELSE due_since END,
           due_reason = CASE WHEN p_clear_due THEN NULL ELSE due_reason END,
           compaction_attempts = CASE WHEN p_clear_due THEN 0 ELSE compaction_attempts END,
           next_attempt_at = CASE WHEN p_clear_due THEN NULL
                                  ELSE now() + make_interval(secs => p_retry_in_seconds) END,
           dead_since = CASE WHEN p_dead THEN now() ELSE dead_since END,
           last_error = p_attempt ->> 'error'
     WHERE conversation_id = p_conversation_id AND lease_token = p_lease_token
       AND tenant_id = p_attempt ->> 'tenant_id';
    v_held := FOUND;
    INSERT INTO episodic_compaction_attempts
    SELECT (jsonb_populate_record(
                NULL::episodic_compaction_attempts,
                p_attempt || jsonb_build_object(
                    'outcome', CASE WHEN v_held THEN p_attempt ->> 'outcome' ELSE 'lease_lost' END,
                    'finished_at', now(), 'tokens_after', NULL, 'boundary_seq', NULL))).*
    RETURNING outcome INTO v_outcome;
    RETURN v_outcome;
END
$fn$;
"""

ERASE_CONVERSATION = """
CREATE FUNCTION episodic_erase_conversation(
    p_conversation_id uuid,
    p_erasure_id uuid,
    p_reason text,
    p_scope text DEFAULT NULL::text
) RETURNS SETOF episodic_erasures
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_head episodic_conversations;
    v_events bigint;
    v_attempts bigint;
    v_removed bigint;
    v_tombstone episodic_erasures;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    SELECT * INTO v_head FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM episodic_erasures e
                      WHERE e.conversation_id = p_conversation_id
                        AND (p_scope IS NULL OR e.tenant_id = p_scope)
                      ORDER BY e.erased_at DESC
                      LIMIT 1;
        RETURN;
    END IF;
    -- Stable now: every writer of these rows holds the head's lock (or waits for it).
    SELECT count(*) INTO v_events FROM episodic_events e
     WHERE e.conversation_id = p_conversation_id;
    SELECT count(*) INTO v_attempts FROM episodic_compaction_attempts a
     WHERE a.conversation_id = p_conversation_id;
    INSERT INTO episodic_erasures (erasure_id, tenant_id, conversation_id,
                                   conversation_created_at, reason, conversations, events,
                                   compaction_attempts, shared_states, erased_at, erased_by,
                                   erased_xid)
    VALUES (p_erasure_id, v_head.tenant_id, p_conversation_id, v_head.created_at, p_reason, 1,
            v_events, v_attempts, 0, now(), current_user, pg_current_xact_id()::text::bigint)
    RETURNING * INTO v_tombstone;
    DELETE FROM episodic_events e WHERE e.conversation_id = p_conversation_id;
    GET DIAGNOSTICS v_removed = ROW_COUNT;
    DELETE FROM episodic_compaction_attempts a WHERE a.conversation_id = p_conversation_id;
    DELETE FROM episodic_conversations c WHERE c.conversation_id = p_conversation_id;
    IF v_removed <> v_events THEN
        -- the tombstone would misstate what went: take it all back
        RAISE EXCEPTION 'erasing conversation %: counted % events, removed %',
            p_conversation_id, v_events, v_removed;
    END IF;
    RETURN NEXT v_tombstone;
END
$fn$;
"""

ERASE_TENANT = """
CREATE FUNCTION episodic_erase_tenant(
    p_tenant_id text,
    p_erasure_id uuid,
    p_reason text,
    p_conversations bigint,
    p_events bigint,
    p_attempts bigint
) RETURNS SETOF episodic_erasures
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_states bigint;
    v_tombstone episodic_erasures;
BEGIN
    PERFORM episodic_set_tenant(p_tenant_id);
    IF EXISTS (SELECT FROM episodic_conversations c WHERE c.tenant_id = p_tenant_id) THEN
        RAISE EXCEPTION 'tenant % still has conversations', p_tenant_id
            USING ERRCODE = 'EP409';
    END IF;
    SELECT count(*) INTO v_states FROM episodic_shared_state s WHERE s.tenant_id = p_tenant_id;
    IF p_conversations = 0 AND v_states = 0 THEN
        SELECT * INTO v_tombstone FROM episodic_erasures e
         WHERE e.tenant_id = p_tenant_id AND e.conversation_id IS NULL
         ORDER BY e.erased_at DESC
         LIMIT 1;
        IF FOUND THEN
            RETURN NEXT v_tombstone;
            RETURN;
        END IF;
    END IF;
    DELETE FROM episodic_shared_state s WHERE s.tenant_id = p_tenant_id;
    -- Again, in a new snapshot: a conversation created meanwhile may have written the state
    -- just deleted (the DELETE waited for it); then its erasure comes first, and this again.
    IF EXISTS (SELECT FROM episodic_conversations c WHERE c.tenant_id = p_tenant_id) THEN
        RAISE EXCEPTION 'tenant % still has conversations', p_tenant_id
            USING ERRCODE = 'EP409';
    END IF;
    INSERT INTO episodic_erasures (erasure_id, tenant_id, conversation_id,
                                   conversation_created_at, reason, conversations, events,
                                   compaction_attempts, shared_states, erased_at, erased_by,
                                   erased_xid)
    VALUES (p_erasure_id, p_tenant_id, NULL, NULL, p_reason, p_conversations, p_events,
            p_attempts, v_states, now(), current_user, pg_current_xact_id()::text::bigint)
    RETURNING * INTO v_tombstone;
    RETURN NEXT v_tombstone;
END
$fn$;
"""


def _replacing(definition: str) -> str:
    return definition.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _sqlite_condition(table: str) -> str:
    """When SQLite lets a row of ``table`` go: its conversation's head is marked (in its
    lease column, which an erased conversation no longer needs) with the id of a tombstone,
    which only the erasing transaction does, just before it deletes. A tombstone alone is
    not enough: an erased id may be imported again, with the same creation time."""
    if table == "episodic_conversations":
        return (
            "EXISTS (SELECT 1 FROM episodic_erasures e WHERE e.conversation_id = "
            "OLD.conversation_id AND e.erasure_id = OLD.lease_token)"
        )
    return (
        "EXISTS (SELECT 1 FROM episodic_erasures e JOIN episodic_conversations c "
        "ON c.conversation_id = e.conversation_id AND c.lease_token = e.erasure_id "
        "WHERE e.conversation_id = OLD.conversation_id)"
    )


def _create_ledger() -> None:
    op.create_table(
        LEDGER,
        sa.Column("erasure_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("conversation_id", sa.Uuid(), nullable=True),
        sa.Column("conversation_created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("conversations", sa.BigInteger(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("compaction_attempts", sa.BigInteger(), nullable=False),
        sa.Column("shared_states", sa.BigInteger(), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("erased_by", sa.Text(), nullable=False),
        sa.Column("erased_xid", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "erasure_id", name="pk_episodic_erasures"),
    )
    op.create_index("ix_episodic_erasures_conversation_id", LEDGER, ["conversation_id"])
    op.create_index("ix_episodic_erasures_tenant_id_erased_at", LEDGER, ["tenant_id", "erased_at"])


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute(ROLE)
    _create_ledger()
    if not postgres:
        for table, trigger, refusal in SQLITE_DELETE_TRIGGERS:
            op.execute(f"DROP TRIGGER {trigger}")
            op.execute(
                f"CREATE TRIGGER {trigger} BEFORE DELETE ON {table} "
                f"WHEN NOT {_sqlite_condition(table)} "
                f"BEGIN SELECT RAISE(ABORT, '{refusal}'); END"
            )
        for operation in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {LEDGER}_no_{operation.lower()} BEFORE {operation} ON {LEDGER} "
                f"BEGIN SELECT RAISE(ABORT, '{LEDGER} is append-only: {operation} is not "
                "allowed'); END"
            )
        return
    for definition in (ERASING, REFUSE_UNRECORDED_DELETE):
        op.execute(definition)
    op.execute(_replacing(REFUSE_HEAD_REMOVAL))
    for table in ("episodic_events", "episodic_compaction_attempts"):
        op.execute(f"DROP TRIGGER {table}_append_only ON {table}")
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION episodic_refuse_change()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_erasure_only BEFORE DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION episodic_refuse_unrecorded_delete()"
        )
    op.execute(
        f"CREATE TRIGGER {LEDGER}_append_only BEFORE DELETE OR UPDATE ON {LEDGER} "
        "FOR EACH ROW EXECUTE FUNCTION episodic_refuse_change()"
    )
    op.execute(
        f"CREATE TRIGGER {LEDGER}_no_truncate BEFORE TRUNCATE ON {LEDGER} "
        "FOR EACH STATEMENT EXECUTE FUNCTION episodic_refuse_change()"
    )
    op.execute(f"ALTER TABLE {LEDGER} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {LEDGER} FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY episodic_tenant_rows ON {LEDGER} "
        f"USING (tenant_id = {TENANT}) WITH CHECK (tenant_id = {TENANT})"
    )
    op.execute(
        f"CREATE POLICY episodic_all_tenants_rows ON {LEDGER} "
        "TO episodic_all_tenants USING (true) WITH CHECK (true)"
    )
    for table in (*ERASABLE, LEDGER):
        op.execute(
            f"CREATE POLICY episodic_eraser_rows ON {table} "
            "TO episodic_eraser USING (true) WITH CHECK (true)"
        )
    # A row lock needs the UPDATE privilege; the eraser's may lock a head, never change one.
    op.execute(
        "CREATE POLICY episodic_eraser_locks_only ON episodic_conversations AS RESTRICTIVE "
        "FOR UPDATE TO episodic_eraser USING (true) WITH CHECK (false)"
    )
    op.execute("GRANT SELECT ON episodic_alembic_version TO episodic_eraser")
    op.execute(f"GRANT SELECT ON {LEDGER} TO {READERS}")
    op.execute(f"GRANT INSERT ON {LEDGER} TO episodic_eraser")
    op.execute(f"GRANT SELECT, DELETE ON {', '.join(ERASABLE)} TO episodic_eraser")
    op.execute("GRANT UPDATE (deleted_at) ON episodic_conversations TO episodic_eraser")
    op.execute(f"DROP FUNCTION {EARLIER_CREATE_SIGNATURE}")
    for definition in (CREATE_CONVERSATION, ERASE_CONVERSATION, ERASE_TENANT):
        op.execute(definition)
    op.execute(_replacing(END_ATTEMPT))
    op.execute(_replacing(APPEND))


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if not postgres:
        for operation in ("update", "delete"):
            op.execute(f"DROP TRIGGER {LEDGER}_no_{operation}")
        for table, trigger, refusal in SQLITE_DELETE_TRIGGERS:
            op.execute(f"DROP TRIGGER {trigger}")
            op.execute(
                f"CREATE TRIGGER {trigger} BEFORE DELETE ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{refusal}'); END"
            )
        op.drop_table(LEDGER)
        return
    for signature in NEW_FUNCTIONS[:3]:
        op.execute(f"DROP FUNCTION {signature}")
    op.execute(_load_revision("0011_state_listings_deletion.py").CREATE_CONVERSATION)
    op.execute(_replacing(_load_revision("0006_named_parameters.py").END_ATTEMPT))
    op.execute(_replacing(_load_revision("0011_state_listings_deletion.py").APPEND))
    for table in ("episodic_events", "episodic_compaction_attempts"):
        op.execute(f"DROP TRIGGER {table}_erasure_only ON {table}")
        op.execute(f"DROP TRIGGER {table}_append_only ON {table}")
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE DELETE OR UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION episodic_refuse_change()"
        )
    op.execute(_replacing(_load_revision("0005_protected_heads.py").REFUSE_HEAD_REMOVAL))
    op.execute("DROP POLICY episodic_eraser_locks_only ON episodic_conversations")
    for table in ERASABLE:
        op.execute(f"DROP POLICY episodic_eraser_rows ON {table}")
        op.execute(f"REVOKE ALL ON {table} FROM episodic_eraser")
    op.execute("REVOKE ALL ON episodic_alembic_version FROM episodic_eraser")
    op.drop_table(LEDGER)
    for signature in NEW_FUNCTIONS[3:]:
        op.execute(f"DROP FUNCTION {signature}")
