"""The worker's wake-up: LISTEN on a dedicated connection that comes back when it is lost.

A listener whose connection dropped (the server restarted, a proxy timed out, an operator ran
``pg_terminate_backend``) hears nothing more, and the worker would fall back to polling
without a word. So the connection is watched: when it terminates, it is opened again at once
(then with backoff, up to :data:`MAX_BACKOFF_SECONDS` apart, while the server is away) and the
worker is woken, since whatever became due meanwhile was announced to nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

logger = logging.getLogger(__name__)

#: The longest wait between two attempts to listen again.
MAX_BACKOFF_SECONDS = 2.0
_FIRST_BACKOFF_SECONDS = 0.05


class DueListener:
    """LISTEN ``channel`` and call ``wake`` on every notification, and once after each
    reconnection."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel: str,
        wake: Callable[[], None],
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._wake = wake
        self._connection: asyncpg.Connection | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        #: how many times the connection was opened again (for tests and logs)
        self.reconnections = 0

    async def start(self) -> None:
        """Listen; a database that cannot be reached raises here, as any first connect."""
        await self._listen()

    async def _listen(self) -> None:
        connection = await self._connect()
        try:
            await connection.add_listener(self._channel, self._notified)
        except BaseException:
            connection.terminate()
            raise
        if self._closed:  # closed while this was connecting
            await connection.close()
            return
        connection.add_termination_listener(self._lost)
        self._connection = connection

    def _notified(self, *_: object) -> None:
        self._wake()

    def _lost(self, connection: asyncpg.Connection) -> None:
        if self._closed or connection is not self._connection:
            return
        self._connection = None
        logger.warning("the due listener's connection was lost; listening again")
        self._reconnecting = asyncio.get_running_loop().create_task(self._listen_again())

    async def _listen_again(self) -> None:
        delay = _FIRST_BACKOFF_SECONDS
        while not self._closed:
            try:
                await self._listen()
            except Exception as exc:  # the server is away: try again, less and less often
                logger.warning("cannot listen for due conversations yet (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
                continue
            self.reconnections += 1
            self._wake()  # what became due while nobody listened was announced to nobody
            return

    async def close(self) -> None:
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._connection is not None:
            await self._connection.close()
            self._connection = None


__all__ = ["MAX_BACKOFF_SECONDS", "DueListener"]
