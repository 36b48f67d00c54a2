"""load_context's read planned on every call; partial unique indexes for idempotency keys
and client ids.

A pooled connection that prepared the tail query while episodic_events was nearly empty kept a
generic plan that scanned a conversation's every event and filtered by seq, until the table was
next analyzed. ``episodic_load_tail`` runs the range query with EXECUTE, so it is planned each
time with the real bounds and the table's current size: one round trip still, and the cost
stays that of the rows returned.

Almost every event has neither, so full indexes paid an insert of a NULL entry on every
append, and the client-id index, which also starts with conversation_id, could be chosen by
the planner for load_context's range on a table not yet analyzed (reading every event of the
conversation and filtering by seq). The partial indexes enforce the same uniqueness.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0003_partial_unique_keys"
down_revision: str | None = "0002_compaction_due"

KEYS = (
    ("idempotency_key", "uq_episodic_events_conversation_id_idempotency_key"),
    ("client_id", "uq_episodic_events_conversation_id_client_id"),
)


def _restore_sqlite_triggers() -> None:
    # SQLite changes constraints by copying the table, which drops its triggers: put the
    # append-only ones back (the same as revision 0001 creates).
    if op.get_bind().dialect.name != "sqlite":
        return
    for operation in ("UPDATE", "DELETE"):
        op.execute(f"DROP TRIGGER IF EXISTS episodic_events_no_{operation.lower()}")
        op.execute(
            f"CREATE TRIGGER episodic_events_no_{operation.lower()} BEFORE {operation} "
            "ON episodic_events BEGIN SELECT RAISE(ABORT, "
            f"'episodic_events is append-only: {operation} is not allowed'); END"
        )


def upgrade() -> None:
    with op.batch_alter_table("episodic_events") as batch:
        for _, name in KEYS:
            batch.drop_constraint(name, type_="unique")
    _restore_sqlite_triggers()
    if op.get_bind().dialect.name == "postgresql":
        op.execute(LOAD_TAIL)
    for column, name in KEYS:
        condition = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            name,
            "episodic_events",
            ["conversation_id", column],
            unique=True,
            postgresql_where=condition,
            sqlite_where=condition,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION episodic_load_tail(uuid, bigint)")
    for _, name in KEYS:
        op.drop_index(name, table_name="episodic_events")
    with op.batch_alter_table("episodic_events") as batch:
        for column, name in KEYS:
            batch.create_unique_constraint(name, ["conversation_id", column])
    _restore_sqlite_triggers()


LOAD_TAIL = """
CREATE FUNCTION episodic_load_tail(p_conversation_id uuid, p_after_seq bigint DEFAULT NULL)
RETURNS TABLE (
    o_last_seq bigint, o_boundary_seq bigint, o_seq bigint, o_kind text,
    o_created_at timestamptz, o_token_estimate integer, o_payload text, o_usage text
)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    v_last bigint;
    v_boundary bigint;
    v_covers bigint;
BEGIN
    SELECT c.last_seq, c.boundary_seq, c.covers_through_seq INTO v_last, v_boundary, v_covers
      FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- From the latest cut (or p_after_seq, for the boundary writer) to the last seq. EXECUTE:
    -- planned on every call with these bounds, never from a cached generic plan.
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
$fn$
"""
