"""Retractions, clears and usage reports: three new kinds of event, and the function that
writes them.

A retraction (``RetractionEvent``) takes back the newest message in view and a clear
(``ClearEvent``) empties the view, without rewriting the log: both are appended like any
event (episodic/view.py says what is in view, episodic/store/view_changes.py plans them). A
usage report (``UsageEvent``) records a provider's usage that came after its messages.
``episodic_write_event`` writes one as planned in Python from the head and the events after
its cut, only if the head is still where the plan saw it, like ``episodic_write_boundary``.

(Frozen once it ships: the current definitions are episodic/store/sql/schema.sql and
episodic/store/schema.py.)
"""

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0009_retractions_and_clears"
down_revision: str | None = "0008_coalesced_appends"

KINDS = "('message', 'boundary', 'run_completed', 'retraction', 'clear', 'usage')"
EARLIER_KINDS = "('message', 'boundary', 'run_completed')"
CONSTRAINT = "ck_episodic_events_kind"


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: SQLite copies the table to change a constraint, which drops its indexes and triggers:
#: they are put back as revision 0003 made them (its keys and its trigger restore).
_THIRD = _load_revision("0003_partial_unique_keys.py")
PARTIAL_KEYS: tuple[tuple[str, str], ...] = _THIRD.KEYS

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
        boundary_at = COALESCE(p_context_since, c.boundary_at)
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope)
       AND c.last_seq = p_planned_last_seq
    RETURNING c.* INTO v_head;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,
                                 token_estimate, payload)
    VALUES (p_conversation_id, p_seq, v_head.tenant_id, p_kind, p_created_at, 0, p_payload);
    IF v_head.due_since IS NULL AND v_head.dead_since IS NULL
       AND episodic_trigger_reason(v_head, p_trigger, now()) IS NOT NULL THEN
        PERFORM episodic_mark_due(v_head, p_trigger);
    END IF;
    RETURN 1;
END
$fn$;
"""


def upgrade() -> None:
    _kinds(KINDS)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(WRITE_EVENT)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "DROP FUNCTION episodic_write_event(uuid, bigint, bigint, text, timestamptz, text, "
            "bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, jsonb, "
            "timestamptz, jsonb, text)"
        )
    _kinds(EARLIER_KINDS)


def _kinds(kinds: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE episodic_events DROP CONSTRAINT {CONSTRAINT}")
        op.execute(
            f"ALTER TABLE episodic_events ADD CONSTRAINT {CONSTRAINT} CHECK (kind IN {kinds})"
        )
        return
    for _, name in PARTIAL_KEYS:
        op.drop_index(name, table_name="episodic_events")
    with op.batch_alter_table("episodic_events", recreate="always") as batch:
        batch.drop_constraint(op.f(CONSTRAINT), type_="check")
        batch.create_check_constraint(op.f(CONSTRAINT), sa.text(f"kind IN {kinds}"))
    for column, name in PARTIAL_KEYS:
        condition = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            name,
            "episodic_events",
            ["conversation_id", column],
            unique=True,
            sqlite_where=condition,
        )
    _THIRD._restore_sqlite_triggers()
