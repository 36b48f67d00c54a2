"""Erasure: the one path that removes a conversation, completely, leaving a tombstone."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from episodic import (
    BoundaryRequest,
    EpisodicStore,
    ErasedConversationError,
    Message,
    NotFoundError,
    StateChange,
    TenantDeniedError,
    ToolCall,
    ValidationError,
)
from episodic.store.attempts import AttemptEnd, AttemptRecord
from episodic.store.engine import parse_database_url
from tests.support import execute_raw, snapshot


def _sqlalchemy(url: str) -> str:
    return parse_database_url(url).sqlalchemy


async def _rows_of(url: str, backend: str, conversation_id: UUID) -> dict[str, int]:
    """Rows of the conversation in every episodic table with a conversation_id column, found
    from the catalog (a table added later cannot be forgotten), the ledger aside."""
    engine = create_async_engine(_sqlalchemy(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            if backend == "postgresql":
                tables = (
                    await conn.execute(
                        text(
                            "SELECT table_name FROM information_schema.columns "
                            "WHERE column_name = 'conversation_id' AND table_schema = 'public' "
                            "AND table_name LIKE 'episodic%' AND table_name <> 'episodic_erasures'"
                        )
                    )
                ).scalars()
                key = str(conversation_id)
            else:
                names = (
                    await conn.execute(
                        text(
                            "SELECT name FROM sqlite_master WHERE type = 'table' "
                            "AND name LIKE 'episodic%' AND name <> 'episodic_erasures'"
                        )
                    )
                ).scalars()
                tables = []
                for name in list(names):
                    columns = await conn.execute(text(f"PRAGMA table_info({name})"))
                    if any(column[1] == "conversation_id" for column in columns):
                        tables.append(name)
                key = conversation_id.hex
            counts = {}
            for table in list(tables):
                counts[table] = (
                    await conn.execute(
                        text(f"SELECT count(*) FROM {table} WHERE conversation_id = :c"),
                        {"c": key},
                    )
                ).scalar_one()
            return counts
    finally:
        await engine.dispose()


async def _tombstones(url: str, backend: str, conversation_id: UUID) -> int:
    key = str(conversation_id) if backend == "postgresql" else conversation_id.hex
    engine = create_async_engine(_sqlalchemy(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return int(
                (
                    await conn.execute(
                        text("SELECT count(*) FROM episodic_erasures WHERE conversation_id = :c"),
                        {"c": key},
                    )
                ).scalar_one()
            )
    finally:
        await engine.dispose()


async def _busy_conversation(store: EpisodicStore, tenant: str = "default") -> UUID:
    """A conversation with something in every table: messages, a tool call pair, state,
    a boundary with its attempt, and a failed attempt."""
    scoped = store.for_tenant(tenant)
    conv = await scoped.create_conversation(
        state=StateChange(conversation={"k": 1}, shared={f"user:{uuid4().hex[:6]}": {"x": 1}})
    )
    await scoped.append(
        conv,
        [
            Message.user("secret one"),
            Message.assistant(None, tool_calls=[ToolCall(id="c1", name="f")]),
            Message.tool_result("c1", "secret result", name="f"),
            Message.assistant("answer"),
            Message.user("secret two"),
        ],
        idempotency_key="k1",
    )
    claim = await scoped.claim_conversation(conv, "w", lease_seconds=60)
    assert claim is not None
    started = datetime.now(UTC)
    record = AttemptRecord(
        conv, uuid4(), tenant, "w", "manual_recovery", "succeeded", started, started
    )
    await scoped.write_boundary(
        conv,
        BoundaryRequest(
            summary="handoff",
            covers_through_seq=5,
            reason="manual_recovery",
            expected_boundary_seq=None,
            lease_token=claim.lease_token,
        ),
        attempt=record,
    )
    claim = await scoped.claim_conversation(conv, "w", lease_seconds=60)
    assert claim is not None
    failed = AttemptRecord(
        conv, uuid4(), tenant, "w", "manual_recovery", "failed", started, started
    )
    await scoped.end_attempt(claim, AttemptEnd(retry_in=1), failed)
    await scoped.append(conv, [Message.user("after the boundary")])
    return conv


async def _export(store: EpisodicStore, conv: UUID) -> list[str]:
    return [line async for line in store.export_conversation(conv)]


async def test_erasure_leaves_no_row_and_one_tombstone(
    store: EpisodicStore, database_url: str, backend: str
) -> None:
    doomed, kept = await _busy_conversation(store), await _busy_conversation(store)
    kept_before = await _export(store, kept)
    rows = await _rows_of(database_url, backend, doomed)
    assert set(rows) >= {
        "episodic_events",
        "episodic_conversations",
        "episodic_compaction_attempts",
    }
    assert all(count > 0 for count in rows.values()), rows
    erased = await store.erase_conversation(doomed, reason="user asked (ticket 123)")
    assert set((await _rows_of(database_url, backend, doomed)).values()) == {0}
    assert await _tombstones(database_url, backend, doomed) == 1
    assert erased.conversation_id == doomed
    assert erased.tenant_id == "default"
    assert erased.reason == "user asked (ticket 123)"
    assert (erased.conversations, erased.events, erased.compaction_attempts) == (
        1,
        rows["episodic_events"],
        rows["episodic_compaction_attempts"],
    )
    assert erased.erased_by == ("postgres" if backend == "postgresql" else "sqlite")
    assert await _export(store, kept) == kept_before
    with pytest.raises(NotFoundError):
        await store.load_context(doomed)
    with pytest.raises(NotFoundError):
        await store.read_events(doomed)


async def test_erasing_twice_reports_the_first_tombstone(store: EpisodicStore) -> None:
    conv = await _busy_conversation(store)
    first = await store.erase_conversation(conv, reason="gdpr")
    again = await store.erase_conversation(conv, reason="again")
    assert again == first


async def test_bad_erasures_are_refused_and_change_nothing(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await _busy_conversation(store)
    before = await snapshot(database_url)
    with pytest.raises(NotFoundError):
        await store.erase_conversation(uuid4(), reason="no such conversation")
    for reason in ("", None, "x" * 2001, "nul\x00"):
        with pytest.raises(ValidationError):
            await store.erase_conversation(conv, reason=reason)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await store.erase_conversation("not-a-uuid", reason="r")
    assert await snapshot(database_url) == before


async def test_erasure_is_tenant_scoped(store: EpisodicStore, database_url: str) -> None:
    acme = await _busy_conversation(store, "acme")
    before = await snapshot(database_url)
    with pytest.raises(NotFoundError):
        await store.for_tenant("globex").erase_conversation(acme, reason="not yours")
    with pytest.raises(TenantDeniedError):
        await store.for_tenant("globex").erase_tenant("acme", reason="not yours")
    assert await snapshot(database_url) == before
    erased = await store.for_tenant("acme").erase_conversation(acme, reason="yours")
    assert erased.tenant_id == "acme"


async def test_an_erased_id_is_recreated_only_when_asked(
    store: EpisodicStore, database_url: str, backend: str
) -> None:
    conv = await _busy_conversation(store)
    await store.erase_conversation(conv, reason="gdpr")
    with pytest.raises(ErasedConversationError) as raised:
        await store.create_conversation(conversation_id=conv)
    assert "reuse_erased_id=True" in str(raised.value)
    # appends and keyed retries find nothing: nothing resurrects it
    for key in (None, "k1"):
        with pytest.raises(NotFoundError):
            await store.append(conv, [Message.user("again")], idempotency_key=key)
    assert set((await _rows_of(database_url, backend, conv)).values()) == {0}
    again = await store.create_conversation(conversation_id=conv, reuse_erased_id=True)
    assert again == conv
    await store.append(conv, [Message.user("a new life")])
    assert [m.text for m in (await store.load_context(conv)).messages] == ["a new life"]
    # the old tombstone does not let anyone remove the new conversation's rows
    with pytest.raises(DBAPIError):
        await execute_raw(database_url, "DELETE FROM episodic_events")
    second = await store.erase_conversation(conv, reason="again")
    assert second.events == 1
    assert await _tombstones(database_url, backend, conv) == 2


async def test_a_worker_holding_a_lease_on_an_erased_conversation_writes_nothing(
    store: EpisodicStore, database_url: str, backend: str
) -> None:
    conv = await _busy_conversation(store)
    claim = await store.claim_conversation(conv, "w2", lease_seconds=60)
    assert claim is not None
    await store.erase_conversation(conv, reason="gdpr")
    with pytest.raises(NotFoundError):
        await store.write_boundary(
            conv,
            BoundaryRequest(
                summary="late",
                covers_through_seq=6,
                reason="manual_recovery",
                expected_boundary_seq=7,
                lease_token=claim.lease_token,
            ),
        )
    started = datetime.now(UTC)
    late = AttemptRecord(
        conv, uuid4(), "default", "w2", "manual_recovery", "failed", started, started
    )
    assert await store.end_attempt(claim, AttemptEnd(retry_in=1), late) == "gone"
    assert set((await _rows_of(database_url, backend, conv)).values()) == {0}


async def test_erase_tenant_removes_its_conversations_and_shared_state(
    store: EpisodicStore, database_url: str, backend: str
) -> None:
    gone = [await _busy_conversation(store, "acme") for _ in range(3)]
    await store.for_tenant("acme").delete_conversation(gone[0])  # a deleted one goes too
    kept = await _busy_conversation(store, "globex")
    kept_before = await _export(store, kept)
    erased = await store.erase_tenant("acme", reason="customer left")
    assert erased.conversation_id is None
    assert erased.conversations == 3
    assert erased.shared_states == 3
    for conv in gone:
        assert set((await _rows_of(database_url, backend, conv)).values()) == {0}
        assert await _tombstones(database_url, backend, conv) == 1
    rows = await snapshot(database_url)
    assert all(row[0] != "acme" for row in rows["episodic_shared_state"])
    assert await _export(store, kept) == kept_before
    assert await store.erase_tenant("acme", reason="twice") == erased
