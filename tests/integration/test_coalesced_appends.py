"""Appends in flight at once go together in one call (episodic/store/postgres/coalesce.py),
on a real PostgreSQL: every append lands once, with its own outcome; a refusal or an error
stays with the append at fault; a call held up by a lock does not hold up the others; heads
are locked in conversation id order.

One call of ``episodic_append_many`` is one transaction, so the appends it carried share
``now()``: their events' ``created_at`` is what shows, from the database, that they went
together.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

import asyncpg
import orjson
import pytest

from episodic import EpisodicStore, Message
from episodic.errors import ConflictError, IntegrityViolationError, LockTimeoutError
from episodic.policy import EpisodicCompactionConfig
from episodic.settings import EpisodicSettings
from episodic.store.postgres.backend import trigger_document
from tests.support import asyncpg_dsn

#: From episodic/store/postgres/coalesce.py's defaults: the longest an append waits for a call slot.
MAX_WAIT = 0.005


async def _open(url: str, **settings: object) -> EpisodicStore:
    return await EpisodicStore.open(url, settings=EpisodicSettings(_env_file=None, **settings))


@pytest.fixture
async def one_call(postgres_url: str) -> AsyncIterator[EpisodicStore]:
    """One append call at a time: every append made while it runs waits and goes together."""
    store = await _open(postgres_url, append_calls=1, pool_max_size=4)
    try:
        yield store
    finally:
        await store.close()


async def _conversations(store: EpisodicStore, n: int) -> list[UUID]:
    return [await store.create_conversation(tenant_id="t") for _ in range(n)]


async def _calls(db: asyncpg.Connection) -> int:
    """How many transactions wrote the events: one per call."""
    return int(await db.fetchval("SELECT count(DISTINCT created_at) FROM episodic_events"))


async def test_appends_in_flight_go_together_and_each_lands_once(
    one_call: EpisodicStore, db: asyncpg.Connection
) -> None:
    convs = await _conversations(one_call, 8)

    async def writer(conv: UUID) -> list[int]:
        seqs = []
        for i in range(25):
            stored = await one_call.append(conv, [Message.user(f"{conv} {i}")])
            seqs.append(stored[0].seq)
        return seqs

    results = await asyncio.gather(*(writer(c) for c in convs))
    assert results == [list(range(1, 26))] * 8
    for conv in convs:
        events = await one_call.read_events(conv)
        assert [e.message.text for e in events] == [f"{conv} {i}" for i in range(25)]
        head = await one_call.get_conversation(conv)
        assert (head.last_seq, head.total_user_messages) == (25, 25)
    calls = await _calls(db)
    assert calls < 200 / 2, f"{calls} calls for 200 appends: they did not go together"


async def test_appends_to_one_conversation_keep_their_order_in_a_call(
    one_call: EpisodicStore,
) -> None:
    (conv,) = await _conversations(one_call, 1)
    results = await asyncio.gather(
        *(one_call.append(conv, [Message.user(str(i)), Message.user(f"{i}b")]) for i in range(20))
    )
    seqs = [[e.seq for e in stored] for stored in results]
    assert sorted(s for pair in seqs for s in pair) == list(range(1, 41))
    events = await one_call.read_events(conv)
    by_seq = {e.seq: e.message.text for e in events}
    for i, (first, second) in enumerate(seqs):
        assert (by_seq[first], by_seq[second]) == (str(i), f"{i}b")
        assert second == first + 1  # a batch is never split or interleaved


async def test_a_refusal_refuses_that_append_alone(
    one_call: EpisodicStore, db: asyncpg.Connection
) -> None:
    convs = await _conversations(one_call, 6)
    missing = uuid.uuid4()
    results = await asyncio.gather(
        *(one_call.append(c, [Message.user("x")]) for c in convs[:3]),
        one_call.append(convs[3], [Message.user("late")], expected_seq=7),
        one_call.append(missing, [Message.user("nowhere")]),
        one_call.append(convs[4], [Message.tool_result("never-made", "orphan")]),
        *(one_call.append(c, [Message.user("y")]) for c in convs[:3]),
        return_exceptions=True,
    )
    assert [type(r).__name__ for r in results] == [
        *(["list"] * 3),
        "ConflictError",
        "NotFoundError",
        "OrphanToolResultError",
        *(["list"] * 3),
    ]
    assert isinstance(results[3], ConflictError)
    assert results[3].actual_seq == 0
    heads = "SELECT last_seq FROM episodic_conversations WHERE conversation_id = $1"
    assert [await db.fetchval(heads, c) for c in convs] == [2, 2, 2, 0, 0, 0]


async def test_an_error_in_one_append_rolls_back_only_its_call_and_the_rest_land(
    one_call: EpisodicStore, db: asyncpg.Connection
) -> None:
    # A row the database itself refuses (here a trigger; in life, say, a constraint added by
    # the operator): the whole call rolls back, then each append is sent alone.
    await db.execute("""
        CREATE FUNCTION test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.payload LIKE '%poison%' THEN
                RAISE EXCEPTION 'poisoned payload' USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER test_refuse_poison BEFORE INSERT ON episodic_events
            FOR EACH ROW EXECUTE FUNCTION test_refuse_poison();
    """)
    convs = await _conversations(one_call, 8)
    # The first append holds the one call slot while the others gather behind it.
    results = await asyncio.gather(
        *(one_call.append(c, [Message.user("poison" if i == 4 else "fine")])
          for i, c in enumerate(convs)),
        return_exceptions=True,
    )  # fmt: skip
    assert [isinstance(r, IntegrityViolationError) for r in results] == [i == 4 for i in range(8)]
    texts = await db.fetch("SELECT conversation_id, payload FROM episodic_events")
    assert sorted(row["conversation_id"] for row in texts) == sorted(
        c for i, c in enumerate(convs) if i != 4
    )
    assert all("fine" in row["payload"] for row in texts)


async def test_a_cancelled_waiting_append_is_never_written(
    postgres_url: str, db: asyncpg.Connection
) -> None:
    store = await _open(postgres_url, append_calls=1, pool_max_size=2)
    try:
        held, other = await _conversations(store, 2)
        async with _head_locked(postgres_url, held):
            blocked = asyncio.ensure_future(store.append(held, [Message.user("blocked")]))
            await asyncio.sleep(0.05)
            waiting = asyncio.ensure_future(store.append(other, [Message.user("cancelled")]))
            await asyncio.sleep(0)  # queued behind the one call slot, not yet sent
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        await blocked
        await asyncio.sleep(MAX_WAIT * 4)
        assert (await store.get_conversation(other)).last_seq == 0
        assert await db.fetchval("SELECT count(*) FROM episodic_events") == 1
    finally:
        await store.close()


async def test_a_call_held_by_a_lock_does_not_hold_up_the_others(postgres_url: str) -> None:
    store = await _open(postgres_url, append_calls=1, pool_max_size=4, lock_timeout_ms=2_000)
    try:
        held, free = await _conversations(store, 2)
        async with _head_locked(postgres_url, held):
            blocked = asyncio.ensure_future(store.append(held, [Message.user("waits")]))
            await asyncio.sleep(0.05)
            started = asyncio.get_running_loop().time()
            stored = await asyncio.wait_for(store.append(free, [Message.user("goes")]), 1.0)
            waited = asyncio.get_running_loop().time() - started
            assert stored[0].seq == 1
            assert not blocked.done()
        assert (await blocked)[0].seq == 1
        # Sent once it had waited MAX_WAIT for the slot, not when the lock was released.
        assert waited < 0.5
    finally:
        await store.close()


async def test_a_lock_timeout_fails_only_the_append_that_waited(postgres_url: str) -> None:
    store = await _open(postgres_url, append_calls=1, pool_max_size=4, lock_timeout_ms=300)
    try:
        convs = await _conversations(store, 5)
        async with _head_locked(postgres_url, convs[2]):
            results = await asyncio.gather(
                *(store.append(c, [Message.user("m")]) for c in convs), return_exceptions=True
            )
        assert [isinstance(r, LockTimeoutError) for r in results] == [i == 2 for i in range(5)]
        assert [(await store.get_conversation(c)).last_seq for c in convs] == [1, 1, 0, 1, 1]
    finally:
        await store.close()


async def test_heads_are_locked_in_conversation_id_order(postgres_url: str) -> None:
    """A call that waits for one head has not locked the heads after it in id order, so two
    calls that share conversations wait for each other at most, never in a cycle."""
    store = await _open(postgres_url)
    try:
        low, high = sorted(await _conversations(store, 2))
    finally:
        await store.close()
    dsn = asyncpg_dsn(postgres_url)
    caller = await asyncpg.connect(dsn)
    probe = await asyncpg.connect(dsn)
    try:
        async with _head_locked(postgres_url, low):
            # high first in the call, low second: locked in id order, the call waits on low
            # before it touches high.
            call = asyncio.ensure_future(caller.fetch(
                "SELECT * FROM episodic_append_many($1, $2)",
                [_request(high), _request(low)],
                orjson.dumps(trigger_document(EpisodicCompactionConfig())).decode(),
            ))  # fmt: skip
            await asyncio.sleep(0.2)
            assert not call.done()
            async with probe.transaction():
                locked = await probe.fetchval(
                    "SELECT conversation_id FROM episodic_conversations "
                    "WHERE conversation_id = $1 FOR UPDATE NOWAIT",
                    high,
                )
            assert locked == high
        rows = await call
        assert sorted((row["o_index"], row["o_outcome"], row["o_seq"]) for row in rows) == [
            (1, "appended", 1),
            (2, "appended", 1),
        ]
    finally:
        await caller.close()
        await probe.close()


def _request(conv: UUID) -> tuple[object, ...]:
    """An episodic_append_request of one user message."""
    payload = '{"role":"user","content":"m"}'
    return (conv, None, None, None, [payload], [1], None, None, None, 1, 1, None, None, None, None)


@asynccontextmanager
async def _head_locked(url: str, conv: UUID) -> AsyncIterator[None]:
    """A second session holding a conversation's head row locked for the block."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        async with conn.transaction():
            await conn.execute(
                "SELECT 1 FROM episodic_conversations WHERE conversation_id = $1 FOR UPDATE", conv
            )
            yield
    finally:
        await conn.close()
