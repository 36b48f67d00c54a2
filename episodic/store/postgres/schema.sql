-- episodic's PostgreSQL schema, as it is now: every table, index, trigger, policy, grant and
-- function, in the order a reader needs them.
--
-- This file is what you read; the migrations in migrations/versions/ are frozen history. A
-- migration that changes a function carries its own frozen copy of the new body, and
-- tests/contract/test_schema.py migrates an empty database to head, builds another from this
-- file, and compares their catalogs (function definitions, columns, indexes, constraints,
-- triggers, policies, row-level security and grants): any drift fails with a diff.
--
-- The request path is one function call each: episodic_append, episodic_mark_run_completed
-- and episodic_load_tail. Each takes named parameters (p_...) and an optional p_scope, the
-- tenant a scoped store acts for, which the function sets for row-level security inside the
-- caller's own statement, so scoping never adds a round trip.
--
-- SQLite has the same tables (episodic/store/schema.py) and no functions: its backend runs
-- the Python twins of these rules (episodic/store/rules.py, due.py, attempts.py,
-- projection.py), each naming in its docstring the function it mirrors (so a grep for the
-- function's name finds both sides), and tests/contract/test_twins.py drives both with the
-- same generated appends and heads.


-- ==== Roles =================================================================================
-- Roles belong to the cluster, not the database: another database's migration (or the DBA)
-- may have made them already. None is a superuser or bypasses row-level security.
--   episodic_app          the request path: reads and appends within the transaction's tenant,
--                         never an UPDATE or DELETE of history
--   episodic_worker       the compaction worker: every head (to claim across tenants), the
--                         counter and lease columns, events only as the claimed tenant
--   episodic_all_tenants  every row of every tenant: operators and single-tenant apps
--   episodic_eraser       the erasure path alone: reads and removes a conversation's (or a
--                         tenant's) rows, leaving a tombstone; writes nothing else

DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['episodic_app', 'episodic_worker', 'episodic_all_tenants',
                                  'episodic_eraser'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB '
                           'NOCREATEROLE', v_role);
        END IF;
    END LOOP;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'episodic needs the roles episodic_app, episodic_worker, '
                    'episodic_all_tenants and episodic_eraser, and % may not create roles',
                    current_user
        USING HINT = 'ask a superuser to run: CREATE ROLE episodic_app NOLOGIN; CREATE ROLE '
                     'episodic_worker NOLOGIN; CREATE ROLE episodic_all_tenants NOLOGIN; '
                     'CREATE ROLE episodic_eraser NOLOGIN; then run episodic migrate again';
END $$;


-- ==== Tables ================================================================================
-- Every primary and unique key starts with conversation_id, so the log can be partitioned or
-- distributed (Citus) by conversation.

-- Alembic's: the schema's revision, which EpisodicStore.open() reads.
CREATE TABLE episodic_alembic_version (
    version_num character varying(32) NOT NULL,
    CONSTRAINT episodic_alembic_version_pkc PRIMARY KEY (version_num)
);

-- The head: one row per conversation, the only mutable table. Its counters are a projection
-- of the log (episodic/store/projection.py folds the log into the same values; a test proves
-- the stored head equals the fold): they keep append, load_context and pressure O(1) in the
-- length of the history.
CREATE TABLE episodic_conversations (
    conversation_id uuid NOT NULL,
    tenant_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    metadata jsonb NOT NULL,
    last_seq bigint DEFAULT 0 NOT NULL,
    boundary_seq bigint,
    covers_through_seq bigint DEFAULT 0 NOT NULL,
    total_user_messages bigint DEFAULT 0 NOT NULL,
    user_messages_since_boundary bigint DEFAULT 0 NOT NULL,
    run_completed_since_boundary bigint DEFAULT 0 NOT NULL,
    user_messages_since_run_completed bigint DEFAULT 0 NOT NULL,
    context_tokens bigint DEFAULT 0 NOT NULL,
    usage_input_tokens bigint,
    tokens_since_usage bigint DEFAULT 0 NOT NULL,
    -- {tool_call_id: seq of the assistant message that made the call}, for calls still
    -- waiting for their result. The smallest seq bounds the safe cut.
    open_tool_calls jsonb NOT NULL,
    -- The compaction state: due since when and why, the worker's lease, failures so far.
    due_since timestamp with time zone,
    due_reason text,
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    compaction_attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone,
    last_error text,
    dead_since timestamp with time zone,
    -- When the latest boundary was written: the age rule measures the current context's age,
    -- so an old conversation just compacted is not due again at once. (Last: a later column.)
    boundary_at timestamp with time zone,
    -- Who the conversation is listed under (an app and a user of it), given at creation.
    app_name text,
    user_id text,
    -- The caller's time of its latest write, in seconds since the epoch (an agent framework's
    -- event timestamp, kept exact as the double it was): what a listing shows as updated.
    touched_at double precision,
    -- The conversation's own state: a projection of its state events (NULL: none yet).
    state jsonb,
    -- When it was deleted: hidden from listings and loads, closed to writes, its log kept.
    deleted_at timestamp with time zone,
    CONSTRAINT pk_episodic_conversations PRIMARY KEY (conversation_id)
)
-- Every append updates its head: room on the page keeps the update HOT (no index entry,
-- pruned in place) when many conversations share a page.
WITH (fillfactor = 70);

