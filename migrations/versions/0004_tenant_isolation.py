"""Tenant isolation enforced by PostgreSQL: row-level security with FORCE, runtime roles.

Every tenant table (head, events, attempts) gets row-level security with FORCE, so the owner
is held to the policies too: a row is visible and writable only while the transaction's
``episodic.tenant_id`` setting (``set_config(..., true)``, transaction-local, so it never
leaks to the next user of a pooled connection) names its tenant. Unset means no rows.

Three NOLOGIN roles, granted to login roles by whoever deploys:

- ``episodic_app``: the request path. Reads and appends within the transaction's tenant.
  May not UPDATE or DELETE events or attempts at all (42501 before any trigger runs).
- ``episodic_worker``: the compaction worker. Also sees every conversation's head (counters,
  lease and due columns, metadata; never a message), because it claims work across tenants;
  it reads events and writes boundaries only under the claimed conversation's tenant. It may
  UPDATE only the head's counter and lease columns, never a row's tenant or metadata.
- ``episodic_all_tenants``: every row of every tenant, for an unscoped ``EpisodicStore`` in a
  single-tenant deployment or for operators. Runtime roles should not be members.

No function here is SECURITY DEFINER: the ``episodic_scoped_*`` functions set the tenant in
the caller's transaction and run with the caller's rights, so the request path stays one
round trip and the policies still decide. They also check the tenant themselves, so a scoped
store connected as a superuser or an ``episodic_all_tenants`` member (whom policies do not
restrict) still sees only its tenant.

SQLite has no roles or row-level security: there, ``store.for_tenant()`` enforces the scope in
the store. Both get an index for listing a tenant's conversations, newest first.
"""

from alembic import op

revision: str = "0004_tenant_isolation"
down_revision: str | None = "0003_partial_unique_keys"

TENANT_TABLES = ("episodic_conversations", "episodic_events", "episodic_compaction_attempts")
ROLES = ("episodic_app", "episodic_worker", "episodic_all_tenants")
TENANT = "current_setting('episodic.tenant_id', true)"

# The head columns the worker writes (claim, lease, end of attempt, boundary counters):
# everything but the identity, tenant, creation time and metadata.
WORKER_HEAD_COLUMNS = """
    last_seq, boundary_seq, covers_through_seq, open_tool_calls, total_user_messages,
    user_messages_since_boundary, run_completed_since_boundary,
    user_messages_since_run_completed, context_tokens, usage_input_tokens, tokens_since_usage,
    due_since, due_reason, next_attempt_at, compaction_attempts, last_error, dead_since,
    lease_owner, lease_token, lease_expires_at, boundary_at
"""


