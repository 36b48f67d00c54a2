"""Every function takes named parameters, the trigger's thresholds travel as one jsonb, and
the scoped and unscoped forms are one function each.

``episodic_write_boundary`` and ``episodic_end_attempt`` took 25 and 16 unnamed positional
parameters, and the four trigger thresholds were positional arguments of six signatures. Now:

- every parameter is named (``p_...``), and Python calls them by name;
- the compaction trigger is ``episodic_trigger_reason(p_head, p_trigger jsonb, p_now)``, the
  twin of ``episodic.store.due.due_reason``, with the thresholds as EpisodicCompactionConfig's
  JSON and the metadata overrides applied inside: a new rule changes one SQL function, not six
  signatures;
- ``episodic_scoped_*`` are gone: each request-path function takes an optional ``p_scope`` (the
  tenant a scoped store acts for) and sets it itself, still in the caller's one statement;
- an attempt to record travels as one jsonb row (``jsonb_populate_record``);
- the age sweep is ``episodic_sweep_due``, the same trigger evaluated now.

The functions below are frozen copies of ``episodic/store/sql/schema.sql`` as of this revision;
that file is the current definition, and tests/contract/test_schema.py compares the two.
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0006_named_parameters"
down_revision: str | None = "0005_protected_heads"

#: What revisions 0001-0005 left, replaced here.
OLD_SIGNATURES = (
    "episodic_append(uuid, bigint, text, text, text[], integer[], text[], text, bigint, integer, "
    "bigint, text[], text[], integer[], text[], bigint, bigint, bigint, bigint)",
    "episodic_mark_run_completed(uuid, integer, bigint, bigint, bigint, bigint)",
    "episodic_mark_due(episodic_conversations, bigint, bigint, bigint, bigint)",
    "episodic_trigger_reason(bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint)",
    "episodic_load_tail(uuid, bigint)",
    "episodic_scoped_append(text, uuid, bigint, text, text, text[], integer[], text[], text, "
    "bigint, integer, bigint, text[], text[], integer[], text[], bigint, bigint, bigint, bigint)",
    "episodic_scoped_mark_run_completed(text, uuid, integer, bigint, bigint, bigint, bigint)",
    "episodic_scoped_create_conversation(text, uuid, timestamptz, jsonb)",
    "episodic_scoped_load_tail(text, uuid, bigint)",
    "episodic_scoped_head(text, uuid)",
    "episodic_write_boundary(uuid, bigint, bigint, bigint, bigint, bigint, bigint, bigint, "
    "timestamptz, bigint, uuid, integer, text, uuid, text, text, text, text, timestamptz, "
    "timestamptz, jsonb, text, bigint, bigint, text)",
    "episodic_end_attempt(uuid, uuid, boolean, double precision, boolean, text, uuid, text, "
    "text, text, text, timestamptz, jsonb, text, bigint, text)",
    "episodic_set_tenant(text)",
)

NEW_SIGNATURES = (
    "episodic_set_tenant(text)",
    "episodic_lock_head(uuid, text)",
    "episodic_trigger_reason(episodic_conversations, jsonb, timestamptz)",
    "episodic_mark_due(episodic_conversations, jsonb)",
    "episodic_sweep_due(jsonb)",
    "episodic_create_conversation(uuid, text, timestamptz, jsonb, text)",
    "episodic_append(uuid, bigint, text, text, text[], integer[], text[], text, bigint, integer, "
    "bigint, text[], text[], integer[], text[], jsonb, text)",
    "episodic_mark_run_completed(uuid, integer, jsonb, text)",
    "episodic_load_tail(uuid, bigint, text)",
    "episodic_head(uuid, text)",
    "episodic_write_boundary(uuid, bigint, bigint, uuid, bigint, bigint, bigint, bigint, bigint, "
    "bigint, timestamptz, integer, text, jsonb, text)",
    "episodic_end_attempt(uuid, uuid, boolean, double precision, boolean, jsonb, text)",
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite has no functions: its backend runs the Python twins
    for signature in OLD_SIGNATURES:
        op.execute(f"DROP FUNCTION {signature}")
    for statement in FUNCTIONS:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for signature in NEW_SIGNATURES:
        op.execute(f"DROP FUNCTION {signature}")
    second, third, fourth = (
        _load_revision(name)
        for name in (
            "0002_compaction_due.py",
            "0003_partial_unique_keys.py",
            "0004_tenant_isolation.py",
        )
    )
    for statement in (
        second.TRIGGER_REASON,
        second.MARK_DUE,
        second.APPEND_V2,
        second.MARK_RUN_COMPLETED_V2,
        third.LOAD_TAIL,
        fourth.SET_TENANT,
        fourth.SCOPED_CREATE,
        fourth.SCOPED_APPEND,
        fourth.SCOPED_MARK,
        fourth.SCOPED_LOAD_TAIL,
        fourth.SCOPED_HEAD,
        fourth.WRITE_BOUNDARY,
        fourth.END_ATTEMPT,
    ):
        op.execute(statement)


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _function(signature: str, frozen: str, *changes: tuple[str, str]) -> str:
    """The function ``signature`` with the body of ``frozen`` (an earlier revision's CREATE
    FUNCTION) edited by ``changes``, each found exactly once."""
    body = frozen.split("$fn$")[1]
    for old, new in changes:
        assert body.count(old) == 1, f"not exactly once in the frozen body: {old!r}"
        body = body.replace(old, new)
    return f"{signature}    AS $fn${body}$fn$"


# ---- frozen copies of episodic/store/sql/schema.sql at this revision ---------------------------
# fmt: off

SET_TENANT = """
CREATE FUNCTION episodic_set_tenant(p_tenant text) RETURNS void
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    IF p_tenant IS NOT NULL THEN
        -- is_local = true: the setting ends with the transaction, so a pooled connection
        -- never carries one request's tenant into the next.
        PERFORM set_config('episodic.tenant_id', p_tenant, true);
    END IF;
