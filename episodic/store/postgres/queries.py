"""Every statement the PostgreSQL backend sends, and the file that defines what they call.

``schema.sql`` beside this module is the current definition of every table, index, trigger,
policy, grant and function, readable top to bottom. The migrations are frozen history; a test
compares a database migrated to head with one built from that file. The constants below call
its functions by parameter name (:func:`named_call`), or are the few plain statements of the
cold paths (listing, paging, imports, the operator's status)."""

from __future__ import annotations

from importlib.resources import files

from episodic.search import MIN_PREFIX_LENGTH, SHORT_PREFIX_FROM
from episodic.store.codec import EVENT_COLUMNS

SCHEMA_FILE = "schema.sql"


def schema_sql() -> str:
    """The text of ``schema.sql``."""
    return files("episodic.store.postgres").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


def named_call(function: str, parameters: tuple[str, ...], *, columns: str = "*") -> str:
    """``SELECT columns FROM function(p_a => $1, p_b => $2, ...)``: a call that names each
    argument, so the SQL says which value is which; the caller passes the values in the order
    of ``parameters``."""
    arguments = ", ".join(f"{name} => ${index}" for index, name in enumerate(parameters, 1))
    return f"SELECT {columns} FROM {function}({arguments})"


READ_REVISION = "SELECT version_num FROM episodic_alembic_version"

OUTCOME = "o_outcome, o_seq, o_created_at, o_detail"
# Rows of events: codec.EVENT_COLUMNS, in order (read by position).
EVENT = ", ".join(f"o_{name} AS {name}" for name in EVENT_COLUMNS)
# load_context's rows: the same, with created_at in seconds since the epoch (codec.instant),
# then where the head stands (the same on every row).
TAIL = (
    EVENT.replace("o_created_at AS", "date_part('epoch', o_created_at) AS")
    + ", o_last_seq AS last_seq, o_boundary_seq AS boundary_seq"
)

# The request path: one call each to the functions in postgres/schema.sql, by parameter name. The
# trigger's thresholds are one jsonb (EpisodicCompactionConfig); p_scope is the tenant of a
# scoped store (NULL otherwise), which the function sets for row-level security itself.
#: An append's arguments, in this order: episodic_append's first parameters, and the fields
#: of an episodic_append_request (the appends of a coalesced call).
APPEND_REQUEST = (
    "p_conversation_id", "p_expected_seq", "p_idempotency_key", "p_request_hash",
    "p_payloads", "p_token_estimates", "p_client_ids", "p_usage", "p_usage_input_tokens",
    "p_user_messages", "p_token_sum", "p_called_ids", "p_opened_ids", "p_opened_offsets",
    "p_closed_ids",
)  # fmt: skip
APPEND = named_call("episodic_append", (*APPEND_REQUEST, "p_trigger", "p_scope"), columns=OUTCOME)
# An append that changes state or gives its time: never coalesced (episodic_append_many's
# requests carry neither).
APPEND_WITH_STATE = named_call(
    "episodic_append",
    (*APPEND_REQUEST, "p_trigger", "p_scope", "p_state", "p_touched_at"),
    columns=OUTCOME,
)
# Appends in flight at once, in one call (postgres/coalesce.py): an outcome row each, by index.
APPEND_MANY = named_call(
    "episodic_append_many", ("p_requests", "p_trigger", "p_scope"), columns=f"o_index, {OUTCOME}"
)

MARK_RUN_COMPLETED = named_call(
    "episodic_mark_run_completed",
    ("p_conversation_id", "p_tokens_per_abandoned", "p_trigger", "p_scope"),
    columns=OUTCOME,
)

CREATE_CONVERSATION = named_call(
    "episodic_create_conversation",
    (
        "p_conversation_id", "p_tenant_id", "p_created_at", "p_metadata", "p_scope",
        "p_app_name", "p_user_id", "p_touched_at", "p_state", "p_reuse_erased",
    ),
)  # fmt: skip
#: episodic_create_conversation's refusal of an erased id (raised after its insert, which
#: the raise takes back).
ERASED_SQLSTATE = "EP410"
#: episodic_erase_tenant's refusal while the tenant still has conversations.
TENANT_NOT_EMPTY_SQLSTATE = "EP409"

