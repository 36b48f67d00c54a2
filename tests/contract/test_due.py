"""Appends mark a conversation due for compaction, in the same transaction."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episodic import BoundaryRequest, EpisodicStore, Message, Usage, ValidationError
from episodic.policy import EpisodicCompactionConfig
from episodic.store.due import DueState, due_reason
from episodic.store.projection import HeadCounters
from tests.support import asyncpg_dsn
from tests.support_citus import node_port_of, nodes_of


def _with_trigger(store: EpisodicStore, **thresholds: int | None) -> EpisodicStore:
    store.trigger = EpisodicCompactionConfig(**thresholds)  # type: ignore[arg-type]
    return store


async def test_unfinished_turns_make_a_conversation_due(store: EpisodicStore) -> None:
    _with_trigger(store, trigger_unfinished_turns=3)
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("one"), Message.user("two")])
    head = await store.get_conversation(conv)
    assert head.due_since is None
    await store.mark_run_completed(conv)
    await store.append(conv, [Message.user("three"), Message.user("four")])
    assert (await store.get_conversation(conv)).due_since is None
    await store.append(conv, [Message.user("five")])
    head = await store.get_conversation(conv)
    assert head.due_since is not None
    assert head.due_reason == "unfinished_turns"
    assert head.next_attempt_at is not None
    first_due = head.due_since
    await store.append(conv, [Message.user("six")])
    assert (await store.get_conversation(conv)).due_since == first_due  # stays due, once
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="s", covers_through_seq=7, reason="unfinished_turns", expected_boundary_seq=None
        ),
    )
    head = await store.get_conversation(conv)
    assert head.due_since is None
    assert head.boundary_at is not None


async def test_context_pressure_with_a_per_conversation_override(store: EpisodicStore) -> None:
    conv = await store.create_conversation(
        metadata={"compaction": {"trigger_context_tokens": 1000}}
    )
    other = await store.create_conversation()
    for c in (conv, other):
        await store.append(c, [Message.user("hello")], usage=Usage(input_tokens=999))
    assert (await store.get_conversation(conv)).due_reason == "context_pressure"
    assert (await store.get_conversation(other)).due_since is None


@pytest.mark.parametrize(
    "metadata",
    [
        {"compaction": {"trigger_context_tokens": "many"}},
        {"compaction": {"trigger_context_tokens": 1.5}},
        {"compaction": {"no_such_setting": 3}},
        {"compaction": [1, 2]},
    ],
)
async def test_bad_overrides_are_refused(store: EpisodicStore, metadata: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        await store.create_conversation(metadata=metadata)  # type: ignore[arg-type]


async def test_becoming_due_notifies_postgres_listeners(pg_store: EpisodicStore) -> None:
    """On Citus the NOTIFY is sent where the delegated append ran, so every node is heard."""
    _with_trigger(pg_store, trigger_unfinished_turns=1)
    url = pg_store._backend._url.asyncpg  # type: ignore[attr-defined]
    received: asyncio.Queue[str] = asyncio.Queue()
    listeners = [await asyncpg.connect(dsn) for dsn in await nodes_of(url)]
    for listener in listeners:
        await listener.add_listener("episodic_due", lambda *args: received.put_nowait(args[3]))
    try:
        conv = await pg_store.create_conversation()
        await pg_store.append(conv, [Message.user("go")])
        assert await asyncio.wait_for(received.get(), timeout=5) == str(conv)
        await pg_store.append(conv, [Message.user("again")])  # already due: no second wake-up
        # A barrier, not a sleep: notifications arrive in commit order (on each node: so the
        # later conversation is one that lives where conv does), so once a later
        # conversation's wake-up is here, a second one for conv would have come before it.
        later = await pg_store.create_conversation()
        while await node_port_of(url, later) != await node_port_of(url, conv):
            later = await pg_store.create_conversation()
        await pg_store.append(later, [Message.user("go")])
        assert await asyncio.wait_for(received.get(), timeout=5) == str(later)
        assert received.empty()
    finally:
        for listener in listeners:
            await listener.close()


counts = st.integers(0, 80)
thresholds = st.one_of(st.none(), st.integers(0, 60))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    context_tokens=st.integers(0, 2_000),
    usage=st.one_of(st.none(), st.tuples(st.integers(0, 2_000), st.integers(0, 500))),
    unfinished=counts,
    total=counts,
    age_seconds=st.integers(-3_600, 80 * 86_400),
    since_boundary=st.one_of(st.none(), st.integers(0, 40 * 86_400)),
    config=st.builds(
        EpisodicCompactionConfig,
        trigger_context_tokens=st.one_of(st.none(), st.integers(0, 2_000)),
        trigger_unfinished_turns=st.integers(0, 60),
        trigger_age_days=st.integers(0, 60),
        trigger_age_turn_count=st.integers(0, 60),
    ),
    overrides=st.fixed_dictionaries(
        {},
        optional={
            "trigger_context_tokens": thresholds,
            "trigger_unfinished_turns": thresholds,
            "trigger_age_days": thresholds,
            "trigger_age_turn_count": thresholds,
        },
    ),
)
def test_sql_trigger_matches_python_policy(
    postgres_url: str,
    context_tokens: int,
    usage: tuple[int, int] | None,
    unfinished: int,
    total: int,
    age_seconds: int,
    since_boundary: int | None,
    config: EpisodicCompactionConfig,
    overrides: dict[str, int | None],
) -> None:
    """episodic_trigger_reason against its twin, due_reason: the same head (counters, ages,
    metadata overrides), the same thresholds, the same instant, the same answer."""
    now = datetime.now(UTC)
    created_at = now - timedelta(seconds=age_seconds)
    boundary_at = now - timedelta(seconds=since_boundary) if since_boundary is not None else None
    counters = HeadCounters(
        context_tokens=context_tokens,
        usage_input_tokens=usage[0] if usage else None,
        tokens_since_usage=usage[1] if usage else 0,
        user_messages_since_run_completed=unfinished,
        total_user_messages=total,
    )
    metadata: dict[str, object] = {"compaction": overrides} if overrides else {}
    due = DueState(created_at=created_at, boundary_at=boundary_at, metadata=metadata)
    expected = due_reason(counters, due, config, now)
    head = {
        "conversation_id": str(uuid4()),
        "tenant_id": "t",
        "metadata": metadata,
        "created_at": created_at.isoformat(),
        "boundary_at": boundary_at.isoformat() if boundary_at else None,
        **{k: v for k, v in asdict(counters).items() if k != "open_tool_calls"},
    }

    async def in_sql() -> str | None:
        connection = await asyncpg.connect(asyncpg_dsn(postgres_url))
        try:
            reason: str | None = await connection.fetchval(
                "SELECT episodic_trigger_reason("
                "jsonb_populate_record(NULL::episodic_conversations, $1::jsonb), $2::jsonb, $3)",
                orjson.dumps(head).decode(),
                config.model_dump_json(),
                now,
            )
            return reason
        finally:
            await connection.close()

    assert asyncio.run(in_sql()) == (str(expected) if expected is not None else None)
