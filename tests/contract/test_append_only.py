"""The log refuses UPDATE, DELETE and TRUNCATE at the database level, whoever asks."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from episodic import EpisodicStore, Message
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