ERASE_CONVERSATION = named_call(
    "episodic_erase_conversation", ("p_conversation_id", "p_erasure_id", "p_reason", "p_scope")
)
ERASE_TENANT = named_call(
    "episodic_erase_tenant",
    (
        "p_tenant_id", "p_erasure_id", "p_reason", "p_conversations", "p_events",
        "p_attempts",
    ),
)  # fmt: skip
CONVERSATION_IDS = """
SELECT conversation_id FROM episodic_conversations
 WHERE tenant_id = $1 AND ($2::uuid IS NULL OR conversation_id > $2)
 ORDER BY conversation_id
 LIMIT $3
"""
EVENT_ROWS = """
SELECT seq, kind, created_at, token_estimate, payload, usage, client_id, idempotency_key,
       request_hash, batch_size
  FROM episodic_events
 WHERE conversation_id = $1 AND seq > $2 AND seq <= $3 AND ($5::text IS NULL OR tenant_id = $5)
 ORDER BY seq
 LIMIT $4
"""
ATTEMPT_ROWS = """
SELECT * FROM episodic_compaction_attempts
 WHERE conversation_id = $1 AND ($2::text IS NULL OR tenant_id = $2)
 ORDER BY finished_at, attempt_id
"""
SHARED_STATES = """
SELECT tenant_id, scope, state, updated_at FROM episodic_shared_state
 WHERE tenant_id = $1 ORDER BY scope COLLATE "C"
"""
WRITE_SHARED_STATES = """
INSERT INTO episodic_shared_state AS s (tenant_id, scope, state, updated_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::timestamptz[])
ON CONFLICT (tenant_id, scope) DO UPDATE
   SET state = excluded.state, updated_at = excluded.updated_at
"""
# An import's pages: its rows as arrays, one statement each (COPY does not run under
# row-level security).
IMPORT_EVENTS = """
INSERT INTO episodic_events (conversation_id, tenant_id, seq, kind, created_at,
                             token_estimate, payload, usage, client_id, idempotency_key,
                             request_hash, batch_size)
SELECT $1, $2, r.* FROM unnest($3::bigint[], $4::text[], $5::timestamptz[], $6::integer[],
                               $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                               $12::integer[]) AS r
"""
IMPORT_ATTEMPTS = """
INSERT INTO episodic_compaction_attempts
SELECT (jsonb_populate_record(NULL::episodic_compaction_attempts, j)).*
  FROM jsonb_array_elements($1::jsonb) AS j
"""
IMPORT_HEAD = """
UPDATE episodic_conversations SET
    last_seq = $2, boundary_seq = $3, covers_through_seq = $4, total_user_messages = $5,
    user_messages_since_boundary = $6, run_completed_since_boundary = $7,
    user_messages_since_run_completed = $8, context_tokens = $9, usage_input_tokens = $10,
    tokens_since_usage = $11, open_tool_calls = $12, state = $13, boundary_at = $14,
    deleted_at = $15, touched_at = $16
 WHERE conversation_id = $1
"""
READ_STATE = named_call(
    "episodic_read_state",
    ("p_conversation_id", "p_tenant_id", "p_shared", "p_scope"),
    columns="o_scope, o_state, o_last_seq, o_touched_at",
)
LIST_BY_USER = named_call(
    "episodic_list_by_user",
    (
        "p_tenant_id", "p_app_name", "p_user_id", "p_after_user", "p_after_id", "p_limit",
        "p_scope",
    ),
)  # fmt: skip

# The head's cut, then the events after it with a range scan planned on every call (see the
# function), so the cost is the rows returned, whatever the length of the history.
LOAD_TAIL = named_call("episodic_load_tail", ("p_conversation_id", "p_scope"), columns=TAIL)

# Everything else a scoped store does runs in a transaction that starts with this.
SET_TENANT = named_call("episodic_set_tenant", ("p_tenant",))

READ_EVENTS = f"""
SELECT {", ".join(EVENT_COLUMNS)}
  FROM episodic_events
 WHERE conversation_id = $1 AND seq > $2 AND ($4::text IS NULL OR tenant_id = $4)
 ORDER BY seq
 LIMIT $3
"""

