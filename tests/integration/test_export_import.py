"""Export and import: 200 generated conversations from SQLite to PostgreSQL and back, every
event kind, and import files that were damaged refused with nothing written."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import orjson
import pytest
from sqlalchemy.exc import DBAPIError

from episodic import (
    BoundaryRequest,
    ConflictError,
    EpisodicStore,
    ErasedConversationError,
    ImportFormatError,
    Message,
    StateChange,
    ToolCall,
    Usage,
)
from tests.conftest import isolated_settings
from tests.support import execute_raw, snapshot

CONVERSATIONS = 200


async def _sqlite(path: Path) -> EpisodicStore:
    store = await EpisodicStore.open(f"sqlite+aiosqlite:///{path}", settings=isolated_settings())
    await store.migrate()
    return store


@pytest.fixture
async def source(tmp_path: Path) -> AsyncIterator[EpisodicStore]:
    store = await _sqlite(tmp_path / "source.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def back(tmp_path: Path) -> AsyncIterator[EpisodicStore]:
    store = await _sqlite(tmp_path / "back.db")
    try:
        yield store
    finally:
        await store.close()


async def _generate(store: EpisodicStore, index: int) -> UUID:
    """A conversation with a mix of what a log holds: tool calls (some abandoned by a run
    completion), boundaries, retractions, a clear, usage, state, and some deleted."""
    rng = random.Random(index)
    tenant = ("acme", "globex")[index % 2]
    scoped = store.for_tenant(tenant)
    conv = await scoped.create_conversation(
        metadata={"index": index, "tags": ["a", "b"]},
        app_name="app",
        user_id=f"user{index % 7}",
        state=StateChange(conversation={"n": index}, shared={"user:x": {str(index): index}})
        if index % 3 == 0
        else None,
        touched_at=1_700_000_000.123456 + index,
    )
    for turn in range(rng.randint(1, 6)):
        call = f"c{turn}"
        batch = [
            Message.user(f"question {turn} of {index}", client_id=f"u{turn}"),
            Message.assistant(
                None, tool_calls=[ToolCall(id=call, name="lookup", args={"q": turn})]
            ),
        ]
        if rng.random() < 0.7:
            batch += [
                Message.tool_result(call, f"result {turn}"),
                Message.assistant(f"answer {turn}"),
            ]
        await scoped.append(
            conv,
            batch,
            idempotency_key=f"turn-{turn}" if rng.random() < 0.5 else None,
            usage=Usage(input_tokens=100 + turn, output_tokens=5) if rng.random() < 0.3 else None,
            state=StateChange(conversation={"turn": turn}) if rng.random() < 0.2 else None,
        )
        choice = rng.random()
        if choice < 0.3:
            await scoped.mark_run_completed(conv)  # abandons a call still open
        elif choice < 0.4:
            await scoped.retract_last(conv)
        elif choice < 0.45:
            await scoped.report_usage(conv, Usage(input_tokens=321))
        if rng.random() < 0.3:
            context = await scoped.load_context(conv)
            head = await scoped.get_conversation(conv)
            if not head.open_tool_calls and head.last_seq > head.covers_through_seq:
                await scoped.write_boundary(
                    conv,
                    BoundaryRequest(
                        summary=f"summary through {head.last_seq}",
                        covers_through_seq=head.last_seq,
                        retained=("kept",),
                        reason="manual_recovery",
                        expected_boundary_seq=context.boundary_seq,
                    ),
                )
    if index % 17 == 0:
        await scoped.clear(conv)
    if index % 11 == 0:
        await scoped.delete_conversation(conv)
    return conv


async def _export_all(store: EpisodicStore, tenants: tuple[str, ...]) -> str:
    return "".join([line for tenant in tenants async for line in store.export_tenant(tenant)])


async def _view(store: EpisodicStore, conv: UUID) -> tuple[object, ...]:
    head = await store.get_conversation(conv)
    events = await store.read_events(conv, limit=10_000)
    context = None if head.deleted_at is not None else (await store.load_context(conv)).model_dump()
    return (
        head.model_dump(exclude={"due_since", "due_reason", "next_attempt_at"}),
        events,
        context,
    )


async def test_200_conversations_from_sqlite_to_postgresql_and_back(
    source: EpisodicStore, pg_store: EpisodicStore, back: EpisodicStore
) -> None:
    ids = [await _generate(source, index) for index in range(CONVERSATIONS)]
    tenants = ("acme", "globex")
    exported = await _export_all(source, tenants)
    lines = exported.splitlines(keepends=True)
    assert sum(1 for line in lines if '"type":"conversation"' in line) == CONVERSATIONS
    kinds = {orjson.loads(line).get("kind") for line in lines if '"type":"event"' in line}
    assert kinds == {
        "message", "boundary", "run_completed", "retraction", "clear", "usage", "state",
        "deletion",
    }  # fmt: skip
    assert sum(1 for line in lines if '"type":"shared_state"' in line) == 2  # a scope each

    imported = await pg_store.import_conversations(lines)
    by_tenant = sorted(ids[0::2]) + sorted(ids[1::2])  # even indexes are acme's
    assert [c.conversation_id for c in imported.conversations] == by_tenant
    assert await _export_all(pg_store, tenants) == exported  # byte for byte

    again = await back.import_conversations(
        (await _export_all(pg_store, tenants)).splitlines(keepends=True)
    )
    assert len(again.conversations) == CONVERSATIONS
    for conv in ids:
        expected = await _view(source, conv)
        assert await _view(pg_store, conv) == expected
        assert await _view(back, conv) == expected
    assert await _export_all(back, tenants) == exported
    for tenant in tenants:
        scopes = await source.read_state(None, shared=["user:x"], tenant_id=tenant)
        assert (await pg_store.read_state(None, shared=["user:x"], tenant_id=tenant)) == scopes


async def test_an_imported_conversation_takes_appends_and_retries_as_before(
    source: EpisodicStore, pg_store: EpisodicStore
) -> None:
    conv = await source.create_conversation()
    first = await source.append(conv, [Message.user("hi")], idempotency_key="k")
    await pg_store.import_conversation([line async for line in source.export_conversation(conv)])
    # the idempotency key came along: a retry after the move is still a retry
    assert await pg_store.append(conv, [Message.user("hi")], idempotency_key="k") == first
    await pg_store.append(conv, [Message.user("next")])
    assert [e.seq for e in await pg_store.read_events(conv)] == [1, 2]


async def _block(store: EpisodicStore) -> list[str]:
    conv = await store.create_conversation(metadata={"m": 1})
    for turn in range(4):
        await store.append(conv, [Message.user(f"q{turn}"), Message.assistant(f"a{turn}")])
    return [line async for line in store.export_conversation(conv)]


def _damaged(lines: list[str]) -> dict[str, tuple[list[str], int]]:
    """Damaged copies of a block and the line each must be refused at."""
    header = orjson.loads(lines[0])
    events = len(lines) - 1
    wrong_sum = dict(header, checksum="sha256:" + "0" * 64)
    wrong_version = dict(header, version=99)
    edited = orjson.loads(lines[3])
    edited["payload"]["content"] = "rewritten"
    fewer_head = dict(header, head=dict(header["head"], context_tokens=1))
    moved = dict(header, tenant_id="mallory")
    alien = orjson.loads(lines[1])
    alien["payload"]["role"] = "alien"
    huge = dict(orjson.loads(lines[1]), token_estimate=2**63)
    bad_overrides = dict(header, metadata={"compaction": {"trigger_context_tokens": "abc"}})
    return {
        "truncated": (lines[:-2], events),
        "cut mid-line": ([*lines[:-1], lines[-1][: len(lines[-1]) // 2]], events + 1),
        "reordered": ([lines[0], lines[2], lines[1], *lines[3:]], 2),
        "duplicated": ([*lines[:3], lines[2], *lines[3:]], 4),
        "wrong checksum": ([orjson.dumps(wrong_sum).decode() + "\n", *lines[1:]], 1),
        "unknown version": ([orjson.dumps(wrong_version).decode() + "\n", *lines[1:]], 1),
        "edited event": ([*lines[:3], orjson.dumps(edited).decode() + "\n", *lines[4:]], 1),
        "head changed": ([orjson.dumps(fewer_head).decode() + "\n", *lines[1:]], 1),
        "tenant changed": ([orjson.dumps(moved).decode() + "\n", *lines[1:]], 1),
        "unknown role": ([lines[0], orjson.dumps(alien).decode() + "\n", *lines[2:]], 2),
        "huge number": ([lines[0], orjson.dumps(huge).decode() + "\n", *lines[2:]], 2),
        "bad overrides": ([orjson.dumps(bad_overrides).decode() + "\n", *lines[1:]], 1),
        "two conversations": ([*lines, *lines], len(lines) + 1),
        "not json": (["hello\n", *lines], 1),
        "event first": (lines[1:], 1),
        "empty": ([], 1),
    }


@pytest.mark.parametrize("backend_name", ["postgresql", "sqlite"])
async def test_a_damaged_file_is_refused_naming_the_line_and_nothing_is_written(
    source: EpisodicStore,
    pg_store: EpisodicStore,
    back: EpisodicStore,
    backend_name: str,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    lines = await _block(source)
    target = pg_store if backend_name == "postgresql" else back
    url = (
        postgres_url if backend_name == "postgresql" else f"sqlite+aiosqlite:///{tmp_path}/back.db"
    )
    before = await snapshot(url)
    for name, (damaged, line) in _damaged(lines).items():
        with pytest.raises(ImportFormatError) as raised:
            await target.import_conversation(damaged)
        assert raised.value.line == line, (name, str(raised.value))
        assert str(raised.value).startswith(f"line {line}: "), name
        assert await snapshot(url) == before, name
    await target.import_conversation(lines)
    with pytest.raises(ConflictError):
        await target.import_conversation(lines)


async def test_an_erased_id_is_imported_only_when_asked(
    source: EpisodicStore, pg_store: EpisodicStore
) -> None:
    lines = await _block(source)
    imported = await pg_store.import_conversation(lines)
    await pg_store.erase_conversation(imported.conversation_id, reason="test")
    with pytest.raises(ErasedConversationError):
        await pg_store.import_conversation(lines)
    await pg_store.import_conversation(lines, reuse_erased_ids=True)
    assert len(await pg_store.read_events(imported.conversation_id)) == 4 * 2


async def test_import_into_another_tenant(source: EpisodicStore, pg_store: EpisodicStore) -> None:
    lines = await _block(source)
    imported = await pg_store.import_conversation(lines, tenant_id="moved")
    assert imported.tenant_id == "moved"
    head = await pg_store.for_tenant("moved").get_conversation(imported.conversation_id)
    assert head.tenant_id == "moved"


async def test_a_conversation_erased_while_it_is_exported_fails_the_export(
    source: EpisodicStore,
) -> None:
    conv = await source.create_conversation()
    await source.append(conv, [Message.user("one"), Message.assistant("two")])
    lines = source.export_conversation(conv)
    assert '"type":"conversation"' in await anext(lines)
    await source.erase_conversation(conv, reason="meanwhile")
    with pytest.raises(ConflictError, match="erased while it was exported"):
        async for _ in lines:
            pass


@pytest.mark.parametrize("backend_name", ["postgresql", "sqlite"])
async def test_a_reimported_erased_id_is_still_protected_from_a_raw_delete(
    source: EpisodicStore,
    pg_store: EpisodicStore,
    back: EpisodicStore,
    backend_name: str,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    lines = await _block(source)
    target = pg_store if backend_name == "postgresql" else back
    url = (
        postgres_url if backend_name == "postgresql" else f"sqlite+aiosqlite:///{tmp_path}/back.db"
    )
    imported = await target.import_conversation(lines)
    await target.erase_conversation(imported.conversation_id, reason="test")
    await target.import_conversation(lines, reuse_erased_ids=True)  # the same creation time
    before = await snapshot(url)
    with pytest.raises(DBAPIError):
        await execute_raw(url, "DELETE FROM episodic_events")
    assert await snapshot(url) == before
