"""Functions that run the same on one PostgreSQL server and sharded over Citus.

- ``episodic_set_local``: a transaction-local setting that reaches every statement of the
  transaction wherever it runs. On plain PostgreSQL it is ``set_config(..., true)``, as
  before; where Citus is loaded it is a ``SET LOCAL`` with ``citus.propagate_set_commands =
  'local'``, which Citus forwards to the nodes (``set_config`` stays on the coordinator, so a
  scoped statement routed to a worker saw no tenant and no rows). ``episodic_set_tenant``
  sets the tenant with it.
- ``episodic_erasing``: the erasure function marks the transaction with the conversation it
  erases (``episodic.erasing``, through ``episodic_set_local``), and the delete triggers ask
  for that mark. On plain PostgreSQL they also ask for the tombstone with the transaction's
  id, as before; on Citus a shard's trigger cannot query the ledger (a query from inside a
  shard's statement), so the mark is the check there.
- ``episodic_claim`` and ``episodic_claim_conversation``: claiming as functions that hold no
  lock across shards. A pick of candidates without locks, then for each a conditional lease
  of its one row (``FOR UPDATE SKIP LOCKED`` on that row, which Citus routes to one shard),
  with the token drawn into a variable and the time of the lease in the function, not in a
  RETURNING or a COALESCE over the table; a pick short of the limit because others leased
  its candidates first is followed by another past them. Still one call from the client.
- ``episodic_end_attempt`` computes its new times before its UPDATE (Citus plans the UPDATE
  for the shard and refuses ``now()`` inside a CASE there), and ``episodic_sweep_due`` passes
  each head to the trigger as the heads' row type (a shard's rows have the shard's type).
- ``episodic_write_boundary`` is three statements, not one statement of data-modifying CTEs:
  Citus plans such a CTE by materialising its parts as intermediate results, which made a
  delegated boundary write take ~27 ms on the cluster; as statements each is routed to the
  conversation's shard (~1.5 ms). Same outcome on both engines.
- ``episodic_erase_tenant``'s EXISTS selects a column (Citus deparses an empty target list
  into SQL its workers refuse).
- On Citus the shared state is a reference table, like the erasure ledger: a delegated call
  reads it where it runs.

(Frozen once it ships: the current definitions are episodic/store/sql/schema.sql.)
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0013_distributable"
down_revision: str | None = "0012_erasure"

NEW_FUNCTIONS = (
    "episodic_claim(text, integer, double precision, text)",
    "episodic_claim_conversation(uuid, text, double precision, text, text)",
    "episodic_set_local(text, text)",
)

SET_LOCAL = """
CREATE FUNCTION episodic_set_local(p_name text, p_value text) RETURNS void
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    IF current_setting('citus.propagate_set_commands', true) IS NULL THEN
        PERFORM set_config(p_name, p_value, true);
    ELSE
        PERFORM set_config('citus.propagate_set_commands', 'local', true);
        EXECUTE format('SET LOCAL %s = %L', p_name, p_value);
    END IF;
END
$fn$;
"""

SET_TENANT = """
CREATE FUNCTION episodic_set_tenant(p_tenant text) RETURNS void
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    IF p_tenant IS NOT NULL THEN
        -- transaction-local: the setting ends with the transaction, so a pooled connection
        -- never carries one request's tenant into the next.
        PERFORM episodic_set_local('episodic.tenant_id', p_tenant);
    END IF;
END
$fn$;
"""

ERASING = """
CREATE FUNCTION episodic_erasing(p_conversation_id uuid) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $fn$
BEGIN
    IF current_setting('episodic.erasing', true) IS DISTINCT FROM p_conversation_id::text THEN
        RETURN false;
    END IF;
    IF current_setting('citus.propagate_set_commands', true) IS NOT NULL THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT FROM episodic_erasures e
                    WHERE e.conversation_id = p_conversation_id
                      AND e.erased_xid = pg_current_xact_id()::text::bigint);
