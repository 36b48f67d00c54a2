"""The append's server time trimmed: the head lock and the due check written out, empty id
arrays sent as NULL, and room left on the heads' pages for HOT updates.

Measured with ``python -m bench.profile`` (``bench/PROFILE.md``): calling
``episodic_lock_head`` from ``episodic_append`` cost ~10 us of server time per append, and
testing empty arrays (``cardinality``, ``array_remove``) a few more. ``episodic_append`` now
locks the head itself and takes NULL for the id arrays a batch does not need (an empty array
still works, so clients of the previous revision keep working), and asks the trigger itself
before calling ``episodic_mark_due`` (~5 us: most appends leave the head not due). Every
append updates its head, so the heads' table keeps 30% of each page free: the update stays
HOT (no index entries, pruned in place) when many conversations share a page.

(Frozen once it ships. ``episodic_append`` below is revision 0006's with these edits; the
current definition is episodic/store/sql/schema.sql, and tests/contract/test_schema.py
compares them.)
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0007_lean_append"
down_revision: str | None = "0006_named_parameters"

SIGNATURE = (
    "episodic_append(uuid, bigint, text, text, text[], integer[], text[], text, bigint, integer, "
    "bigint, text[], text[], integer[], text[], jsonb, text)"
)


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SIXTH = _load_revision("0006_named_parameters.py")

APPEND: str = _SIXTH.APPEND
for _old, _new in (
    (
        """
    v_head episodic_conversations := episodic_lock_head(p_conversation_id, p_scope);
    v_tenant text := v_head.tenant_id;
    v_last bigint := v_head.last_seq;
    v_open jsonb := v_head.open_tool_calls;""",
        """
    v_tenant text;
    v_last bigint;
    v_open jsonb;""",
    ),
    (
        """
    v_bad text;
BEGIN
    IF v_head.conversation_id IS NULL THEN""",
        """
    v_bad text;
    v_head episodic_conversations;
BEGIN
    -- episodic_lock_head's work, written out: on the hottest path a function call is ~10 us
    -- of server time (bench/PROFILE.md).
    IF p_scope IS NOT NULL THEN
        PERFORM episodic_set_tenant(p_scope);
    END IF;
    SELECT c.tenant_id, c.last_seq, c.open_tool_calls INTO v_tenant, v_last, v_open
      FROM episodic_conversations c
     WHERE c.conversation_id = p_conversation_id
       AND (p_scope IS NULL OR c.tenant_id = p_scope)
       FOR UPDATE;
    IF NOT FOUND THEN""",
    ),
    (
        "    IF array_remove(p_client_ids, NULL) <> '{}' THEN",
        "    -- The id arrays are NULL when empty (most batches): no array to build or test then.\n"
        "    IF p_client_ids IS NOT NULL THEN",
    ),
    (
        "    -- Most appends carry no tool calls or results: skip these checks then.\n"
        "    IF cardinality(p_called_ids) > 0 THEN",
        "    IF p_called_ids IS NOT NULL THEN",
    ),
    (
        "    IF cardinality(p_called_ids) > 0 AND FOUND THEN",
        "    IF p_called_ids IS NOT NULL AND FOUND THEN",
    ),
    ("    IF cardinality(p_closed_ids) > 0 THEN", "    IF p_closed_ids IS NOT NULL THEN"),
    (
        "    IF cardinality(p_closed_ids) > 0 AND FOUND THEN",
        "    IF p_closed_ids IS NOT NULL AND FOUND THEN",
    ),
    (
        "            WHEN cardinality(p_closed_ids) = 0 AND cardinality(p_opened_ids) = 0"
        " THEN v_open\n            ELSE (v_open - p_closed_ids) || COALESCE(",
        "            WHEN p_closed_ids IS NULL AND p_opened_ids IS NULL THEN v_open\n"
        "            ELSE (v_open - COALESCE(p_closed_ids, '{}')) || COALESCE(",
    ),
    (
        "    PERFORM episodic_mark_due(v_head, p_trigger);",
        "    -- episodic_mark_due's own tests first, written out: most appends leave the head not\n"
        "    -- due, and then no further function is called.\n"
        "    IF v_head.due_since IS NULL AND v_head.dead_since IS NULL\n"
        "       AND episodic_trigger_reason(v_head, p_trigger, now()) IS NOT NULL THEN\n"
        "        PERFORM episodic_mark_due(v_head, p_trigger);\n"
        "    END IF;",
    ),
):
    assert APPEND.count(_old) == 1, f"not exactly once in revision 0006's body: {_old!r}"
    APPEND = APPEND.replace(_old, _new)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite has no functions, and no fillfactor
    op.execute("ALTER TABLE episodic_conversations SET (fillfactor = 70)")
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute(APPEND)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE episodic_conversations RESET (fillfactor)")
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute(_SIXTH.APPEND)
