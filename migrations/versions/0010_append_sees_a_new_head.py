"""An append that races the conversation's creation says ``not_found``, never a conflict.

In READ COMMITTED, ``episodic_append``'s head UPDATE does not see a head created after the
statement began, while the check that follows it does: an append with no ``expected_seq``
racing a concurrent first write was told "conflict: at seq 0, not the expected None". Now
that case is ``not_found`` (the conversation was not there when the append began; the caller
creates it or retries), and ``conflict`` means only what it says: an ``expected_seq`` the head
is not at.

(Frozen once it ships: the current definitions are episodic/store/sql/schema.sql and
episodic/store/schema.py.)
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0010_append_sees_a_new_head"
down_revision: str | None = "0009_retractions_and_clears"


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: 0008's definition, the one this revision changes (and its downgrade restores).
EARLIER_APPEND: str = _load_revision("0008_coalesced_appends.py").APPEND

EARLIER_NOT_FOUND = """
    IF NOT FOUND THEN
        -- Only without the locking read above: the head is not there, or not at p_expected_seq.
        SELECT c.last_seq INTO v_last FROM episodic_conversations c
         WHERE c.conversation_id = p_conversation_id
           AND (p_scope IS NULL OR c.tenant_id = p_scope);
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
        ELSE
            RETURN QUERY SELECT 'conflict'::text, v_last, NULL::timestamptz, NULL::text;
        END IF;
        RETURN;
    END IF;
"""
NOT_FOUND = """
    IF NOT FOUND THEN
        -- Only without the locking read above: the head is not there, or not at p_expected_seq.
        -- A head created after this statement began is not there for the update either: that
        -- is not_found (the caller creates or retries), never a conflict nobody asked for.
        IF p_expected_seq IS NOT NULL THEN
            SELECT c.last_seq INTO v_last FROM episodic_conversations c
             WHERE c.conversation_id = p_conversation_id
               AND (p_scope IS NULL OR c.tenant_id = p_scope);
            IF FOUND AND v_last <> p_expected_seq THEN
                RETURN QUERY SELECT 'conflict'::text, v_last, NULL::timestamptz, NULL::text;
                RETURN;
            END IF;
        END IF;
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
"""
assert EARLIER_APPEND.count(EARLIER_NOT_FOUND) == 1
APPEND = EARLIER_APPEND.replace(EARLIER_NOT_FOUND, NOT_FOUND)


def _replacing(definition: str) -> str:
    return definition.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite writes one transaction at a time: no such race
    op.execute(_replacing(APPEND))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_replacing(EARLIER_APPEND))
