"""State beside the log, listings by app and user, and deletion: what an agent framework's
session service needs (Google ADK's first).

- A ``StateChange`` is appended as an event of kind ``state`` (after the messages it came
  with, or first, at creation) and applied in the same statement to the head's new ``state``
  column and to ``episodic_shared_state``, the tenant's scopes that many conversations read
  (ADK's app and user state). Both are projections of the log, like the head's counters.
- The head names the app and user it is listed under (``app_name``, ``user_id``, indexed
  for ``list_by_user``) and the caller's time of its latest write (``touched_at``).
- A ``deletion`` event hides a conversation (``deleted_at``): not listed, not loaded, closed
  to writes; its log is kept for an audit or an erasure.

(Frozen once it ships: the current definitions are episodic/store/sql/schema.sql and
episodic/store/schema.py.)
"""

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011_state_listings_deletion"
down_revision: str | None = "0010_append_sees_a_new_head"

KINDS = (
    "('message', 'boundary', 'run_completed', 'retraction', 'clear', 'usage', 'state', 'deletion')"
)
EARLIER_KINDS = "('message', 'boundary', 'run_completed', 'retraction', 'clear', 'usage')"

EARLIER_APPEND_SIGNATURE = (
    "episodic_append(uuid, bigint, text, text, text[], integer[], text[], text, bigint, integer, "
    "bigint, text[], text[], integer[], text[], jsonb, text)"
)
APPEND_SIGNATURE = (
    "episodic_append(uuid, bigint, text, text, text[], integer[], text[], text, bigint, integer, "
    "bigint, text[], text[], integer[], text[], jsonb, text, text, double precision)"
)
EARLIER_CREATE_SIGNATURE = "episodic_create_conversation(uuid, text, timestamptz, jsonb, text)"
CREATE_SIGNATURE = (
    "episodic_create_conversation(uuid, text, timestamptz, jsonb, text, text, text, "
    "double precision, text)"
)
NEW_FUNCTIONS = (
    "episodic_apply_shared_state(text, jsonb)",
    "episodic_read_state(uuid, text, text[], text)",
    "episodic_list_by_user(text, text, text, text, uuid, integer, text)",
)

#: jsonb on PostgreSQL, JSON text on SQLite
DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
HEAD_COLUMNS = (
    ("app_name", sa.Text()),
    ("user_id", sa.Text()),
    ("touched_at", sa.Float()),
    ("state", DOCUMENT),
    ("deleted_at", sa.DateTime(timezone=True)),
)
LISTED = "ix_episodic_conversations_listed"
LISTED_WHERE = "app_name IS NOT NULL AND deleted_at IS NULL"
TENANT = "current_setting('episodic.tenant_id', true)"


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: SQLite copies the table to change a constraint (as 0009 did): its keys and triggers come
#: back as revision 0003 made them.
_NINTH = _load_revision("0009_retractions_and_clears.py")

APPLY_SHARED_STATE = """
CREATE FUNCTION episodic_apply_shared_state(p_tenant_id text, p_shared jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    IF p_shared IS NULL OR p_shared = '{}'::jsonb THEN
        RETURN;
    END IF;
    INSERT INTO episodic_shared_state AS s (tenant_id, scope, state, updated_at)
    SELECT p_tenant_id, j.key, j.value, now()
      FROM jsonb_each(p_shared) AS j
     ORDER BY j.key COLLATE "C"
    ON CONFLICT (tenant_id, scope) DO UPDATE
       SET state = s.state || excluded.state, updated_at = excluded.updated_at;
END
$fn$;
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
    p_state text DEFAULT NULL::text
) RETURNS boolean
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
        RETURN false;
    END IF;
    -- An initial state is the log's first event, so the state is still a fold of the log.
    IF p_state IS NOT NULL THEN
        -- Stamped once the scopes are locked, as in episodic_append.
        PERFORM episodic_apply_shared_state(p_tenant_id, v_change -> 'shared');
        INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                     token_estimate, payload)
        VALUES (p_conversation_id, 1, p_tenant_id, 'state', clock_timestamp(), 0, p_state);
    END IF;
    RETURN true;
END
$fn$;
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
            SELECT e.client_id INTO v_bad
              FROM episodic_events e
             WHERE e.conversation_id = p_conversation_id AND e.client_id = ANY (p_client_ids)
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

LOCK_HEAD = """
CREATE FUNCTION episodic_lock_head(p_conversation_id uuid, p_scope text)
    RETURNS episodic_conversations
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_head episodic_conversations;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    SELECT * INTO v_head FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope)
       AND c.deleted_at IS NULL
       FOR UPDATE;
    RETURN v_head;