-- The worker's queue: conversations due for compaction, by when they may next be tried.
CREATE INDEX ix_episodic_conversations_due ON episodic_conversations
    USING btree (next_attempt_at) WHERE ((due_since IS NOT NULL) AND (dead_since IS NULL));
-- A tenant's conversations, newest first (list_conversations).
CREATE INDEX ix_episodic_conversations_tenant_created ON episodic_conversations
    USING btree (tenant_id, created_at, conversation_id);
-- An app's conversations, by user (list_by_user). Not by touched_at: every write moves it,
-- and an index on it would make every head update a non-HOT one.
CREATE INDEX ix_episodic_conversations_listed ON episodic_conversations
    USING btree (tenant_id, app_name, user_id, conversation_id)
    WHERE ((app_name IS NOT NULL) AND (deleted_at IS NULL));

-- The log: one row per event, never updated or deleted. seq is gapless from 1 in each
-- conversation; the head's row lock serializes appends. No foreign key to the head: every
-- insert already holds the head's lock, and a per-row check would cost a lookup per event.
CREATE TABLE episodic_events (
    conversation_id uuid NOT NULL,
    seq bigint NOT NULL,
    tenant_id text NOT NULL,
    kind text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    -- what the event adds to the context's estimate, computed once at append
    token_estimate integer NOT NULL,
    -- the event's JSON, as text: decoding it in Python is cheaper than jsonb's output
    payload text NOT NULL,
    client_id text,
    -- on a batch's first event: the provider usage passed with it, the idempotency key and
    -- hash that make a retry return the first result, and the batch's size
    usage text,
    idempotency_key text,
    request_hash text,
    batch_size integer,
    CONSTRAINT ck_episodic_events_kind
        CHECK ((kind = ANY (ARRAY['message'::text, 'boundary'::text, 'run_completed'::text,
                               'retraction'::text, 'clear'::text, 'usage'::text,
                               'state'::text, 'deletion'::text, 'unpin'::text]))),
    CONSTRAINT ck_episodic_events_seq_positive CHECK ((seq > 0)),
    CONSTRAINT pk_episodic_events PRIMARY KEY (conversation_id, seq)
);

-- Partial: almost no event has an idempotency key or a client id, and a full index would pay
-- a NULL entry on every append (and could be chosen over the primary key for a tail's range).
CREATE UNIQUE INDEX uq_episodic_events_conversation_id_client_id ON episodic_events
    USING btree (conversation_id, client_id) WHERE (client_id IS NOT NULL);
CREATE UNIQUE INDEX uq_episodic_events_conversation_id_idempotency_key ON episodic_events
    USING btree (conversation_id, idempotency_key) WHERE (idempotency_key IS NOT NULL);

-- State shared by a tenant's conversations, by scope (Google ADK's app and user state): like
-- the head, a mutable projection of the log (the state events that changed it, in order).
-- Keyed by tenant, not conversation: every conversation of the scope reads the same row.
CREATE TABLE episodic_shared_state (
    tenant_id text NOT NULL,
    scope text NOT NULL,
    state jsonb NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT pk_episodic_shared_state PRIMARY KEY (tenant_id, scope)
);

