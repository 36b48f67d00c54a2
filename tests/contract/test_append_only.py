"""The log refuses UPDATE, DELETE and TRUNCATE at the database level, whoever asks."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from episodic import EpisodicStore, IntegrityViolationError, Message
from tests.support import execute_raw, snapshot

STATEMENTS = {
    "update": "UPDATE {table} SET tenant_id = 'mallory'",
    "delete": "DELETE FROM {table}",
    "truncate": "TRUNCATE {table}",
}


@pytest.mark.parametrize("table", ["episodic_events", "episodic_compaction_attempts"])
@pytest.mark.parametrize("operation", sorted(STATEMENTS))
async def test_log_tables_refuse_changes(
    store: EpisodicStore, database_url: str, backend: str, table: str, operation: str
) -> None:
    if operation == "truncate" and backend == "sqlite":
        # SQLite has no TRUNCATE; a bare DELETE is its truncate and is covered above.
        pytest.skip("SQLite has no TRUNCATE statement")
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("keep me"), Message.assistant("and me")])
    if table == "episodic_compaction_attempts":
        await execute_raw(
            database_url,
            "INSERT INTO episodic_compaction_attempts (conversation_id, attempt_id, tenant_id, "
            "worker, reason, outcome, started_at, finished_at) VALUES "
            f"('{conv.hex}', '{conv.hex}', 'default', 'w', 'manual_recovery', 'failed', "
            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        )
    before = await snapshot(database_url)
    with pytest.raises(DBAPIError) as raised:
        await execute_raw(database_url, STATEMENTS[operation].format(table=table))
    assert "append-only" in str(raised.value)
    if backend == "postgresql":
        assert getattr(raised.value.orig, "sqlstate", None) == "0A000"
    assert await snapshot(database_url) == before


@pytest.mark.parametrize("operation", ["delete", "truncate"])
async def test_head_rows_cannot_be_removed(
    store: EpisodicStore, database_url: str, backend: str, operation: str
) -> None:
    """Deleting a head would orphan its events: refused for every role, owner included, on
    both backends (only the erasure path removes a conversation)."""
    if operation == "truncate" and backend == "sqlite":
        pytest.skip("SQLite has no TRUNCATE statement")
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("keep me")])
    before = await snapshot(database_url)
    statement = STATEMENTS[operation].format(table="episodic_conversations")
    with pytest.raises(DBAPIError) as raised:
        await execute_raw(database_url, statement)
    assert "head row of a conversation cannot be deleted" in str(raised.value)
    if backend == "postgresql":
        assert getattr(raised.value.orig, "sqlstate", None) == "0A000"
    assert await snapshot(database_url) == before
    assert [e.seq for e in (await store.load_context(conv)).messages] == [1]


async def test_an_unexpected_constraint_on_append_is_a_typed_error(
    store: EpisodicStore, database_url: str
) -> None:
    """A row written behind episodic's back (here: an event at the seq the next append takes)
    makes the append fail with IntegrityViolationError, not a driver exception, and write
    nothing."""
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("one")])
    await execute_raw(
        database_url,
        "INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at, "
        f"token_estimate, payload) VALUES ('{conv.hex}', 2, 'default', 'message', "
        """CURRENT_TIMESTAMP, 1, '{"role": "user", "content": "planted"}')""",
    )
    before = await snapshot(database_url)
    with pytest.raises(IntegrityViolationError, match="changed outside episodic"):
        await store.append(conv, [Message.user("two")])
    assert await snapshot(database_url) == before


@pytest.mark.alters_schema
async def test_an_unexpected_constraint_on_create_is_a_typed_error(
    store: EpisodicStore, database_url: str, backend: str
) -> None:
    if backend == "postgresql":
        refuse = (
            "ALTER TABLE episodic_conversations ADD CONSTRAINT ck_test_no_evil "
            "CHECK (tenant_id <> 'evil')"
        )
    else:
        refuse = (
            "CREATE TRIGGER test_no_evil BEFORE INSERT ON episodic_conversations "
            "WHEN NEW.tenant_id = 'evil' BEGIN SELECT RAISE(ABORT, 'no evil'); END"
        )
    await execute_raw(database_url, refuse)
    before = await snapshot(database_url)
    with pytest.raises(IntegrityViolationError) as raised:
        await store.create_conversation(tenant_id="evil")
    if backend == "postgresql":
        assert raised.value.constraint == "ck_test_no_evil"
    assert await snapshot(database_url) == before