# store.search: the messages of one conversation holding the query's words, ranked as
# episodic.search.rank_hits ranks them (each word weighted by how rare it is among the
# conversation's messages, ties to the newest). A message's text is every string of its content,
# its tool calls' names and arguments (their JSON: the arguments' names too; not the calls' ids)
# and its tool name, and a tool result's also its call's (what was asked is what its output
# answers), with the punctuation of
# paths and identifiers made spaces (SEARCH_SEPARATORS: PostgreSQL's parser reads "src/app.py" as
# one token that "app.py" would not find; FTS5 splits it as this does); a term that is one long
# word is a prefix too, and a longer one also without its last two letters
# (episodic.search.prefix_forms), any other a phrase. No index: each message's text is parsed per
# search (about 140 us per message: 0.7 s for 5,000 on 2 cores), which keeps every append free
# of that work (a GIN index over the text made inserting 5,000 messages 8-10x slower,
# measured); the scan is one conversation's rows, on its shard under Citus. Retracted messages
# and those a clear emptied from view are left out.
SEARCH_SEPARATORS = "/.-@:"
_SPACES = " " * len(SEARCH_SEPARATORS)
#: the text given, the separators made spaces
_SPACED = f"translate({{}}, '{SEARCH_SEPARATORS}', '{_SPACES}')"
#: the JSON text given as jsonb, each \u0000 escape (a NUL, which jsonb cannot hold) dropped: a
#: message may say one (json keeps it), and searching it must not fail; an escaped backslash
#: before "u0000" is text, not the escape, and is kept
_WITHOUT_NUL = r"CAST(regexp_replace({}, '(?<!\\)((?:\\\\)*)\\u0000', '\1', 'g') AS jsonb)"
SEARCH_EVENTS = f"""
WITH terms AS (
    SELECT t.ord,
           CASE WHEN length(t.term) >= {SHORT_PREFIX_FROM} AND t.term ~ '^[[:alnum:]]+$'
                THEN to_tsquery('english', t.term || ':* | ' || left(t.term, -2) || ':*')
                WHEN length(t.term) >= {MIN_PREFIX_LENGTH} AND t.term ~ '^[[:alnum:]]+$'
                THEN to_tsquery('english', t.term || ':*')
                ELSE phraseto_tsquery('english', {_SPACED.format("t.term")})
           END AS q
      FROM unnest($2::text[]) WITH ORDINALITY AS t(term, ord)
),
retracted AS MATERIALIZED (
    SELECT CAST(CAST(r.payload AS jsonb) ->> 'retracted_seq' AS bigint) AS seq
      FROM episodic_events r
     WHERE r.conversation_id = $1 AND r.kind = 'retraction'
),
msgs AS MATERIALIZED (
    SELECT e.seq, {_WITHOUT_NUL.format("CAST(e.payload AS text)")} AS p
      FROM episodic_events e
     WHERE e.conversation_id = $1 AND e.kind = 'message'
       AND ($4::text IS NULL OR e.tenant_id = $4)
       AND e.seq > (SELECT coalesce(max(c.seq), 0) FROM episodic_events c
                     WHERE c.conversation_id = $1 AND c.kind = 'clear')
       -- one read of the retractions, not one per message (that was quadratic in the log)
       AND e.seq NOT IN (SELECT seq FROM retracted)
),
calls AS MATERIALIZED (
    SELECT m.seq, c ->> 'id' AS id,
           jsonb_build_array(c -> 'name', c -> 'args', c -> 'arguments_json') AS said
      FROM msgs m, jsonb_array_elements(m.p -> 'tool_calls') AS c
),
answered AS MATERIALIZED (
    SELECT DISTINCT ON (m.seq) m.seq, k.said
      FROM msgs m JOIN calls k ON k.id = m.p ->> 'tool_call_id' AND k.seq < m.seq
     ORDER BY m.seq, k.seq DESC
),
docs AS MATERIALIZED (
    SELECT m.seq,
           (SELECT to_tsvector(
                       'english',
                       {_SPACED.format("string_agg(s #>> '{}', ' ')")}
                   )
              FROM jsonb_path_query(
                       jsonb_build_array(
                           m.p -> 'content',
                           jsonb_path_query_array(m.p, 'lax $.tool_calls[*].name'),
                           to_jsonb(CAST(
                               jsonb_path_query_array(m.p, 'lax $.tool_calls[*].args') AS text
                           )),
                           jsonb_path_query_array(m.p, 'lax $.tool_calls[*].arguments_json'),
                           m.p -> 'name',
                           to_jsonb(CAST(a.said AS text))
                       ),
                       'strict $.** ? (@.type() == "string")'
                   ) AS s) AS doc
      FROM msgs m LEFT JOIN answered a USING (seq)
),
hits AS (
    SELECT d.seq, t.ord FROM docs d JOIN terms t ON numnode(t.q) > 0 AND d.doc @@ t.q
),
weights AS (
    SELECT h.ord, ln((SELECT count(*) FROM docs) + 1.0) - ln(count(*)) AS weight
      FROM hits h GROUP BY h.ord
),
ranked AS (
    SELECT h.seq, round(CAST(sum(w.weight) AS numeric), 9) AS score
      FROM hits h JOIN weights w USING (ord)
     GROUP BY h.seq
     ORDER BY score DESC, h.seq DESC
     LIMIT $3
)
SELECT {", ".join(f"e.{name}" for name in EVENT_COLUMNS)}
  FROM ranked JOIN episodic_events e ON e.conversation_id = $1 AND e.seq = ranked.seq
 ORDER BY ranked.score DESC, ranked.seq DESC
"""