-- The ledger of compaction attempts: every attempt, whatever its outcome, append-only.
CREATE TABLE episodic_compaction_attempts (
    conversation_id uuid NOT NULL,
    attempt_id uuid NOT NULL,
    tenant_id text NOT NULL,
    worker text NOT NULL,
    reason text NOT NULL,
    outcome text NOT NULL,
    error text,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    usage jsonb,
    model text,
    tokens_before bigint,
    tokens_after bigint,
    boundary_seq bigint,
    CONSTRAINT pk_episodic_compaction_attempts PRIMARY KEY (conversation_id, attempt_id)
);

-- API keys of the HTTP server (`episodic keys`): a tenant each, operator or not, the secret
-- kept only as its SHA-256; revoking stamps revoked_at. Not a tenant table: the server reads
-- it before it knows the tenant.
CREATE TABLE episodic_api_keys (
    key_id text NOT NULL,
    tenant_id text NOT NULL,
    secret_sha256 text NOT NULL,
    operator boolean NOT NULL,
    label text,
    created_at timestamp with time zone NOT NULL,
    revoked_at timestamp with time zone,
    CONSTRAINT pk_episodic_api_keys PRIMARY KEY (key_id)
);

-- The erasure ledger: one tombstone per erased conversation (and one per erased tenant, for
-- its shared state), append-only. What was removed and why, never what it said: counts, no
-- content. erased_xid is the erasing transaction's id: the delete triggers below let only the
-- transaction that wrote a conversation's tombstone remove its rows.
CREATE TABLE episodic_erasures (
    erasure_id uuid NOT NULL,
    tenant_id text NOT NULL,
    -- NULL for a tenant's tombstone (erase_tenant: its shared state and its totals)
    conversation_id uuid,
    conversation_created_at timestamp with time zone,
    reason text NOT NULL,
    conversations bigint NOT NULL,
    events bigint NOT NULL,
    compaction_attempts bigint NOT NULL,
    shared_states bigint NOT NULL,
    erased_at timestamp with time zone NOT NULL,
    erased_by text NOT NULL,
    erased_xid bigint,
    CONSTRAINT pk_episodic_erasures PRIMARY KEY (tenant_id, erasure_id)
);

-- A conversation's tombstones (an erased id is not re-created by accident), a tenant's.
CREATE INDEX ix_episodic_erasures_conversation_id ON episodic_erasures
    USING btree (conversation_id);
CREATE INDEX ix_episodic_erasures_tenant_id_erased_at ON episodic_erasures
    USING btree (tenant_id, erased_at);


-- ==== History is never rewritten ============================================================
-- Triggers that raise, not rules that swallow: a DELETE that silently did nothing would look
-- like it worked. TRUNCATE fires no row triggers, so it has its own statement-level one. The
-- table owner is refused too; only superusers and session_replication_role=replica skip
-- triggers, which is why no runtime role is a superuser.

CREATE FUNCTION episodic_refuse_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'feature_not_supported',
              HINT = 'the log is never rewritten; append a new event instead';
END
$$;

-- Whether this transaction is erasing the conversation: the erasure function marked it so
-- (episodic.erasing) and, on one server, wrote its tombstone with this transaction's id. A
-- shard's trigger on Citus cannot query the ledger (a query from inside a shard's statement),
-- so there the mark, which only the erasure function sets, is the check.
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

-- DELETE on the log and the attempts ledger: refused, as any change, unless the erasure path
-- is removing the conversation (its tombstone written first, in this transaction).
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

-- A head may change, but never go (deleting it would orphan its events), except with the
-- rest of its conversation, by the erasure path.
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

CREATE TRIGGER episodic_events_append_only
    BEFORE UPDATE ON episodic_events
    FOR EACH ROW EXECUTE FUNCTION episodic_refuse_change();
CREATE TRIGGER episodic_events_erasure_only
    BEFORE DELETE ON episodic_events
    FOR EACH ROW EXECUTE FUNCTION episodic_refuse_unrecorded_delete();
CREATE TRIGGER episodic_events_no_truncate
    BEFORE TRUNCATE ON episodic_events
    FOR EACH STATEMENT EXECUTE FUNCTION episodic_refuse_change();
CREATE TRIGGER episodic_compaction_attempts_append_only
    BEFORE UPDATE ON episodic_compaction_attempts
    FOR EACH ROW EXECUTE FUNCTION episodic_refuse_change();