END
$fn$
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
       FOR UPDATE;
    RETURN v_head;
END
$fn$
"""

TRIGGER_REASON = """
CREATE FUNCTION episodic_trigger_reason(
    p_head episodic_conversations,
    p_trigger jsonb,
    p_now timestamp with time zone
) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    AS $fn$
DECLARE
    v_config jsonb := p_trigger
        || jsonb_strip_nulls(COALESCE(p_head.metadata -> 'compaction', '{}'::jsonb));
BEGIN
    IF (v_config ->> 'trigger_context_tokens') IS NOT NULL
       AND GREATEST(p_head.context_tokens, p_head.usage_input_tokens + p_head.tokens_since_usage)
           >= (v_config ->> 'trigger_context_tokens')::bigint THEN
        RETURN 'context_pressure';
    END IF;
    IF p_head.user_messages_since_run_completed
       >= (v_config ->> 'trigger_unfinished_turns')::bigint THEN
        RETURN 'unfinished_turns';
    END IF;
    IF GREATEST(floor(extract(epoch FROM
           p_now - COALESCE(p_head.boundary_at, p_head.created_at)) / 86400), 0)
           >= (v_config ->> 'trigger_age_days')::bigint
       AND p_head.total_user_messages >= (v_config ->> 'trigger_age_turn_count')::bigint THEN
        RETURN 'age_and_turns';
    END IF;
    RETURN NULL;
END
$fn$
"""

MARK_DUE = """
CREATE FUNCTION episodic_mark_due(p_head episodic_conversations, p_trigger jsonb) RETURNS boolean
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_reason text;
BEGIN
    IF p_head.due_since IS NOT NULL OR p_head.dead_since IS NOT NULL THEN
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
       AND due_since IS NULL AND dead_since IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('episodic_due', p_head.conversation_id::text);
    RETURN true;
END
$fn$
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
         WHERE c.due_since IS NULL AND c.dead_since IS NULL
           AND c.last_seq > COALESCE(c.boundary_seq, 0)
           AND episodic_trigger_reason(c, p_trigger, now()) IS NOT NULL
    LOOP
        IF episodic_mark_due(v_head, p_trigger) THEN
            RETURN NEXT v_head.conversation_id;
        END IF;
    END LOOP;