END
$fn$;
"""

LOAD_TAIL = """
CREATE FUNCTION episodic_load_tail(
    p_conversation_id uuid,
    p_after_seq bigint DEFAULT NULL::bigint,
    p_scope text DEFAULT NULL::text
) RETURNS TABLE (
    o_last_seq bigint,
    o_boundary_seq bigint,
    o_seq bigint,
    o_kind text,
    o_created_at timestamp with time zone,
    o_token_estimate integer,
    o_payload text,
    o_usage text
)
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_last bigint;
    v_boundary bigint;
    v_covers bigint;
BEGIN
    IF p_scope IS NOT NULL THEN
        PERFORM episodic_set_tenant(p_scope);
    END IF;
    SELECT c.last_seq, c.boundary_seq, c.covers_through_seq INTO v_last, v_boundary, v_covers
      FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope)
       AND c.deleted_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- EXECUTE: planned on every call with these bounds, never from a cached generic plan that
    -- a pooled connection made while the table was nearly empty (and that scans a whole
    -- conversation). The bounds are the head's as read: a boundary or an append committed
    -- since is simply not included.
    RETURN QUERY EXECUTE
        'SELECT $1, $2, e.seq, e.kind, e.created_at, e.token_estimate, e.payload, e.usage
           FROM episodic_events e
          WHERE e.conversation_id = $3 AND e.seq > $4 AND e.seq <= $5
          ORDER BY e.seq'
        USING v_last, v_boundary, p_conversation_id, COALESCE(p_after_seq, v_covers), v_last;
    IF NOT FOUND THEN
        -- Nothing after the cut: still say where the conversation stands.
        RETURN QUERY SELECT v_last, v_boundary, NULL::bigint, NULL::text, NULL::timestamptz,
                            NULL::integer, NULL::text, NULL::text;
    END IF;
END
$fn$;
"""

WRITE_EVENT = """
CREATE FUNCTION episodic_write_event(
    p_conversation_id uuid,
    p_planned_last_seq bigint,
    p_seq bigint,
    p_kind text,
    p_created_at timestamp with time zone,
    p_payload text,
    p_covers_through_seq bigint,
    p_total_user_messages bigint,
    p_user_messages_since_boundary bigint,
    p_run_completed_since_boundary bigint,
    p_user_messages_since_run_completed bigint,
    p_context_tokens bigint,
    p_usage_input_tokens bigint,
    p_tokens_since_usage bigint,
    p_open_tool_calls jsonb,
    p_context_since timestamp with time zone,
    p_trigger jsonb,
    p_scope text DEFAULT NULL::text
) RETURNS bigint
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_head episodic_conversations;
BEGIN
    IF p_scope IS NOT NULL THEN
        PERFORM episodic_set_tenant(p_scope);
    END IF;
    UPDATE episodic_conversations c SET
        last_seq = p_seq, covers_through_seq = p_covers_through_seq,
        total_user_messages = p_total_user_messages,
        user_messages_since_boundary = p_user_messages_since_boundary,
        run_completed_since_boundary = p_run_completed_since_boundary,
        user_messages_since_run_completed = p_user_messages_since_run_completed,
        context_tokens = p_context_tokens,
        usage_input_tokens = p_usage_input_tokens,
        tokens_since_usage = p_tokens_since_usage,
        open_tool_calls = p_open_tool_calls,
        boundary_at = COALESCE(p_context_since, c.boundary_at),
        -- a deletion hides the conversation and takes it off the worker's queue
        deleted_at = CASE WHEN p_kind = 'deletion' THEN p_created_at ELSE c.deleted_at END,
        due_since = CASE WHEN p_kind = 'deletion' THEN NULL ELSE c.due_since END,
        due_reason = CASE WHEN p_kind = 'deletion' THEN NULL ELSE c.due_reason END
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope)
       AND c.last_seq = p_planned_last_seq
       AND c.deleted_at IS NULL
    RETURNING c.* INTO v_head;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                 token_estimate, payload)
    VALUES (p_conversation_id, p_seq, v_head.tenant_id, p_kind, p_created_at, 0, p_payload);
    IF p_kind <> 'deletion' AND v_head.due_since IS NULL AND v_head.dead_since IS NULL
       AND episodic_trigger_reason(v_head, p_trigger, now()) IS NOT NULL THEN
        PERFORM episodic_mark_due(v_head, p_trigger);
    END IF;
    RETURN 1;