CREATE TRIGGER episodic_compaction_attempts_erasure_only
    BEFORE DELETE ON episodic_compaction_attempts
    FOR EACH ROW EXECUTE FUNCTION episodic_refuse_unrecorded_delete();
CREATE TRIGGER episodic_compaction_attempts_no_truncate
    BEFORE TRUNCATE ON episodic_compaction_attempts
    FOR EACH STATEMENT EXECUTE FUNCTION episodic_refuse_change();
CREATE TRIGGER episodic_conversations_no_delete
    BEFORE DELETE ON episodic_conversations
    FOR EACH ROW EXECUTE FUNCTION episodic_refuse_head_removal();
CREATE TRIGGER episodic_conversations_no_truncate
    BEFORE TRUNCATE ON episodic_conversations
    FOR EACH STATEMENT EXECUTE FUNCTION episodic_refuse_head_removal();
-- The ledger itself: no tombstone is ever changed or removed.
CREATE TRIGGER episodic_erasures_append_only
    BEFORE DELETE OR UPDATE ON episodic_erasures
    FOR EACH ROW EXECUTE FUNCTION episodic_refuse_change();
CREATE TRIGGER episodic_erasures_no_truncate
    BEFORE TRUNCATE ON episodic_erasures
    FOR EACH STATEMENT EXECUTE FUNCTION episodic_refuse_change();


-- ==== Tenants ===============================================================================
-- A row is visible and writable only while the transaction's episodic.tenant_id names its
-- tenant; unset means no rows. FORCE holds the tables' owner to it too (an owner otherwise
-- bypasses row-level security).

ALTER TABLE episodic_conversations ENABLE ROW LEVEL SECURITY;
ALTER TABLE episodic_conversations FORCE ROW LEVEL SECURITY;
ALTER TABLE episodic_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE episodic_events FORCE ROW LEVEL SECURITY;
ALTER TABLE episodic_compaction_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE episodic_compaction_attempts FORCE ROW LEVEL SECURITY;
ALTER TABLE episodic_shared_state ENABLE ROW LEVEL SECURITY;
ALTER TABLE episodic_shared_state FORCE ROW LEVEL SECURITY;
ALTER TABLE episodic_erasures ENABLE ROW LEVEL SECURITY;
ALTER TABLE episodic_erasures FORCE ROW LEVEL SECURITY;

CREATE POLICY episodic_tenant_rows ON episodic_conversations
    USING ((tenant_id = current_setting('episodic.tenant_id'::text, true)))
    WITH CHECK ((tenant_id = current_setting('episodic.tenant_id'::text, true)));
CREATE POLICY episodic_tenant_rows ON episodic_events
    USING ((tenant_id = current_setting('episodic.tenant_id'::text, true)))
    WITH CHECK ((tenant_id = current_setting('episodic.tenant_id'::text, true)));
CREATE POLICY episodic_tenant_rows ON episodic_compaction_attempts
    USING ((tenant_id = current_setting('episodic.tenant_id'::text, true)))
    WITH CHECK ((tenant_id = current_setting('episodic.tenant_id'::text, true)));
CREATE POLICY episodic_tenant_rows ON episodic_shared_state
    USING ((tenant_id = current_setting('episodic.tenant_id'::text, true)))
    WITH CHECK ((tenant_id = current_setting('episodic.tenant_id'::text, true)));
CREATE POLICY episodic_tenant_rows ON episodic_erasures
    USING ((tenant_id = current_setting('episodic.tenant_id'::text, true)))
    WITH CHECK ((tenant_id = current_setting('episodic.tenant_id'::text, true)));
CREATE POLICY episodic_all_tenants_rows ON episodic_conversations
    TO episodic_all_tenants
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_all_tenants_rows ON episodic_events
    TO episodic_all_tenants
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_all_tenants_rows ON episodic_compaction_attempts
    TO episodic_all_tenants
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_all_tenants_rows ON episodic_shared_state
    TO episodic_all_tenants
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_all_tenants_rows ON episodic_erasures
    TO episodic_all_tenants
    USING (true)
    WITH CHECK (true);