def upgrade() -> None:
    op.create_index(
        "ix_episodic_conversations_tenant_created",
        "episodic_conversations",
        ["tenant_id", "created_at", "conversation_id"],
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    for role in ROLES:
        # Roles belong to the cluster, not the database: another database's migration (or
        # the DBA) may have made them already.
        op.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN "
            f"CREATE ROLE {role} NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE; "
            "END IF; EXCEPTION WHEN insufficient_privilege THEN RAISE EXCEPTION "
            f"'episodic needs the role {role}, and % may not create roles', current_user "
            "USING HINT = 'ask a superuser to run: CREATE ROLE episodic_app NOLOGIN; CREATE "
            "ROLE episodic_worker NOLOGIN; CREATE ROLE episodic_all_tenants NOLOGIN; then run "
            "episodic migrate again'; END $$"
        )
    op.execute("GRANT SELECT, INSERT, UPDATE ON episodic_conversations TO episodic_app")
    op.execute("GRANT SELECT, INSERT ON episodic_events TO episodic_app")
    op.execute("GRANT SELECT ON episodic_compaction_attempts TO episodic_app")
    op.execute("GRANT SELECT ON episodic_conversations TO episodic_worker")
    op.execute(f"GRANT UPDATE ({WORKER_HEAD_COLUMNS}) ON episodic_conversations TO episodic_worker")
    op.execute("GRANT SELECT, INSERT ON episodic_events TO episodic_worker")
    op.execute("GRANT SELECT, INSERT ON episodic_compaction_attempts TO episodic_worker")
    op.execute("GRANT SELECT, INSERT, UPDATE ON episodic_conversations TO episodic_all_tenants")
    op.execute(
        "GRANT SELECT, INSERT ON episodic_events, episodic_compaction_attempts "
        "TO episodic_all_tenants"
    )
    for table in TENANT_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY episodic_tenant_rows ON {table} "
            f"USING (tenant_id = {TENANT}) WITH CHECK (tenant_id = {TENANT})"
        )
        op.execute(
            f"CREATE POLICY episodic_all_tenants_rows ON {table} TO episodic_all_tenants "
            "USING (true) WITH CHECK (true)"
        )
    # The worker's queue: every head (to claim), every attempt (for `episodic status`).
    op.execute(
        "CREATE POLICY episodic_worker_queue ON episodic_conversations FOR SELECT "
        "TO episodic_worker USING (true)"
    )
    op.execute(
        "CREATE POLICY episodic_worker_leases ON episodic_conversations FOR UPDATE "
        "TO episodic_worker USING (true) WITH CHECK (true)"
    )
    op.execute(
        "CREATE POLICY episodic_worker_ledger ON episodic_compaction_attempts FOR SELECT "
        "TO episodic_worker USING (true)"
    )
    for statement in (
        SET_TENANT,
        SCOPED_CREATE,
        SCOPED_APPEND,
        SCOPED_MARK,
        SCOPED_LOAD_TAIL,
        SCOPED_HEAD,
        WRITE_BOUNDARY,
        END_ATTEMPT,
    ):
        op.execute(statement)


