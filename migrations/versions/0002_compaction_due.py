"""Compaction due state: the trigger is evaluated on every append, in the same statement."""

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002_compaction_due"
down_revision: str | None = "0001_event_log"

OLD_SIGNATURES = (
    "episodic_append(uuid, bigint, text, text, text[], integer[], text[], text, bigint, integer, "
    "bigint, text[], text[], integer[], text[])",
    "episodic_mark_run_completed(uuid, integer)",
)
NEW_SIGNATURES = (
    "episodic_append(uuid, bigint, text, text, text[], integer[], text[], text, bigint, integer, "
    "bigint, text[], text[], integer[], text[], bigint, bigint, bigint, bigint)",
    "episodic_mark_run_completed(uuid, integer, bigint, bigint, bigint, bigint)",
)


def upgrade() -> None:
    op.add_column(
        "episodic_conversations",
        sa.Column("boundary_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "ix_episodic_conversations_due",
        "episodic_conversations",
        ["next_attempt_at"],
        postgresql_where=sa.text("due_since IS NOT NULL AND dead_since IS NULL"),
        sqlite_where=sa.text("due_since IS NOT NULL AND dead_since IS NULL"),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    for signature in OLD_SIGNATURES:
        op.execute(f"DROP FUNCTION {signature}")
    for statement in (TRIGGER_REASON, MARK_DUE, APPEND_V2, MARK_RUN_COMPLETED_V2):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for signature in NEW_SIGNATURES:
            op.execute(f"DROP FUNCTION {signature}")
        op.execute("DROP FUNCTION episodic_mark_due")
        op.execute("DROP FUNCTION episodic_trigger_reason")
        first = _load_revision("0001_event_log.py")
        op.execute(first.APPEND)
        op.execute(first.MARK_RUN_COMPLETED)
    op.drop_index("ix_episodic_conversations_due", table_name="episodic_conversations")
    op.drop_column("episodic_conversations", "boundary_at")


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Mirrors episodic.policy.episodic_compaction_trigger; a test compares the two on generated
# inputs. First match wins, every comparison >=.
TRIGGER_REASON = """
CREATE FUNCTION episodic_trigger_reason(
    p_estimate bigint,
    p_unfinished_turns bigint,
    p_age_days bigint,
    p_total_user_messages bigint,
    p_trigger_context_tokens bigint,
    p_trigger_unfinished_turns bigint,
    p_trigger_age_days bigint,
    p_trigger_age_turn_count bigint
) RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN p_estimate IS NOT NULL AND p_trigger_context_tokens IS NOT NULL
             AND p_estimate >= p_trigger_context_tokens THEN 'context_pressure'
        WHEN p_unfinished_turns >= p_trigger_unfinished_turns THEN 'unfinished_turns'
        WHEN p_age_days >= p_trigger_age_days
             AND p_total_user_messages >= p_trigger_age_turn_count THEN 'age_and_turns'
    END
$fn$
"""

# Marks the conversation due when the trigger fires on its head row (as just updated, passed
# in so no statement re-reads it), and wakes idle workers. A conversation already due or dead
# is left alone. Thresholds come from the caller's settings, overridden per conversation by
# metadata.compaction.<name>; the age is that of the current context (since the latest
# boundary), so an old conversation that was just compacted is not due again on its next
# message.
MARK_DUE = """
CREATE FUNCTION episodic_mark_due(
    c episodic_conversations,
    p_trigger_context_tokens bigint,
    p_trigger_unfinished_turns bigint,
    p_trigger_age_days bigint,
    p_trigger_age_turn_count bigint
) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    v_overrides jsonb;
    v_reason text;
BEGIN
    IF c.due_since IS NOT NULL OR c.dead_since IS NOT NULL THEN
        RETURN;
    END IF;
    v_overrides := COALESCE(c.metadata -> 'compaction', '{}'::jsonb);
    v_reason := episodic_trigger_reason(
        GREATEST(c.context_tokens, c.usage_input_tokens + c.tokens_since_usage),
        c.user_messages_since_run_completed,
        GREATEST(floor(extract(epoch FROM now() - COALESCE(c.boundary_at, c.created_at))
                       / 86400), 0)::bigint,
        c.total_user_messages,
        COALESCE((v_overrides ->> 'trigger_context_tokens')::bigint, p_trigger_context_tokens),
        COALESCE((v_overrides ->> 'trigger_unfinished_turns')::bigint,
                 p_trigger_unfinished_turns),
        COALESCE((v_overrides ->> 'trigger_age_days')::bigint, p_trigger_age_days),
        COALESCE((v_overrides ->> 'trigger_age_turn_count')::bigint, p_trigger_age_turn_count)
    );
    IF v_reason IS NULL THEN
        RETURN;
    END IF;
    UPDATE episodic_conversations
       SET due_since = now(), due_reason = v_reason, next_attempt_at = now(),
           compaction_attempts = 0, last_error = NULL
     WHERE conversation_id = c.conversation_id;
    PERFORM pg_notify('episodic_due', c.conversation_id::text);
END
$fn$
"""

APPEND_V2 = """
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
    p_trigger_context_tokens bigint,
    p_trigger_unfinished_turns bigint,
    p_trigger_age_days bigint,
    p_trigger_age_turn_count bigint
) RETURNS TABLE (o_outcome text, o_seq bigint, o_created_at timestamptz, o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_tenant text;
    v_last bigint;
    v_open jsonb;
    v_n integer := cardinality(p_payloads);
    v_prior_seq bigint;
    v_prior_at timestamptz;
    v_prior_hash text;
    v_bad text;
    v_head episodic_conversations;
BEGIN
    -- The row lock serializes appends to one conversation: seqs are gapless and a batch
    -- never interleaves with another. In READ COMMITTED each statement below takes a fresh
    -- snapshot, so once the lock is ours we see everything the previous holder committed.
    SELECT c.tenant_id, c.last_seq, c.open_tool_calls INTO v_tenant, v_last, v_open
      FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        SELECT e.seq, e.created_at, e.request_hash INTO v_prior_seq, v_prior_at, v_prior_hash
          FROM episodic_events e
         WHERE e.conversation_id = p_conversation_id AND e.idempotency_key = p_idempotency_key;
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

    IF array_remove(p_client_ids, NULL) <> '{}' THEN
        SELECT e.client_id INTO v_bad
          FROM episodic_events e
         WHERE e.conversation_id = p_conversation_id AND e.client_id = ANY (p_client_ids)
         LIMIT 1;
        IF FOUND THEN
            RETURN QUERY SELECT 'client_id_reused'::text, NULL::bigint, NULL::timestamptz, v_bad;
            RETURN;
        END IF;
    END IF;

    -- Most appends carry no tool calls or results: skip these checks then.
    IF cardinality(p_called_ids) > 0 THEN
        SELECT x INTO v_bad FROM unnest(p_called_ids) AS x WHERE v_open ? x LIMIT 1;
    END IF;
    IF cardinality(p_called_ids) > 0 AND FOUND THEN
        RETURN QUERY SELECT 'duplicate_tool_call'::text, NULL::bigint, NULL::timestamptz, v_bad;
        RETURN;
    END IF;

    IF cardinality(p_closed_ids) > 0 THEN
        SELECT x INTO v_bad FROM unnest(p_closed_ids) AS x WHERE NOT (v_open ? x) LIMIT 1;
    END IF;
    IF cardinality(p_closed_ids) > 0 AND FOUND THEN
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

    INSERT INTO episodic_events (
        conversation_id, seq, tenant_id, kind, created_at, token_estimate, payload, client_id,
        usage, idempotency_key, request_hash, batch_size
    )
    SELECT p_conversation_id, v_last + t.i, v_tenant, 'message', now(), t.tokens, t.payload,
           t.client_id,
           CASE WHEN t.i = 1 THEN p_usage END,
           CASE WHEN t.i = 1 THEN p_idempotency_key END,
           CASE WHEN t.i = 1 THEN p_request_hash END,
           CASE WHEN t.i = 1 THEN v_n END
      FROM unnest(p_payloads, p_token_estimates, p_client_ids)
           WITH ORDINALITY AS t(payload, tokens, client_id, i);

    UPDATE episodic_conversations c SET
        last_seq = v_last + v_n,
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
            WHEN cardinality(p_closed_ids) = 0 AND cardinality(p_opened_ids) = 0 THEN v_open
            ELSE (v_open - p_closed_ids) || COALESCE(
                (SELECT jsonb_object_agg(o.id, v_last + o.off + 1)
                   FROM unnest(p_opened_ids, p_opened_offsets) AS o(id, off)),
                '{}'::jsonb)
            END
     WHERE c.conversation_id = p_conversation_id
    RETURNING c.* INTO v_head;

    PERFORM episodic_mark_due(
        v_head, p_trigger_context_tokens, p_trigger_unfinished_turns,
        p_trigger_age_days, p_trigger_age_turn_count);
    RETURN QUERY SELECT 'appended'::text, v_last + 1, now(), NULL::text;
END
$fn$
"""


MARK_RUN_COMPLETED_V2 = """
CREATE FUNCTION episodic_mark_run_completed(
    p_conversation_id uuid,
    p_tokens_per_abandoned integer,
    p_trigger_context_tokens bigint,
    p_trigger_unfinished_turns bigint,
    p_trigger_age_days bigint,
    p_trigger_age_turn_count bigint
) RETURNS TABLE (o_outcome text, o_seq bigint, o_created_at timestamptz, o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_tenant text;
    v_last bigint;
    v_open jsonb;
    v_ids jsonb;
    v_count integer;
    v_tokens bigint;
    v_head episodic_conversations;
BEGIN
    SELECT c.tenant_id, c.last_seq, c.open_tool_calls INTO v_tenant, v_last, v_open
      FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
    SELECT COALESCE(jsonb_agg(j.key ORDER BY j.value::bigint, j.key COLLATE "C"), '[]'::jsonb),
           count(*)
      INTO v_ids, v_count
      FROM jsonb_each_text(v_open) AS j;
    v_tokens := v_count * p_tokens_per_abandoned;
    INSERT INTO episodic_events (
        conversation_id, seq, tenant_id, kind, created_at, token_estimate, payload
    ) VALUES (
        p_conversation_id, v_last + 1, v_tenant, 'run_completed', now(), v_tokens,
        jsonb_build_object('abandoned_tool_call_ids', v_ids)::text
    );
    UPDATE episodic_conversations c SET
        last_seq = v_last + 1,
        run_completed_since_boundary = c.run_completed_since_boundary + 1,
        user_messages_since_run_completed = 0,
        context_tokens = c.context_tokens + v_tokens,
        tokens_since_usage = c.tokens_since_usage + v_tokens,
        open_tool_calls = '{}'::jsonb
     WHERE c.conversation_id = p_conversation_id
    RETURNING c.* INTO v_head;
    PERFORM episodic_mark_due(
        v_head, p_trigger_context_tokens, p_trigger_unfinished_turns,
        p_trigger_age_days, p_trigger_age_turn_count);
    RETURN QUERY SELECT 'appended'::text, v_last + 1, now(), v_ids::text;
END
$fn$
"""