END
$fn$;
"""

CLAIM = """
CREATE FUNCTION episodic_claim(
    p_owner text,
    p_limit integer,
    p_lease_seconds double precision,
    p_scope text DEFAULT NULL::text
) RETURNS TABLE(o_conversation_id uuid, o_tenant_id text, o_lease_token uuid,
                o_lease_expires_at timestamp with time zone, o_compaction_attempts integer,
                o_due_reason text, o_boundary_seq bigint,
                o_claimed_at timestamp with time zone)
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_candidates uuid[];
    v_tried uuid[] := '{}';
    v_last_pick boolean;
    v_id uuid;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    WHILE p_limit > 0 LOOP
        -- Twice what is left to claim, none tried before: a candidate another worker is
        -- leasing is skipped, not waited for, and the next pick looks past it (so workers
        -- claiming at once do not leave each other short).
        SELECT array_agg(n.conversation_id ORDER BY n.next_attempt_at) INTO v_candidates
          FROM (SELECT c.conversation_id, c.next_attempt_at FROM episodic_conversations c
                 WHERE c.due_since IS NOT NULL AND c.dead_since IS NULL
                   AND c.deleted_at IS NULL AND c.next_attempt_at <= now()
                   AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
                   AND (p_scope IS NULL OR c.tenant_id = p_scope)
                   AND NOT c.conversation_id = ANY (v_tried)
                 ORDER BY c.next_attempt_at
                 LIMIT 2 * p_limit) AS n;
        EXIT WHEN v_candidates IS NULL;
        v_tried := v_tried || v_candidates;
        -- a short pick saw every candidate there is: no other pick after this one
        v_last_pick := cardinality(v_candidates) < 2 * p_limit;
        FOREACH v_id IN ARRAY v_candidates LOOP
            EXIT WHEN p_limit <= 0;
            PERFORM FROM episodic_conversations c
              WHERE c.conversation_id = v_id
                AND c.due_since IS NOT NULL AND c.dead_since IS NULL
                AND c.deleted_at IS NULL AND c.next_attempt_at <= now()
                AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
                AND (p_scope IS NULL OR c.tenant_id = p_scope)
                FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            o_lease_token := gen_random_uuid();
            UPDATE episodic_conversations c
               SET lease_owner = p_owner, lease_token = o_lease_token,
                   lease_expires_at = now() + make_interval(secs => p_lease_seconds),
                   compaction_attempts = c.compaction_attempts + 1
             WHERE c.conversation_id = v_id
            RETURNING c.conversation_id, c.tenant_id, c.lease_expires_at,
                      c.compaction_attempts, c.due_reason, c.boundary_seq
                 INTO o_conversation_id, o_tenant_id, o_lease_expires_at,
                      o_compaction_attempts, o_due_reason, o_boundary_seq;
            o_claimed_at := now();
            p_limit := p_limit - 1;
            RETURN NEXT;
        END LOOP;
        EXIT WHEN v_last_pick;
    END LOOP;
END
$fn$;
"""

CLAIM_CONVERSATION = """
CREATE FUNCTION episodic_claim_conversation(
    p_conversation_id uuid,
    p_owner text,
    p_lease_seconds double precision,
    p_reason text,
    p_scope text DEFAULT NULL::text
) RETURNS TABLE(o_conversation_id uuid, o_tenant_id text, o_lease_token uuid,
                o_lease_expires_at timestamp with time zone, o_compaction_attempts integer,
                o_due_reason text, o_boundary_seq bigint,
                o_claimed_at timestamp with time zone)
    LANGUAGE plpgsql
    AS $fn$
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    o_lease_token := gen_random_uuid();
    o_claimed_at := now();
    UPDATE episodic_conversations c
       SET lease_owner = p_owner, lease_token = o_lease_token,
           lease_expires_at = o_claimed_at + make_interval(secs => p_lease_seconds),
           compaction_attempts = c.compaction_attempts + 1,
           due_since = LEAST(c.due_since, o_claimed_at),
           due_reason = p_reason, next_attempt_at = o_claimed_at, dead_since = NULL
     WHERE c.conversation_id = p_conversation_id
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= o_claimed_at)
       AND (p_scope IS NULL OR c.tenant_id = p_scope) AND c.deleted_at IS NULL
    RETURNING c.conversation_id, c.tenant_id, c.lease_expires_at, c.compaction_attempts,
              c.due_reason, c.boundary_seq
         INTO o_conversation_id, o_tenant_id, o_lease_expires_at, o_compaction_attempts,
              o_due_reason, o_boundary_seq;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
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
    v_next_attempt_at timestamp with time zone;
    v_dead_since timestamp with time zone;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
    PERFORM FROM episodic_conversations c
      WHERE c.conversation_id = p_conversation_id AND c.tenant_id = p_attempt ->> 'tenant_id'
        FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN 'gone';
    END IF;
    -- The new times as values, not now() in a CASE: Citus plans the UPDATE for its shard and
    -- refuses a non-immutable function there.
    v_next_attempt_at := CASE WHEN p_clear_due THEN NULL
                              ELSE now() + make_interval(secs => p_retry_in_seconds) END;
    v_dead_since := CASE WHEN p_dead THEN now() END;
    UPDATE episodic_conversations
       SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
           due_since = CASE WHEN p_clear_due THEN NULL ELSE due_since END,
           due_reason = CASE WHEN p_clear_due THEN NULL ELSE due_reason END,
           compaction_attempts = CASE WHEN p_clear_due THEN 0 ELSE compaction_attempts END,
           next_attempt_at = v_next_attempt_at,
           dead_since = COALESCE(v_dead_since, dead_since),
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
    v_tenant text;