-- The eraser sees every tenant's rows (to erase a conversation by its id alone); its grants
-- below limit what it may do with them to reading, removing, and writing tombstones.
CREATE POLICY episodic_eraser_rows ON episodic_conversations
    TO episodic_eraser
    USING (true)
    WITH CHECK (true);
-- It may lock a head (a row lock needs the UPDATE privilege: it has one column's) but never
-- change one, whatever other policy would let it: a restrictive check no row passes.
CREATE POLICY episodic_eraser_locks_only ON episodic_conversations
    AS RESTRICTIVE
    FOR UPDATE
    TO episodic_eraser
    USING (true)
    WITH CHECK (false);
CREATE POLICY episodic_eraser_rows ON episodic_events
    TO episodic_eraser
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_eraser_rows ON episodic_compaction_attempts
    TO episodic_eraser
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_eraser_rows ON episodic_shared_state
    TO episodic_eraser
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_eraser_rows ON episodic_erasures
    TO episodic_eraser
    USING (true)
    WITH CHECK (true);
-- The worker's queue: every head (to claim), every attempt (for `episodic status`).
CREATE POLICY episodic_worker_queue ON episodic_conversations
    FOR SELECT
    TO episodic_worker
    USING (true);
CREATE POLICY episodic_worker_leases ON episodic_conversations
    FOR UPDATE
    TO episodic_worker
    USING (true)
    WITH CHECK (true);
CREATE POLICY episodic_worker_ledger ON episodic_compaction_attempts
    FOR SELECT
    TO episodic_worker
    USING (true);

-- No UPDATE of events or attempts for anyone, and no DELETE but the eraser's: 42501 before
-- any trigger runs. The
-- worker may UPDATE only the head's counter, state and lease columns, never its tenant or
-- metadata.
GRANT SELECT ON episodic_alembic_version
    TO episodic_app, episodic_worker, episodic_all_tenants, episodic_eraser;
GRANT SELECT, INSERT, UPDATE ON episodic_conversations TO episodic_app;
GRANT SELECT, INSERT ON episodic_events TO episodic_app;
GRANT SELECT ON episodic_compaction_attempts TO episodic_app;
GRANT SELECT ON episodic_conversations TO episodic_worker;
GRANT UPDATE (
    last_seq, boundary_seq, covers_through_seq, open_tool_calls, total_user_messages,
    user_messages_since_boundary, run_completed_since_boundary,
    user_messages_since_run_completed, context_tokens, usage_input_tokens, tokens_since_usage,
    due_since, due_reason, next_attempt_at, compaction_attempts, last_error, dead_since,
    lease_owner, lease_token, lease_expires_at, boundary_at, touched_at, state, deleted_at
) ON episodic_conversations TO episodic_worker;
GRANT SELECT, INSERT ON episodic_events TO episodic_worker;
GRANT SELECT, INSERT ON episodic_compaction_attempts TO episodic_worker;
GRANT SELECT, INSERT, UPDATE ON episodic_shared_state TO episodic_app, episodic_all_tenants;
GRANT SELECT, INSERT, UPDATE ON episodic_conversations TO episodic_all_tenants;
GRANT SELECT, INSERT ON episodic_events, episodic_compaction_attempts TO episodic_all_tenants;
-- The ledger: read by every role (an erased id is not re-created by accident, and the worker
-- and the app can tell an erased conversation from one that never was), written by the
-- eraser alone. The eraser locks a head (the one UPDATE privilege it has) before it erases.
GRANT SELECT ON episodic_erasures
    TO episodic_app, episodic_worker, episodic_all_tenants, episodic_eraser;
GRANT INSERT ON episodic_erasures TO episodic_eraser;
GRANT SELECT ON episodic_api_keys TO episodic_app, episodic_all_tenants;
GRANT SELECT, DELETE ON episodic_conversations, episodic_events, episodic_compaction_attempts,
    episodic_shared_state TO episodic_eraser;
GRANT UPDATE (deleted_at) ON episodic_conversations TO episodic_eraser;

-- No function is SECURITY DEFINER: each runs with its caller's rights, so the policies above
-- still decide. Each function that takes p_scope sets the tenant itself and also checks the
-- conversation belongs to it, so a scoped store connected as a superuser or an
-- episodic_all_tenants member (whom the policies do not restrict) still sees only its tenant.

-- The tenant a scoped caller acts for; NULL (an unscoped caller, whose role decides what it
-- sees) leaves the transaction as it is.
-- A transaction-local setting that reaches every statement of the transaction, wherever it
-- runs: on Citus a SET LOCAL that Citus forwards to the nodes (set_config stays on the node
-- that ran it, so a statement routed to a worker would see no tenant, and no rows).
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

-- The head, locked, for a write (all NULL when the conversation is not there, not the
-- scope's, or deleted). The row lock serializes writes to one conversation: seqs are gapless and a batch
-- never interleaves with another. In READ COMMITTED each later statement of the caller takes
-- a fresh snapshot, so once the lock is held it sees everything the previous holder committed.
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


-- ==== When a conversation is due ============================================================
-- The trigger is evaluated on the head row in the statement that changed it, so finding work
-- never scans the log. episodic_trigger_reason is the twin of episodic.store.due.due_reason
-- (pressure_from, trigger_config_for and episodic.policy.episodic_compaction_trigger): the
-- thresholds travel as one jsonb, EpisodicCompactionConfig's JSON, so a new rule changes
-- policy.py, this function and their twin test (tests/contract/test_due.py), nothing else.
-- (One plpgsql function over the head row, not SQL functions over JSON documents: on every
-- append that is ~1.5 us of server time instead of ~8.)

-- The caller's thresholds, with the conversation's own in metadata.compaction on top (a null
-- there means "no override"). The pressure: the estimate is the larger of the stored one and
-- the latest provider-reported input tokens plus what was appended after them (GREATEST
-- ignores a NULL usage); the age is that of the current context, in whole days, never
-- negative. The rules: first match wins, every comparison >=.
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
$fn$;

-- Marks the conversation due when the trigger fires on its head (as just updated and locked
-- by the caller, passed in so nothing re-reads it) and wakes idle workers; the NOTIFY is sent
-- only if the transaction commits. A conversation already due or dead is left alone. Returns
-- whether it marked the conversation.
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

-- The periodic sweep: the same trigger, evaluated now, over conversations with something to
-- compact that nobody writes to (the age rule fires with time alone). Returns the
-- conversations it marked due. Twins: episodic.store.due.sweep_due_candidate (the scan's
-- WHERE, less the trigger) and due_marking; Backend.sweep_due.
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


-- ==== The request path ======================================================================

-- A state change's shared part ({scope: {key: value}}) applied to the tenant's scopes: each
-- key replaces the stored value (|| is a shallow merge). Rows are locked in scope order, so
-- two writers that share scopes cannot deadlock on each other.
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

-- A new conversation's head (and, with p_state, its first event): 'created', or 'taken' when
-- the id is held, or EP410 when the tenant erased it and p_reuse_erased is false. Twin of the
-- outcome: episodic.store.rules.create_conversation_outcome.
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

-- The open tool calls after a batch: the results' calls closed, the calls it left open
-- added with the seq of the message that made them (p_last_seq: the seq before the batch).
-- A function, not a subquery of the head's UPDATE: a subquery's plan is set up on every
-- execution of the statement, even by the appends that carry no tool call (most).
CREATE FUNCTION episodic_open_calls_after(
    p_open jsonb,
    p_closed_ids text[],
    p_opened_ids text[],
    p_opened_offsets integer[],
    p_last_seq bigint
) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $fn$
    SELECT (p_open - COALESCE(p_closed_ids, '{}')) || COALESCE(
        (SELECT jsonb_object_agg(o.id, p_last_seq + o.off + 1)
           FROM unnest(p_opened_ids, p_opened_offsets) AS o(id, off)),
        '{}'::jsonb)
$fn$;

-- The whole append in one statement, so the request path is one round trip. Python has
-- already validated and encoded the batch (episodic/store/batch.py); this checks what needs
-- the conversation's state under the head's row lock, in the order the Python twin does
-- (episodic/store/rules.py: replay, conflict, client id, duplicate call, orphan result),
-- inserts, and advances the head exactly as HeadCounters.after_message does. A refusal is an
-- outcome row, not an exception, and nothing is written before it. p_client_ids,
-- p_called_ids, p_opened_ids, p_opened_offsets and p_closed_ids are NULL when they would be
-- empty (or all NULL): no array is built, sent or tested for them then.
--
-- Most appends carry no idempotency key, client id, tool call or result: then the only check
-- is the expected seq, and the head is locked, checked and advanced by its UPDATE alone (one
-- statement where the others take a locking read first). A one-message batch is inserted
-- as one row of VALUES, without unnesting arrays. Each statement of a PL/pgSQL function
-- costs its executor's start-up on every call: these two save a third of the function's
-- server time (bench/PROFILE.md).
--
-- p_state, a StateChange's JSON, is one more event after the messages (kind 'state'),
-- applied to the head's state and the tenant's shared scopes in the same statement;
-- p_touched_at is the caller's time of the write (the head's touched_at). A deleted
-- conversation refuses every append ('deleted').
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

-- One append of a coalesced call: episodic_append's arguments, less the trigger and the
-- scope, which a call shares.
CREATE TYPE episodic_append_request AS (
    conversation_id uuid,
    expected_seq bigint,
    idempotency_key text,
    request_hash text,
    payloads text[],
    token_estimates integer[],
    client_ids text[],
    usage text,
    usage_input_tokens bigint,
    user_messages integer,
    token_sum bigint,
    called_ids text[],
    opened_ids text[],
    opened_offsets integer[],
    closed_ids text[]
);

-- Appends that a process had in flight at once, in one call and one transaction (see
-- episodic/store/coalesce.py): each is episodic_append's, with its own outcome row
-- (o_index: its place in p_requests, from 1), so a refusal refuses that append alone. The
-- heads are locked in conversation id order, whatever order the requests came in, so two such
-- calls cannot deadlock on each other; appends to one conversation keep their order. An
-- error (not a refusal) rolls the whole call back, and the client sends each append alone.
CREATE FUNCTION episodic_append_many(
    p_requests episodic_append_request[],
    p_trigger jsonb,
    p_scope text DEFAULT NULL::text
) RETURNS TABLE(o_index integer, o_outcome text, o_seq bigint,
                o_created_at timestamp with time zone, o_detail text)
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_request record;
BEGIN
    FOR v_request IN
        SELECT r.* FROM unnest(p_requests) WITH ORDINALITY AS r
         ORDER BY r.conversation_id, r.ordinality
    LOOP
        RETURN QUERY SELECT v_request.ordinality::integer, a.* FROM episodic_append(
            p_conversation_id => v_request.conversation_id,
            p_expected_seq => v_request.expected_seq,
            p_idempotency_key => v_request.idempotency_key,
            p_request_hash => v_request.request_hash,
            p_payloads => v_request.payloads,
            p_token_estimates => v_request.token_estimates,
            p_client_ids => v_request.client_ids,
            p_usage => v_request.usage,
            p_usage_input_tokens => v_request.usage_input_tokens,
            p_user_messages => v_request.user_messages,
            p_token_sum => v_request.token_sum,
            p_called_ids => v_request.called_ids,
            p_opened_ids => v_request.opened_ids,
            p_opened_offsets => v_request.opened_offsets,
            p_closed_ids => v_request.closed_ids,
            p_trigger => p_trigger,
            p_scope => p_scope
        ) AS a;
    END LOOP;
END
$fn$;

-- Closes the run: every call still open is recorded as abandoned (ordered by the seq that
-- opened it, then by id in byte order, as HeadCounters.abandoned_ids does).
CREATE FUNCTION episodic_mark_run_completed(
    p_conversation_id uuid,
    p_tokens_per_abandoned integer,
    p_trigger jsonb,
    p_scope text DEFAULT NULL::text
) RETURNS TABLE(o_outcome text, o_seq bigint, o_created_at timestamp with time zone, o_detail text)
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_head episodic_conversations := episodic_lock_head(p_conversation_id, p_scope);
    v_tenant text := v_head.tenant_id;
    v_last bigint := v_head.last_seq;
    v_ids jsonb;
    v_count integer;
    v_tokens bigint;
BEGIN
    IF v_head.conversation_id IS NULL THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
    SELECT COALESCE(jsonb_agg(j.key ORDER BY j.value::bigint, j.key COLLATE "C"), '[]'::jsonb),
           count(*)
      INTO v_ids, v_count
      FROM jsonb_each_text(v_head.open_tool_calls) AS j;
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
    PERFORM episodic_mark_due(v_head, p_trigger);
    RETURN QUERY SELECT 'appended'::text, v_last + 1, now(), v_ids::text;
END
$fn$;

-- A retraction, a clear, a usage report or a deletion (episodic/store/planned_events.py),
-- planned in Python from the head and the events after its cut, written only if the head is
-- still at p_planned_last_seq (and not deleted): the event and the head's counters as planned,
-- then the trigger asked on the new head, as after an append. Returns the number of events
-- written, 0 or 1; on 0 the client plans again. (p_context_since: when the current context
-- began, for a clear; NULL leaves it.) Twin of what it sets besides the counters:
-- episodic.store.planned_events.write_event_columns.
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

-- What load_context reads: the head's position and every event after its latest cut (or
-- after p_after_seq, for the boundary writer). One call, and its cost is the rows returned.
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

