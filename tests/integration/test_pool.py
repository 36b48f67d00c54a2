"""The request path's connection pool on a real PostgreSQL: bounded, fair to waiters, and it
never hands out a connection that a cancelled or interrupted call may have left dirty."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from episodic.store.postgres.pool import Pool, PoolClosedError
from tests.support import asyncpg_dsn

PID = "SELECT pg_backend_pid()"


class Counting:
    """A connect function that counts the connections it opened."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.opened = 0

    async def __call__(self) -> asyncpg.Connection:
        self.opened += 1
        return await asyncpg.connect(self.dsn)


@pytest.fixture
async def connect(postgres_url: str) -> Counting:
    return Counting(asyncpg_dsn(postgres_url))


@pytest.fixture
async def pool(connect: Counting) -> AsyncIterator[Pool]:
    opened = await Pool.open(connect, min_size=1, max_size=2)
    try:
        yield opened
    finally:
        await opened.close()


async def test_many_callers_share_at_most_max_size_connections(
    pool: Pool, connect: Counting
) -> None:
    pids = await asyncio.gather(*(pool.fetchval("SELECT pg_backend_pid() FROM pg_sleep(0.01)")
                                  for _ in range(40)))  # fmt: skip
    assert len(set(pids)) <= 2
    assert connect.opened == 2


async def test_an_idle_connection_is_reused(pool: Pool, connect: Counting) -> None:
    first = await pool.fetchval(PID)
    assert [await pool.fetchval(PID) for _ in range(5)] == [first] * 5
    assert connect.opened == 1


async def test_a_server_error_keeps_the_connection(pool: Pool) -> None:
    pid = await pool.fetchval(PID)
    with pytest.raises(asyncpg.DivisionByZeroError):
        await pool.fetchval("SELECT 1 / 0")
    assert await pool.fetchval(PID) == pid


async def test_a_cancelled_call_never_hands_its_connection_on(pool: Pool) -> None:
    pid = await pool.fetchval(PID)
    call = asyncio.ensure_future(pool.fetchval("SELECT pg_sleep(30)"))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The cancelled call's connection was terminated, not given back mid-cancellation.
    assert await pool.fetchval(PID) != pid
    assert await pool.fetchval("SELECT 41 + 1") == 42


async def test_a_terminated_backend_is_replaced(pool: Pool, postgres_url: str) -> None:
    pid = await pool.fetchval(PID)
    admin = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    await asyncio.sleep(0.2)
    # Closed while idle (the server's goodbye was read): not handed out, so no call fails.
    assert await pool.fetchval(PID) != pid


async def test_a_connection_that_finds_a_read_only_server_is_dropped(pool: Pool) -> None:
    """A standby now (a failover demoted its server): the next connection is a new one,
    which a multi-host URL opens on the writable host."""
    async with pool.acquire() as connection:
        pid = await connection.fetchval(PID)
        await connection.execute("SET default_transaction_read_only = on")
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        await pool.fetchval("CREATE TABLE episodic_read_only_probe (x int)")
    assert await pool.fetchval(PID) != pid


async def test_a_transaction_left_open_is_not_given_back(pool: Pool) -> None:
    async with pool.acquire() as connection:
        pid = await connection.fetchval(PID)
        await connection.execute("BEGIN")
    assert await pool.fetchval(PID) != pid


async def test_a_cancelled_waiter_does_not_leak_a_connection(
    connect: Counting,
) -> None:
    pool = await Pool.open(connect, min_size=1, max_size=1)
    try:
        lease = pool.acquire()
        held = await lease.__aenter__()
        waiting = asyncio.ensure_future(pool.fetchval(PID))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await lease.__aexit__(None, None, None)
        # The only connection is idle again and serves the next caller.
        assert await pool.fetchval(PID) == await held.fetchval(PID)
        assert connect.opened == 1
    finally:
        await pool.close()


async def test_waiters_are_served_in_turn(connect: Counting) -> None:
    pool = await Pool.open(connect, min_size=0, max_size=1)
    order: list[int] = []

    async def call(i: int) -> None:
        await pool.fetchval("SELECT pg_sleep(0.01)")
        order.append(i)

    try:
        await asyncio.gather(*(call(i) for i in range(8)))
        assert sorted(order) == list(range(8))
        assert connect.opened == 1
    finally:
        await pool.close()


async def test_close_refuses_new_calls_and_ends_waiters(connect: Counting) -> None:
    pool = await Pool.open(connect, min_size=1, max_size=1)
    lease = pool.acquire()
    held = await lease.__aenter__()
    waiting = asyncio.ensure_future(pool.fetchval(PID))
    await asyncio.sleep(0.05)
    await pool.close()
    with pytest.raises(PoolClosedError):
        await waiting
    with pytest.raises(PoolClosedError):
        await pool.fetchval(PID)
    await lease.__aexit__(None, None, None)
    assert held.is_closed()  # the busy connection was closed when given back