BEGIN
    PERFORM episodic_set_tenant(p_scope);
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
    RETURNING tenant_id INTO v_tenant;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                 token_estimate, payload)
    VALUES (p_conversation_id, p_seq, v_tenant, 'boundary', p_created_at, p_token_estimate,
            p_payload);
    IF p_attempt IS NOT NULL THEN
        INSERT INTO episodic_compaction_attempts
        SELECT (jsonb_populate_record(
                    NULL::episodic_compaction_attempts,
                    p_attempt || jsonb_build_object('tenant_id', v_tenant,
                                                    'boundary_seq', p_seq))).*;
    END IF;
    RETURN 1;
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
           -- the row as the heads' type: on Citus the scan runs on each shard, whose rows
           -- are of the shard's own type
           AND episodic_trigger_reason(ROW(c.*)::episodic_conversations, p_trigger, now())
               IS NOT NULL
    LOOP
        IF episodic_mark_due(v_head, p_trigger) THEN
            RETURN NEXT v_head.conversation_id;
        END IF;
    END LOOP;
END
$fn$;
"""


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replacing(definition: str) -> str:
    return definition.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _erase_conversation() -> str:
    """0012's erasure, marking its transaction before it deletes."""
    earlier: str = _load_revision("0012_erasure.py").ERASE_CONVERSATION
    deleting = "    DELETE FROM episodic_events e WHERE e.conversation_id = p_conversation_id;\n"
    assert deleting in earlier
    marked = earlier.replace(
        deleting,
        "    PERFORM episodic_set_local('episodic.erasing', p_conversation_id::text);\n" + deleting,
    )
    return _replacing(marked)


ERASE_CONVERSATION = _erase_conversation()


def _erase_tenant() -> str:
    """0012's tenant erasure, its EXISTS selecting a column: Citus deparses the empty target
    list of a multi-shard ``EXISTS (SELECT FROM ...)`` into SQL its workers refuse ("a column
    definition list is required")."""
    earlier: str = _load_revision("0012_erasure.py").ERASE_TENANT
    empty = "EXISTS (SELECT FROM episodic_conversations c"
    assert earlier.count(empty) == 2
    return _replacing(earlier.replace(empty, "EXISTS (SELECT 1 FROM episodic_conversations c"))


ERASE_TENANT = _erase_tenant()


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(SET_LOCAL)
    for definition in (SET_TENANT, ERASING):
        op.execute(_replacing(definition))
    op.execute(ERASE_CONVERSATION)
    op.execute(ERASE_TENANT)
    for definition in (END_ATTEMPT, SWEEP_DUE, WRITE_BOUNDARY):
        op.execute(_replacing(definition))
    op.execute(CLAIM)
    op.execute(CLAIM_CONVERSATION)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    earlier = _load_revision("0012_erasure.py")
    op.execute(_replacing(earlier.ERASE_CONVERSATION))
    op.execute(_replacing(earlier.ERASE_TENANT))
    op.execute(_replacing(earlier.END_ATTEMPT))
    op.execute(_replacing(_load_revision("0011_state_listings_deletion.py").SWEEP_DUE))
    op.execute(_replacing(_load_revision("0006_named_parameters.py").WRITE_BOUNDARY))
    op.execute(_replacing(earlier.ERASING))
    op.execute(_replacing(_load_revision("0006_named_parameters.py").SET_TENANT))
    for signature in NEW_FUNCTIONS:
        op.execute(f"DROP FUNCTION {signature}")