END
$fn$
"""

CREATE_CONVERSATION = """
CREATE FUNCTION episodic_create_conversation(
    p_conversation_id uuid,
    p_tenant_id text,
    p_created_at timestamp with time zone,
    p_metadata jsonb,
    p_scope text DEFAULT NULL::text
) RETURNS boolean
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    INSERT INTO episodic_conversations (conversation_id, tenant_id, created_at, metadata,
                                        open_tool_calls)
    VALUES (p_conversation_id, p_tenant_id, p_created_at, p_metadata, '{}'::jsonb)
    ON CONFLICT (conversation_id) DO NOTHING;
    RETURN FOUND;
END
$fn$
"""




HEAD = """
CREATE FUNCTION episodic_head(
    p_conversation_id uuid,
    p_scope text DEFAULT NULL::text
) RETURNS SETOF episodic_conversations
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    RETURN QUERY SELECT * FROM episodic_conversations c
                  WHERE c.conversation_id = p_conversation_id
                    AND (p_scope IS NULL OR c.tenant_id = p_scope);
END
$fn$
"""

WRITE_BOUNDARY = """
CREATE FUNCTION episodic_write_boundary(
    p_conversation_id uuid,
    p_planned_last_seq bigint,
    p_planned_boundary_seq bigint,
    p_lease_token uuid,
    p_seq bigint,
    p_covers_through_seq bigint,
    p_user_messages_since_boundary bigint,
    p_run_completed_since_boundary bigint,
    p_user_messages_since_run_completed bigint,
    p_context_tokens bigint,
    p_created_at timestamp with time zone,
    p_token_estimate integer,
    p_payload text,
    p_attempt jsonb DEFAULT NULL::jsonb,
    p_scope text DEFAULT NULL::text
) RETURNS bigint
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_written bigint;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    WITH head AS (
        UPDATE episodic_conversations SET
            last_seq = p_seq, boundary_seq = p_seq, covers_through_seq = p_covers_through_seq,
            user_messages_since_boundary = p_user_messages_since_boundary,
            run_completed_since_boundary = p_run_completed_since_boundary,
            user_messages_since_run_completed = p_user_messages_since_run_completed,
            context_tokens = p_context_tokens,
            usage_input_tokens = NULL, tokens_since_usage = 0,
            due_since = NULL, due_reason = NULL, lease_owner = NULL, lease_token = NULL,
            lease_expires_at = NULL, compaction_attempts = 0, next_attempt_at = NULL,
            last_error = NULL, dead_since = NULL, boundary_at = p_created_at
         WHERE conversation_id = p_conversation_id
           AND (p_scope IS NULL OR tenant_id = p_scope)
           AND last_seq = p_planned_last_seq
           AND boundary_seq IS NOT DISTINCT FROM p_planned_boundary_seq
           AND (p_lease_token IS NULL
                OR (lease_token = p_lease_token AND lease_expires_at > now()))
        RETURNING tenant_id
    ), boundary AS (
        INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                     token_estimate, payload)
        SELECT p_conversation_id, p_seq, head.tenant_id, 'boundary', p_created_at,
               p_token_estimate, p_payload
          FROM head
        RETURNING seq
    ), attempt AS (
        INSERT INTO episodic_compaction_attempts
        SELECT (jsonb_populate_record(
                    NULL::episodic_compaction_attempts,
                    p_attempt || jsonb_build_object('tenant_id', head.tenant_id,
                                                    'boundary_seq', p_seq))).*
          FROM head
         WHERE p_attempt IS NOT NULL
    )
    SELECT count(*) INTO v_written FROM boundary;
    RETURN v_written;