#: The range query episodic_load_tail runs, for plan tests (tests/integration/
#: test_load_context_cost.py checks it is the function's own).
TAIL_RANGE = """
SELECT e.seq, e.kind, e.created_at, e.token_estimate, e.payload, e.usage
  FROM episodic_events e
 WHERE e.conversation_id = $1 AND e.seq > $2 AND e.seq <= $3
 ORDER BY e.seq
"""

#: Backend.head: the store's get_conversation.
HEAD = named_call("episodic_head", ("p_conversation_id", "p_scope"))

# A boundary is written optimistically, without holding a lock while Python plans it: read
# the head, then the events after the cut (through episodic_load_tail, planned per call), plan,
# then write in one statement that applies only if the head is still the one read (same last
# seq, same boundary, lease still held). If anything moved, plan again on the new state. Three
# round trips, no explicit transaction.
READ_HEAD = named_call(
    "episodic_head", ("p_conversation_id", "p_scope"), columns="*, now() AS database_now"
)

# With no WHERE over its rows (the row without an event, when none is after the cut, is
# skipped in Python): Citus delegates a function call only when nothing filters its result.
READ_TAIL_AFTER = named_call(
    "episodic_load_tail", ("p_conversation_id", "p_after_seq", "p_scope"), columns=EVENT
)

WRITE_BOUNDARY = named_call(
    "episodic_write_boundary",
    (
        "p_conversation_id", "p_planned_last_seq", "p_planned_boundary_seq", "p_lease_token",
        "p_seq", "p_covers_through_seq", "p_user_messages_since_boundary",
        "p_run_completed_since_boundary", "p_user_messages_since_run_completed",
        "p_context_tokens", "p_created_at", "p_token_estimate", "p_payload", "p_attempt",
        "p_scope",
    ),
)  # fmt: skip

#: Plans of a boundary (or a retraction, a clear) that a busy conversation may force before
#: the write gives up.
BOUNDARY_WRITE_TRIES = 20

# A retraction or a clear (store/planned_events.py) is written the same way: read the head and
# the events after its cut, plan, write if the head is still at the planned last seq.
WRITE_EVENT = named_call(
    "episodic_write_event",
    (
        "p_conversation_id", "p_planned_last_seq", "p_seq", "p_kind", "p_created_at",
        "p_payload", "p_covers_through_seq", "p_total_user_messages",
        "p_user_messages_since_boundary", "p_run_completed_since_boundary",
        "p_user_messages_since_run_completed", "p_context_tokens", "p_usage_input_tokens",
        "p_tokens_since_usage", "p_open_tool_calls", "p_context_since", "p_trigger", "p_scope",
    ),
)  # fmt: skip

# Claims (postgres/schema.sql): one call each, holding no lock across conversations.
CLAIM_COLUMNS = (
    "o_conversation_id AS conversation_id, o_tenant_id AS tenant_id, "
    "o_lease_token AS lease_token, o_lease_expires_at AS lease_expires_at, "
    "o_compaction_attempts AS compaction_attempts, o_due_reason AS due_reason, "
    "o_boundary_seq AS boundary_seq, o_claimed_at AS claimed_at"
)
CLAIM = named_call(
    "episodic_claim", ("p_limit", "p_owner", "p_lease_seconds", "p_scope"), columns=CLAIM_COLUMNS
)
CLAIM_CONVERSATION = named_call(
    "episodic_claim_conversation",
    ("p_conversation_id", "p_owner", "p_lease_seconds", "p_reason", "p_scope"),
    columns=CLAIM_COLUMNS,
)

DUE_CHANNEL = "episodic_due"