-- A conversation's head: the store's get_conversation (Backend.head), and what the boundary
-- writer plans on.
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
$fn$;

-- The state a conversation reads, in one statement: its own (with where its log ends, so a
-- caller can tell it from a tail read at another seq) and the tenant's shared scopes named
-- in p_shared, one row each (a scope never written has no row). With p_conversation_id NULL,
-- the scopes of p_tenant_id alone. No row for the conversation when it is not there, not the
-- scope's, or deleted.
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

-- An app's conversations that are not deleted, one user's or (p_user_id NULL) every user's,
-- in (user_id, conversation_id) order from just after (p_after_user, p_after_id): one page
-- of the ix_episodic_conversations_listed range.
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


-- ==== The compaction worker =================================================================
-- Claiming holds no lock across conversations, so it is the same on one server and on Citus
-- (which refuses FOR UPDATE across shards): candidates picked without locks, then each leased
-- on its own row, skipped if another worker holds that row, re-checked once locked. The
-- token is drawn into a variable and the lease's time is the function's, never a volatile
-- call or a now() in an UPDATE's RETURNING. One call from the client either way.
-- Twins: episodic.store.attempts.claimable (the predicate, written twice below, in the pick
-- and in the re-check; tests/contract/test_twins.py holds the two copies to the same text)
-- and claim_columns (the SET).
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