END
$fn$
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
$fn$
"""

# episodic_append, episodic_mark_run_completed and episodic_load_tail keep their bodies from
# revisions 0002 and 0003 but for what this revision changes: the head is locked (and the
# tenant set) by episodic_lock_head, the due check takes the thresholds as one jsonb, and the
# tail is read for the scope. Built from those frozen texts, so this file says what changed.
_SECOND = _load_revision("0002_compaction_due.py")
_THIRD = _load_revision("0003_partial_unique_keys.py")

_LOCKED = """
    IF v_head.conversation_id IS NULL THEN"""
_DUE_OLD = """
    PERFORM episodic_mark_due(
        v_head, p_trigger_context_tokens, p_trigger_unfinished_turns,
        p_trigger_age_days, p_trigger_age_turn_count);"""
_DUE_NEW = """
    PERFORM episodic_mark_due(v_head, p_trigger);"""

APPEND = _function(
    """CREATE FUNCTION episodic_append(
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
    p_scope text DEFAULT NULL::text
) RETURNS TABLE(o_outcome text, o_seq bigint, o_created_at timestamp with time zone, o_detail text)
    LANGUAGE plpgsql
""",
    _SECOND.APPEND_V2,
    (
        """
    v_tenant text;
    v_last bigint;
    v_open jsonb;""",
        """
    v_head episodic_conversations := episodic_lock_head(p_conversation_id, p_scope);
    v_tenant text := v_head.tenant_id;
    v_last bigint := v_head.last_seq;
    v_open jsonb := v_head.open_tool_calls;""",
    ),
    ("""
    v_head episodic_conversations;""", ""),
    (
        """
    -- The row lock serializes appends to one conversation: seqs are gapless and a batch
    -- never interleaves with another. In READ COMMITTED each statement below takes a fresh
    -- snapshot, so once the lock is ours we see everything the previous holder committed.
    SELECT c.tenant_id, c.last_seq, c.open_tool_calls INTO v_tenant, v_last, v_open
      FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       FOR UPDATE;
    IF NOT FOUND THEN""",
        _LOCKED,
    ),
    (_DUE_OLD, _DUE_NEW),
)

MARK_RUN_COMPLETED = _function(
    """CREATE FUNCTION episodic_mark_run_completed(
    p_conversation_id uuid,
    p_tokens_per_abandoned integer,
    p_trigger jsonb,
    p_scope text DEFAULT NULL::text
) RETURNS TABLE(o_outcome text, o_seq bigint, o_created_at timestamp with time zone, o_detail text)
    LANGUAGE plpgsql
""",
    _SECOND.MARK_RUN_COMPLETED_V2,
    (
        """
    v_tenant text;
    v_last bigint;
    v_open jsonb;""",
        """
    v_head episodic_conversations := episodic_lock_head(p_conversation_id, p_scope);
    v_tenant text := v_head.tenant_id;
    v_last bigint := v_head.last_seq;""",
    ),
    ("""
    v_head episodic_conversations;""", ""),
    (
        """
    SELECT c.tenant_id, c.last_seq, c.open_tool_calls INTO v_tenant, v_last, v_open
      FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       FOR UPDATE;
    IF NOT FOUND THEN""",
        _LOCKED,
    ),
    ("jsonb_each_text(v_open)", "jsonb_each_text(v_head.open_tool_calls)"),
    (_DUE_OLD, _DUE_NEW),
)

LOAD_TAIL = _function(
    """CREATE FUNCTION episodic_load_tail(
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
""",
    _THIRD.LOAD_TAIL,
    ("""
BEGIN
""", """
BEGIN
    PERFORM episodic_set_tenant(p_scope);
"""),
    (
        """
     WHERE c.conversation_id = p_conversation_id;""",
        """
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope);""",
    ),
    (
        """
    -- From the latest cut (or p_after_seq, for the boundary writer) to the last seq. EXECUTE:
    -- planned on every call with these bounds, never from a cached generic plan.""",
        """
    -- EXECUTE: planned on every call with these bounds, never from a cached generic plan that
    -- a pooled connection made while the table was nearly empty (and that scans a whole
    -- conversation). The bounds are the head's as read: a boundary or an append committed
    -- since is simply not included.""",
    ),
)


FUNCTIONS = (
    SET_TENANT,
    LOCK_HEAD,
    TRIGGER_REASON,
    MARK_DUE,
    SWEEP_DUE,
    CREATE_CONVERSATION,
    APPEND,
    MARK_RUN_COMPLETED,
    LOAD_TAIL,
    HEAD,
    WRITE_BOUNDARY,
    END_ATTEMPT,
)
