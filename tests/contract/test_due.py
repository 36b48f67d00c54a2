"""Appends mark a conversation due for compaction, in the same transaction."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from episodic import EpisodicStore, Message, Usage, ValidationError
from episodic.policy import (
    EpisodicCompactionConfig,
    EpisodicCompactionPressure,
    episodic_compaction_trigger,
)


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
        summary="s",
        covers_through_seq=7,
        reason="unfinished_turns",
        expected_boundary_seq=None,
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
    _with_trigger(pg_store, trigger_unfinished_turns=1)
    url = pg_store._backend._url.asyncpg  # type: ignore[attr-defined]
    listener = await asyncpg.connect(url)
    received: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("episodic_due", lambda *args: received.put_nowait(args[3]))
    try:
        conv = await pg_store.create_conversation()
        await pg_store.append(conv, [Message.user("go")])
        assert await asyncio.wait_for(received.get(), timeout=5) == str(conv)
        await pg_store.append(conv, [Message.user("again")])  # already due: no second wake-up
        # A barrier, not a sleep: notifications arrive in commit order, so once a later
        # conversation's wake-up is here, a second one for conv would have come before it.
        later = await pg_store.create_conversation()
        await pg_store.append(later, [Message.user("go")])
        assert await asyncio.wait_for(received.get(), timeout=5) == str(later)
        assert received.empty()
    finally:
        await listener.close()


thresholds = st.one_of(st.none(), st.integers(0, 60))
counts = st.integers(0, 80)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    estimate=st.one_of(st.none(), st.integers(0, 2_000)),
    unfinished=counts,
    age=counts,
    total=counts,
    trigger_tokens=st.one_of(st.none(), st.integers(0, 2_000)),
    trigger_turns=st.integers(0, 60),
    trigger_age=st.integers(0, 60),
    trigger_age_turns=st.integers(0, 60),
)
def test_sql_trigger_matches_python_policy(
    postgres_url: str,
    estimate: int | None,
    unfinished: int,
    age: int,
    total: int,
    trigger_tokens: int | None,
    trigger_turns: int,
    trigger_age: int,
    trigger_age_turns: int,
) -> None:
    pressure = EpisodicCompactionPressure(
        estimated_context_tokens=estimate,
        user_messages_after_latest_run_completed=unfinished,
        conversation_age_days=age,
        total_user_messages=total,
    )
    config = EpisodicCompactionConfig(
        trigger_context_tokens=trigger_tokens,
        trigger_unfinished_turns=trigger_turns,
        trigger_age_days=trigger_age,
        trigger_age_turn_count=trigger_age_turns,
    )
    expected = episodic_compaction_trigger(pressure, config)

    async def in_sql() -> str | None:
        dsn = make_url(postgres_url).set(drivername="postgresql")
        connection = await asyncpg.connect(dsn.render_as_string(hide_password=False))
        try:
            reason: str | None = await connection.fetchval(
                "SELECT episodic_trigger_reason($1, $2, $3, $4, $5, $6, $7, $8)",
                estimate,
                unfinished,
                age,
                total,
                trigger_tokens,
                trigger_turns,
                trigger_age,
                trigger_age_turns,
            )
            return reason
        finally:
            await connection.close()

    assert asyncio.run(in_sql()) == (str(expected) if expected is not None else None)