def downgrade() -> None:
    op.drop_index("ix_episodic_conversations_tenant_created", table_name="episodic_conversations")
    if op.get_bind().dialect.name != "postgresql":
        return
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION {signature}")
    for table in TENANT_TABLES:
        for policy in ("episodic_tenant_rows", "episodic_all_tenants_rows"):
            op.execute(f"DROP POLICY {policy} ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute("DROP POLICY episodic_worker_queue ON episodic_conversations")
    op.execute("DROP POLICY episodic_worker_leases ON episodic_conversations")
    op.execute("DROP POLICY episodic_worker_ledger ON episodic_compaction_attempts")
    for role in ROLES:
        # The roles stay (other databases may use them); this database's grants go.
        op.execute(f"REVOKE ALL ON {', '.join(TENANT_TABLES)} FROM {role}")


SIGNATURES = (
    "episodic_end_attempt(uuid, uuid, boolean, double precision, boolean, text, uuid, text, "
    "text, text, text, timestamptz, jsonb, text, bigint, text)",
    "episodic_write_boundary(uuid, bigint, bigint, bigint, bigint, bigint, bigint, bigint, "
    "timestamptz, bigint, uuid, integer, text, uuid, text, text, text, text, timestamptz, "
    "timestamptz, jsonb, text, bigint, bigint, text)",
    "episodic_scoped_head(text, uuid)",
    "episodic_scoped_load_tail(text, uuid, bigint)",
    "episodic_scoped_mark_run_completed(text, uuid, integer, bigint, bigint, bigint, bigint)",
    "episodic_scoped_append(text, uuid, bigint, text, text, text[], integer[], text[], text, "
    "bigint, integer, bigint, text[], text[], integer[], text[], bigint, bigint, bigint, bigint)",
    "episodic_scoped_create_conversation(text, uuid, timestamptz, jsonb)",
    "episodic_set_tenant(text)",
)

SET_TENANT = """
CREATE FUNCTION episodic_set_tenant(p_tenant text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    -- is_local = true: the setting ends with the transaction, so a pooled connection never
    -- carries one request's tenant into the next.
    PERFORM set_config('episodic.tenant_id', p_tenant, true);
END
$fn$
"""

SCOPED_CREATE = """
CREATE FUNCTION episodic_scoped_create_conversation(
    p_tenant text, p_conversation_id uuid, p_created_at timestamptz, p_metadata jsonb
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM episodic_set_tenant(p_tenant);
    INSERT INTO episodic_conversations (conversation_id, tenant_id, created_at, metadata,
                                        open_tool_calls)
    VALUES (p_conversation_id, p_tenant, p_created_at, p_metadata, '{}'::jsonb)
    ON CONFLICT (conversation_id) DO NOTHING;
    RETURN FOUND;
END
$fn$
"""

# The conversation must belong to the tenant (checked here as well as by the policies, which
# do not restrict a superuser); then the unscoped function does the work in the same
# transaction, under the tenant just set.
_OWNED = """
    PERFORM episodic_set_tenant(p_tenant);
    PERFORM 1 FROM episodic_conversations c
      WHERE c.conversation_id = p_conversation_id AND c.tenant_id = p_tenant;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
"""

SCOPED_APPEND = f"""
CREATE FUNCTION episodic_scoped_append(
    p_tenant text,
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
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
{_OWNED}
    RETURN QUERY SELECT * FROM episodic_append(
        p_conversation_id, p_expected_seq, p_idempotency_key, p_request_hash, p_payloads,
        p_token_estimates, p_client_ids, p_usage, p_usage_input_tokens, p_user_messages,
        p_token_sum, p_called_ids, p_opened_ids, p_opened_offsets, p_closed_ids,
        p_trigger_context_tokens, p_trigger_unfinished_turns, p_trigger_age_days,
        p_trigger_age_turn_count);
END
$fn$
"""

SCOPED_MARK = f"""
CREATE FUNCTION episodic_scoped_mark_run_completed(
    p_tenant text,
    p_conversation_id uuid,
    p_tokens_per_abandoned integer,
    p_trigger_context_tokens bigint,
    p_trigger_unfinished_turns bigint,
    p_trigger_age_days bigint,
    p_trigger_age_turn_count bigint
) RETURNS TABLE (o_outcome text, o_seq bigint, o_created_at timestamptz, o_detail text)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
{_OWNED}
    RETURN QUERY SELECT * FROM episodic_mark_run_completed(
        p_conversation_id, p_tokens_per_abandoned, p_trigger_context_tokens,
        p_trigger_unfinished_turns, p_trigger_age_days, p_trigger_age_turn_count);
END
$fn$
"""

SCOPED_LOAD_TAIL = """
CREATE FUNCTION episodic_scoped_load_tail(
    p_tenant text, p_conversation_id uuid, p_after_seq bigint DEFAULT NULL
)
RETURNS TABLE (
    o_last_seq bigint, o_boundary_seq bigint, o_seq bigint, o_kind text,
    o_created_at timestamptz, o_token_estimate integer, o_payload text, o_usage text
)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM episodic_set_tenant(p_tenant);
    PERFORM 1 FROM episodic_conversations c
      WHERE c.conversation_id = p_conversation_id AND c.tenant_id = p_tenant;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM episodic_load_tail(p_conversation_id, p_after_seq);
END
$fn$
"""

SCOPED_HEAD = """
CREATE FUNCTION episodic_scoped_head(p_tenant text, p_conversation_id uuid)
RETURNS SETOF episodic_conversations
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM episodic_set_tenant(p_tenant);
    RETURN QUERY SELECT * FROM episodic_conversations c
                  WHERE c.conversation_id = p_conversation_id AND c.tenant_id = p_tenant;
END
$fn$
"""

# The boundary write and the end of an attempt, as functions so that a tenant-scoped caller
# (the worker always is one) sets its tenant in the same round trip. $25 / $16: the tenant,
# or NULL for a caller whose role sees every tenant.
#
# The boundary applies only if the head is still the one the caller planned on (same last
# seq, same boundary, lease still held); it returns the number of boundaries written, 0 or 1.
WRITE_BOUNDARY = """
CREATE FUNCTION episodic_write_boundary(
    uuid, bigint, bigint, bigint, bigint, bigint, bigint, bigint, timestamptz, bigint, uuid,
    integer, text, uuid, text, text, text, text, timestamptz, timestamptz, jsonb, text, bigint,
    bigint, text
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_written bigint;
BEGIN
    IF $25 IS NOT NULL THEN
        PERFORM episodic_set_tenant($25);
    END IF;
    WITH head AS (
        UPDATE episodic_conversations SET
            last_seq = $3, boundary_seq = $3, covers_through_seq = $4,
            user_messages_since_boundary = $5, run_completed_since_boundary = $6,
            user_messages_since_run_completed = $7, context_tokens = $8,
            usage_input_tokens = NULL, tokens_since_usage = 0,
            due_since = NULL, due_reason = NULL, lease_owner = NULL, lease_token = NULL,
            lease_expires_at = NULL, compaction_attempts = 0, next_attempt_at = NULL,
            last_error = NULL, dead_since = NULL, boundary_at = $9
         WHERE conversation_id = $1
           AND ($25 IS NULL OR tenant_id = $25)
           AND last_seq = $2
           AND boundary_seq IS NOT DISTINCT FROM $10
           AND ($11 IS NULL OR (lease_token = $11 AND lease_expires_at > now()))
        RETURNING tenant_id
    ), boundary AS (
        INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                     token_estimate, payload)
        SELECT $1, $3, tenant_id, 'boundary', $9, $12, $13 FROM head
        RETURNING seq
    ), attempt AS (
        INSERT INTO episodic_compaction_attempts (
            conversation_id, attempt_id, tenant_id, worker, reason, outcome, error, started_at,
            finished_at, usage, model, tokens_before, tokens_after, boundary_seq
        )
        SELECT $1, $14, tenant_id, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $3
          FROM head
         WHERE $14 IS NOT NULL
    )
    SELECT count(*) INTO v_written FROM boundary;
    RETURN v_written;
END
$fn$
"""

# Ends an attempt that wrote no boundary, fenced by the lease token, and records it. A
# worker whose lease was taken over changes nothing but the ledger ('lease_lost').
END_ATTEMPT = """
CREATE FUNCTION episodic_end_attempt(
    uuid, uuid, boolean, double precision, boolean, text, uuid, text, text, text, text,
    timestamptz, jsonb, text, bigint, text
) RETURNS text
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_outcome text;
BEGIN
    IF $16 IS NOT NULL THEN
        PERFORM episodic_set_tenant($16);
    END IF;
    WITH head AS (
        UPDATE episodic_conversations
           SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
               due_since = CASE WHEN $3 THEN NULL ELSE due_since END,
               due_reason = CASE WHEN $3 THEN NULL ELSE due_reason END,
               compaction_attempts = CASE WHEN $3 THEN 0 ELSE compaction_attempts END,
               next_attempt_at = CASE WHEN $3 THEN NULL
                                      ELSE now() + make_interval(secs => $4) END,
               dead_since = CASE WHEN $5 THEN now() ELSE dead_since END,
               last_error = $6
         WHERE conversation_id = $1 AND lease_token = $2 AND tenant_id = $8
         RETURNING tenant_id
    )
    INSERT INTO episodic_compaction_attempts (
        conversation_id, attempt_id, tenant_id, worker, reason, outcome, error, started_at,
        finished_at, usage, model, tokens_before, tokens_after, boundary_seq
    )
    SELECT $1, $7, $8, $9, $10,
           CASE WHEN EXISTS (SELECT 1 FROM head) THEN $11 ELSE 'lease_lost' END,
           $6, $12, now(), $13, $14, $15, NULL, NULL
    RETURNING outcome INTO v_outcome;
    RETURN v_outcome;
END
$fn$
"""