END
$fn$;
"""

READ_STATE = """
CREATE FUNCTION episodic_read_state(
    p_conversation_id uuid,
    p_tenant_id text,
    p_shared text[],
    p_scope text DEFAULT NULL::text
) RETURNS TABLE (
    o_scope text,
    o_state jsonb,
    o_last_seq bigint,
    o_touched_at double precision
)
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_tenant text := COALESCE(p_scope, p_tenant_id);
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    IF p_conversation_id IS NOT NULL THEN
        SELECT c.tenant_id INTO v_tenant FROM episodic_conversations c
         WHERE c.conversation_id = p_conversation_id
           AND (p_scope IS NULL OR c.tenant_id = p_scope)
           AND c.deleted_at IS NULL;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY SELECT NULL::text, COALESCE(c.state, '{}'::jsonb), c.last_seq, c.touched_at
          FROM episodic_conversations c
         WHERE c.conversation_id = p_conversation_id;
    END IF;
    RETURN QUERY SELECT s.scope, s.state, NULL::bigint, NULL::double precision
      FROM episodic_shared_state s
     WHERE s.tenant_id = v_tenant AND s.scope = ANY (p_shared);
END
$fn$;
"""

LIST_BY_USER = """
CREATE FUNCTION episodic_list_by_user(
    p_tenant_id text,
    p_app_name text,
    p_user_id text,
    p_after_user text,
    p_after_id uuid,
    p_limit integer,
    p_scope text DEFAULT NULL::text
) RETURNS SETOF episodic_conversations
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    RETURN QUERY SELECT * FROM episodic_conversations c
     WHERE c.tenant_id = COALESCE(p_scope, p_tenant_id)
       AND c.app_name = p_app_name
       AND c.deleted_at IS NULL
       AND (p_user_id IS NULL OR c.user_id = p_user_id)
       AND (p_after_id IS NULL OR (c.user_id, c.conversation_id) > (p_after_user, p_after_id))
     ORDER BY c.user_id, c.conversation_id
     LIMIT p_limit;
END
$fn$;
"""

MARK_DUE = """
CREATE FUNCTION episodic_mark_due(p_head episodic_conversations, p_trigger jsonb) RETURNS boolean
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_reason text;
BEGIN
    IF p_head.due_since IS NOT NULL OR p_head.dead_since IS NOT NULL
       OR p_head.deleted_at IS NOT NULL THEN
        RETURN false;
    END IF;
    v_reason := episodic_trigger_reason(p_head, p_trigger, now());
    IF v_reason IS NULL THEN
        RETURN false;
    END IF;
    -- Checked again on the row as it is now: the sweep reads heads without locking them.
    UPDATE episodic_conversations
       SET due_since = now(), due_reason = v_reason, next_attempt_at = now(),
           compaction_attempts = 0, last_error = NULL
     WHERE conversation_id = p_head.conversation_id
       AND due_since IS NULL AND dead_since IS NULL AND deleted_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('episodic_due', p_head.conversation_id::text);
    RETURN true;