-- One conversation, due or not, claimed by hand (`episodic compact ID`). Twins:
-- episodic.store.attempts.claimable_by_hand (the WHERE) and claim_conversation_columns.
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

-- A boundary is written optimistically: the worker reads the head and the tail, plans in
-- Python without holding a lock, then writes in this one statement, which applies only if the
-- head is still the one it planned on (same last seq, same boundary, lease still held).
-- Returns the number of boundaries written, 0 or 1; on 0 the worker plans again.
-- p_attempt, when given, is the worker's attempt (an episodic_compaction_attempts row as
-- JSON, less its tenant and boundary), recorded in the same transaction.
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

-- Ends an attempt that wrote no boundary, fenced by the lease token, and records it (p_attempt:
-- the episodic_compaction_attempts row as JSON, less its finish). A worker whose lease was
-- taken over changes nothing but the ledger: the attempt is recorded as 'lease_lost'. A
-- conversation erased meanwhile gets no attempt row ('gone'): the key-share lock waits for an
-- erasure in flight, so no row is ever left behind one. Twins:
-- episodic.store.attempts.end_attempt_columns (the SET) and end_attempt_outcome.
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


-- ==== Erasure ===============================================================================
-- The one path that removes history: the head locked (appends and the worker wait on it, then
-- find nothing), the tombstone written, then every row of the conversation deleted, in one
-- transaction. Run by episodic_eraser (or the tables' owner); any other role is refused at
-- the tombstone's INSERT with 42501. Erasing what is already erased returns its latest
-- tombstone and changes nothing; an id never seen returns no row.
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
    PERFORM episodic_set_local('episodic.erasing', p_conversation_id::text);
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

-- A tenant's erasure ends here, once each of its conversations is erased (one transaction
-- each, by the function above): its shared state goes, and the tenant's tombstone records the
-- totals. A tenant with nothing left and a tombstone already returns that one.
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
    IF EXISTS (SELECT 1 FROM episodic_conversations c WHERE c.tenant_id = p_tenant_id) THEN
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
    IF EXISTS (SELECT 1 FROM episodic_conversations c WHERE c.tenant_id = p_tenant_id) THEN
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
