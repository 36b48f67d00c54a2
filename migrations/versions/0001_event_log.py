"""The append-only event log: head, events, compaction attempts, and the append functions."""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_event_log"
down_revision: str | None = None

APPEND_ONLY = ("episodic_events", "episodic_compaction_attempts")


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _counter(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), nullable=False, server_default=sa.text("0"))


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "episodic_conversations",
        sa.Column("conversation_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("metadata", _json(), nullable=False),
        _counter("last_seq"),
        sa.Column("boundary_seq", sa.BigInteger(), nullable=True),
        _counter("covers_through_seq"),
        _counter("total_user_messages"),
        _counter("user_messages_since_boundary"),
        _counter("run_completed_since_boundary"),
        _counter("user_messages_since_run_completed"),
        _counter("context_tokens"),
        sa.Column("usage_input_tokens", sa.BigInteger(), nullable=True),
        _counter("tokens_since_usage"),
        sa.Column("open_tool_calls", _json(), nullable=False),
        sa.Column("due_since", ts, nullable=True),
        sa.Column("due_reason", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
        sa.Column("lease_expires_at", ts, nullable=True),
        sa.Column("compaction_attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", ts, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("dead_since", ts, nullable=True),
        sa.PrimaryKeyConstraint("conversation_id", name="pk_episodic_conversations"),
    )
    op.create_table(
        "episodic_events",
        sa.Column("conversation_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("token_estimate", sa.Integer(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("client_id", sa.Text(), nullable=True),
        sa.Column("usage", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "kind IN ('message', 'boundary', 'run_completed')", name=op.f("ck_episodic_events_kind")
        ),
        sa.CheckConstraint("seq > 0", name=op.f("ck_episodic_events_seq_positive")),
        sa.PrimaryKeyConstraint("conversation_id", "seq", name="pk_episodic_events"),
        sa.UniqueConstraint(
            "conversation_id",
            "idempotency_key",
            name="uq_episodic_events_conversation_id_idempotency_key",
        ),
        sa.UniqueConstraint(
            "conversation_id", "client_id", name="uq_episodic_events_conversation_id_client_id"
        ),
    )
    op.create_table(
        "episodic_compaction_attempts",
        sa.Column("conversation_id", sa.Uuid(), nullable=False),
        sa.Column("attempt_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("worker", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", ts, nullable=False),
        sa.Column("finished_at", ts, nullable=False),
        sa.Column("usage", _json(), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("tokens_before", sa.BigInteger(), nullable=True),
        sa.Column("tokens_after", sa.BigInteger(), nullable=True),
        sa.Column("boundary_seq", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint(
            "conversation_id", "attempt_id", name="pk_episodic_compaction_attempts"
        ),
    )
    if op.get_bind().dialect.name == "postgresql":
        for statement in POSTGRES_UPGRADE:
            op.execute(statement)
    else:
        for table in APPEND_ONLY:
            for operation in ("UPDATE", "DELETE"):
                # SQLite has no TRUNCATE; its truncate optimization for a bare DELETE is
                # turned off by the presence of a DELETE trigger, so this covers it.
                op.execute(
                    f"CREATE TRIGGER {table}_no_{operation.lower()} BEFORE {operation} "
                    f"ON {table} BEGIN SELECT RAISE(ABORT, "
                    f"'{table} is append-only: {operation} is not allowed'); END"
                )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION episodic_append")
        op.execute("DROP FUNCTION episodic_mark_run_completed")
    op.drop_table("episodic_compaction_attempts")
    op.drop_table("episodic_events")
    op.drop_table("episodic_conversations")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION episodic_refuse_change")


REFUSE_CHANGE = """
CREATE FUNCTION episodic_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'feature_not_supported',
              HINT = 'the log is never rewritten; append a new event instead';
END
$fn$
"""

# The whole append in one statement, so the request path is one round trip. Python has
# already validated and encoded the batch (episodic/store/batch.py); this checks what needs the
# conversation's state under the head's row lock, inserts, and advances the head exactly as
# HeadCounters.after_message does (episodic/store/projection.py). It reports refusals as an
# outcome row instead of raising, and refuses before writing anything.
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
    p_closed_ids text[]
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

    SELECT x INTO v_bad FROM unnest(p_called_ids) AS x WHERE v_open ? x LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT 'duplicate_tool_call'::text, NULL::bigint, NULL::timestamptz, v_bad;
        RETURN;
    END IF;

    SELECT x INTO v_bad FROM unnest(p_closed_ids) AS x WHERE NOT (v_open ? x) LIMIT 1;
    IF FOUND THEN
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
        open_tool_calls = (v_open - p_closed_ids) || COALESCE(
            (SELECT jsonb_object_agg(o.id, v_last + o.off + 1)
               FROM unnest(p_opened_ids, p_opened_offsets) AS o(id, off)),
            '{}'::jsonb)
     WHERE c.conversation_id = p_conversation_id;

    RETURN QUERY SELECT 'appended'::text, v_last + 1, now(), NULL::text;
END
$fn$
"""

# Closes the run: every call still open is recorded as abandoned (ordered by the seq that
# opened it, then by id in byte order, as HeadCounters.abandoned_ids does).
MARK_RUN_COMPLETED = """
CREATE FUNCTION episodic_mark_run_completed(
    p_conversation_id uuid,
    p_tokens_per_abandoned integer
) RETURNS TABLE (o_outcome text, o_seq bigint, o_created_at timestamptz, o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_tenant text;
    v_last bigint;
    v_open jsonb;
    v_ids jsonb;
    v_count integer;
    v_tokens bigint;
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
     WHERE c.conversation_id = p_conversation_id;
    RETURN QUERY SELECT 'appended'::text, v_last + 1, now(), v_ids::text;
END
$fn$
"""

POSTGRES_UPGRADE = [
    REFUSE_CHANGE,
    *(
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION episodic_refuse_change()"
        for table in APPEND_ONLY
    ),
    # TRUNCATE fires no row triggers; it needs its own statement-level one.
    *(
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION episodic_refuse_change()"
        for table in APPEND_ONLY
    ),
    APPEND,
    MARK_RUN_COMPLETED,
]