END
$fn$;
"""

SWEEP_DUE = """
CREATE FUNCTION episodic_sweep_due(p_trigger jsonb) RETURNS SETOF uuid
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_head episodic_conversations;
BEGIN
    -- The rule is asked in the scan, so only the few heads it fires on go through
    -- episodic_mark_due (which asks again, on the row as it is when updated).
    FOR v_head IN
        SELECT * FROM episodic_conversations c
         WHERE c.due_since IS NULL AND c.dead_since IS NULL AND c.deleted_at IS NULL
           AND c.last_seq > COALESCE(c.boundary_seq, 0)
           AND episodic_trigger_reason(c, p_trigger, now()) IS NOT NULL
    LOOP
        IF episodic_mark_due(v_head, p_trigger) THEN
            RETURN NEXT v_head.conversation_id;
        END IF;
    END LOOP;
END
$fn$;
"""


def _replacing(definition: str) -> str:
    return definition.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name, kind in HEAD_COLUMNS:
        op.add_column("episodic_conversations", sa.Column(name, kind, nullable=True))
    op.create_index(
        LISTED,
        "episodic_conversations",
        ["tenant_id", "app_name", "user_id", "conversation_id"],
        postgresql_where=sa.text(LISTED_WHERE),
        sqlite_where=sa.text(LISTED_WHERE),
    )
    op.create_table(
        "episodic_shared_state",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("state", DOCUMENT, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "scope", name="pk_episodic_shared_state"),
    )
    _NINTH._kinds(KINDS)
    if not postgres:
        return
    op.execute("ALTER TABLE episodic_shared_state ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE episodic_shared_state FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY episodic_tenant_rows ON episodic_shared_state "
        f"USING (tenant_id = {TENANT}) WITH CHECK (tenant_id = {TENANT})"
    )
    op.execute(
        "CREATE POLICY episodic_all_tenants_rows ON episodic_shared_state "
        "TO episodic_all_tenants USING (true) WITH CHECK (true)"
    )
    op.execute(
        "GRANT SELECT, INSERT, UPDATE ON episodic_shared_state "
        "TO episodic_app, episodic_all_tenants"
    )
    # The worker's appends and events set these too (its grant is by column).
    op.execute(
        "GRANT UPDATE (touched_at, state, deleted_at) ON episodic_conversations TO episodic_worker"
    )
    op.execute(f"DROP FUNCTION {EARLIER_APPEND_SIGNATURE}")
    op.execute(f"DROP FUNCTION {EARLIER_CREATE_SIGNATURE}")
    for definition in (APPLY_SHARED_STATE, CREATE_CONVERSATION, APPEND, READ_STATE, LIST_BY_USER):
        op.execute(definition)
    for definition in (LOCK_HEAD, LOAD_TAIL, WRITE_EVENT, MARK_DUE, SWEEP_DUE):
        op.execute(_replacing(definition))


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        for signature in (APPEND_SIGNATURE, CREATE_SIGNATURE, *NEW_FUNCTIONS):
            op.execute(f"DROP FUNCTION {signature}")
        sixth = _load_revision("0006_named_parameters.py")
        op.execute(_load_revision("0010_append_sees_a_new_head.py").APPEND)
        op.execute(sixth.CREATE_CONVERSATION)
        op.execute(_replacing(sixth.LOCK_HEAD))
        op.execute(_replacing(_load_revision("0008_coalesced_appends.py").LOAD_TAIL))
        op.execute(_replacing(_NINTH.WRITE_EVENT))
        op.execute(_replacing(sixth.MARK_DUE))
        op.execute(_replacing(sixth.SWEEP_DUE))
    _NINTH._kinds(EARLIER_KINDS)
    op.drop_table("episodic_shared_state")
    op.drop_index(LISTED, table_name="episodic_conversations")
    for name, _ in HEAD_COLUMNS:
        op.drop_column("episodic_conversations", name)