# Ends an attempt that wrote no boundary, fenced by the lease token, and records it, in one
# statement. A worker whose lease was taken over changes nothing but the ledger.
END_ATTEMPT = named_call(
    "episodic_end_attempt",
    (
        "p_conversation_id", "p_lease_token", "p_clear_due", "p_retry_in_seconds", "p_dead",
        "p_attempt", "p_scope",
    ),
)  # fmt: skip

# The periodic sweep: the trigger evaluated now over every head with something to compact.
SWEEP_DUE = named_call("episodic_sweep_due", ("p_trigger",))

# Backend.queue_status: the counts (attempts.queue_counts is the twin), the conversations
# behind them, the latest attempts.
QUEUE_COUNTS = """
SELECT count(*) FILTER (WHERE due_since IS NOT NULL AND dead_since IS NULL) AS due,
       count(*) FILTER (WHERE lease_expires_at > now()) AS leased,
       count(*) FILTER (WHERE due_since IS NOT NULL AND dead_since IS NULL
                          AND last_error IS NOT NULL) AS failing,
       count(*) FILTER (WHERE dead_since IS NOT NULL) AS dead
  FROM episodic_conversations
 WHERE $1::text IS NULL OR tenant_id = $1
"""

# The conversations behind the counts, what needs a person first (dead, then leased, failing,
# due: attempts.QUEUE_STATES). An operator's query: it reads every head, like the counts. The
# state is computed once, in the subquery, and ordered on outside it; the twins are
# attempts.in_queue (the WHERE), attempts.queue_state (the CASE) and attempts.queue_order.
QUEUE = """
SELECT * FROM (
    SELECT conversation_id, tenant_id, due_reason AS reason, compaction_attempts AS attempts,
           last_error, next_attempt_at, lease_owner, lease_expires_at,
           CASE WHEN dead_since IS NOT NULL THEN 'dead'
                WHEN lease_expires_at > now() THEN 'leased'
                WHEN last_error IS NOT NULL THEN 'failing'
                ELSE 'due' END AS state
      FROM episodic_conversations
     WHERE (due_since IS NOT NULL OR dead_since IS NOT NULL OR lease_expires_at > now())
       AND ($2::text IS NULL OR tenant_id = $2)
) AS queue
 ORDER BY array_position(ARRAY['dead', 'leased', 'failing', 'due'], state),
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

LIST_CONVERSATIONS = """
SELECT * FROM episodic_conversations c
 WHERE ($1::text IS NULL OR c.tenant_id = $1) AND c.deleted_at IS NULL
   AND ($3::uuid IS NULL OR (c.created_at, c.conversation_id) < (
        SELECT p.created_at, p.conversation_id FROM episodic_conversations p
         WHERE p.conversation_id = $3))
 ORDER BY c.created_at DESC, c.conversation_id DESC
 LIMIT $2
"""


__all__ = [
    "APPEND",
    "APPEND_MANY",
    "APPEND_REQUEST",
    "APPEND_WITH_STATE",
    "ATTEMPT_ROWS",
    "BOUNDARY_WRITE_TRIES",
    "CLAIM",
    "CLAIM_COLUMNS",
    "CLAIM_CONVERSATION",
    "CONVERSATION_IDS",
    "CREATE_CONVERSATION",
    "DUE_CHANNEL",
    "END_ATTEMPT",
    "ERASED_SQLSTATE",
    "ERASE_CONVERSATION",
    "ERASE_TENANT",
    "EVENT",
    "EVENT_ROWS",
    "HEAD",
    "IMPORT_ATTEMPTS",
    "IMPORT_EVENTS",
    "IMPORT_HEAD",
    "LIST_BY_USER",
    "LIST_CONVERSATIONS",
    "LOAD_TAIL",
    "MARK_RUN_COMPLETED",
    "OUTCOME",
    "QUEUE",
    "QUEUE_COUNTS",
    "READ_EVENTS",
    "READ_HEAD",
    "READ_REVISION",
    "READ_STATE",
    "READ_TAIL_AFTER",
    "RECENT_ATTEMPTS",
    "SCHEMA_FILE",
    "SET_TENANT",
    "SHARED_STATES",
    "SWEEP_DUE",
    "TAIL",
    "TAIL_RANGE",
    "TENANT_NOT_EMPTY_SQLSTATE",
    "WRITE_BOUNDARY",
    "WRITE_EVENT",
    "WRITE_SHARED_STATES",
    "named_call",
    "schema_sql",
]
