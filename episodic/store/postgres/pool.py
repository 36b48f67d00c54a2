"""The PostgreSQL backend's connection pool: what the request path pays per call is the
query, not the pool.

asyncpg's own pool shields every release in a new task and resets the connection under a
timeout: about 100 µs of client CPU per call on this machine, as much as the query itself
(``python -m bench.profile``). Here taking an idle connection and giving it back are plain
method calls, with no await and no task: a call waits only when every connection is busy.

A connection is given back only when it is known to be clean: the call finished, or failed
with an error the server reported outside a transaction. Anything else (a cancelled call whose
cancellation may still be in flight, a dead socket, an open transaction) terminates it; a new
one is opened when needed, so a broken connection is never handed out twice.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import asyncpg

Connect = Callable[[], Awaitable[asyncpg.Connection]]


class PoolClosedError(RuntimeError):
    """The pool was closed; no connection is handed out any more."""


class Pool:
    """At most ``max_size`` connections made by ``connect``, ``min_size`` of them opened up
    front and kept."""

    def __init__(self, connect: Connect, *, min_size: int, max_size: int) -> None:
        self._connect = connect
        self._min_size = min_size
        self._max_size = max_size
        self._idle: deque[asyncpg.Connection] = deque()
        #: tasks waiting for a connection; resolved with one, or with None: "open one yourself"
        self._waiters: deque[asyncio.Future[asyncpg.Connection | None]] = deque()
        #: connections open, in use or being opened
        self._size = 0
        self._closed = False

    @classmethod
    async def open(cls, connect: Connect, *, min_size: int, max_size: int) -> Pool:
        pool = cls(connect, min_size=min_size, max_size=max_size)
        try:
            for _ in range(min_size):
                pool._size += 1
                try:
                    pool._idle.append(await connect())
                except BaseException:
                    pool._size -= 1
                    raise
        except BaseException:
            await pool.close()
            raise
        return pool

    # ---- handing connections out ---------------------------------------------------------

    async def _take(self) -> asyncpg.Connection:
        if self._closed:
            raise PoolClosedError("the connection pool is closed")
        while self._idle:
            connection = self._idle.pop()  # the most recently used: its caches are warm
            if not connection.is_closed():
                return connection
            # The server closed it while it was idle (a restart, a failover, a terminated
            # backend): a call on it could only fail, so its slot opens a new one.
            self._discard(connection)
        if self._size < self._max_size:
            return await self._open_one()
        waiter: asyncio.Future[asyncpg.Connection | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiters.append(waiter)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Handed a connection (or a slot) just as the wait was cancelled.
                self._put_back_slot(waiter.result())
            raise
        return handed if handed is not None else await self._open_one()

    async def _open_one(self) -> asyncpg.Connection:
        self._size += 1
        try:
            return await self._connect()
        except BaseException:
            self._size -= 1
            self._wake_one_to_open()
            raise

    def _give_back(self, connection: asyncpg.Connection, error: BaseException | None) -> None:
        """Return ``connection`` after a call that ended with ``error`` (None: it finished)."""
        if self._closed or not _clean(connection, error):
            self._discard(connection)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append(connection)

    def _put_back_slot(self, connection: asyncpg.Connection | None) -> None:
        if connection is None:
            self._wake_one_to_open()
        else:
            self._give_back(connection, None)

    def _discard(self, connection: asyncpg.Connection) -> None:
        connection.terminate()
        self._size -= 1
        self._wake_one_to_open()

    def _wake_one_to_open(self) -> None:
        """A slot is free: the first waiter opens a connection in it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # ---- the calls ---------------------------------------------------------------------

    def acquire(self) -> Lease:
        """``async with pool.acquire() as connection:`` for several statements."""
        return Lease(self)

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        connection = await self._take()
        try:
            rows: list[Any] = await connection.fetch(query, *args)
        except BaseException as error:
            self._give_back(connection, error)
            raise
        self._give_back(connection, None)
        return rows

    async def fetchrow(self, query: str, *args: Any) -> Any:
        connection = await self._take()
        try:
            row = await connection.fetchrow(query, *args)
        except BaseException as error:
            self._give_back(connection, error)
            raise
        self._give_back(connection, None)
        return row

    async def fetchval(self, query: str, *args: Any) -> Any:
        connection = await self._take()
        try:
            value = await connection.fetchval(query, *args)
        except BaseException as error:
            self._give_back(connection, error)
            raise
        self._give_back(connection, None)
        return value

    async def close(self) -> None:
        """Close the idle connections now; busy ones are terminated when given back, and
        tasks waiting for one get :class:`PoolClosedError`."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosedError("the connection pool was closed"))
        idle, self._idle = list(self._idle), deque()
        self._size -= len(idle)
        await asyncio.gather(*(c.close() for c in idle), return_exceptions=True)


class Lease:
    """One connection for the length of an ``async with`` block."""

    __slots__ = ("_connection", "_pool")

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._connection: asyncpg.Connection | None = None

    async def __aenter__(self) -> asyncpg.Connection:
        self._connection = await self._pool._take()
        return self._connection

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool._give_back(connection, exc)


def _clean(connection: asyncpg.Connection, error: BaseException | None) -> bool:
    """Whether ``connection`` may serve the next call: open, outside a transaction, and the
    last call finished or was refused by the server (a cancelled or interrupted call may
    leave a cancellation in flight or a reply half read)."""
    if connection.is_closed() or connection.is_in_transaction():
        return False
    if isinstance(error, asyncpg.ReadOnlySQLTransactionError):
        return False  # a standby now: the next connection finds the writable host
    return error is None or isinstance(error, asyncpg.PostgresError)


__all__ = ["Lease", "Pool", "PoolClosedError"]
