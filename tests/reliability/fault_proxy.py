"""A TCP proxy in front of PostgreSQL that cuts connections at a chosen byte.

Used by the T3 battery test (idempotency under an unknown outcome). It forwards every
connection made to it (on 127.0.0.1) to the real server and reads the PostgreSQL wire protocol
in both directions, message by message, so that a fault can be placed precisely:

* ``arm_bytes("c2s", n)`` / ``arm_bytes("s2c", n)``: after ``n`` more bytes have passed in that
  direction (counted from the moment of arming, across reconnects), forward only up to that
  byte and cut the connection, both sides. A cut in the server-to-client direction in the
  middle of the reply to an append lands *after* the server committed and *before* the client
  read the result: the unknown outcome.
* ``arm_after_sync()``: forward the client's next synchronisation point (Sync or simple
  Query) in full, then cut at once, before any reply: the server runs and commits the
  statement, the client never hears of it ("during COMMIT").

Faults queue up (``arm_*`` appends to the queue, ``arm_sequence`` a list): the first fires,
then the next is armed at once, so a run of faults can meet a client's retries. The proxy
counts what it did, and classifies each server-to-client cut: ``post_commit_cuts`` counts the
cuts that fell inside a reply that already carried a result row (``DataRow``) whose
``ReadyForQuery`` the client had not yet received in full. PostgreSQL flushes an implicit
transaction's reply only after the commit at Sync, so those cuts are all "committed, result
lost" (a cut in the reply before its first DataRow went through is not counted, although the
server had committed then too: the count is a lower bound).

The connection must be unencrypted (``sslmode=disable``, which :meth:`FaultProxy.url_through`
adds) to read the protocol. No third-party code: asyncio streams only.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from tests.support import url_through

Direction = Literal["c2s", "s2c"]

#: client messages after which the client waits for the server (one round trip each)
SYNC_KINDS = (b"S", b"Q")


@dataclass
class _Plan:
    kind: Literal["bytes", "after_sync"]
    direction: Direction
    remaining: int = 0


@dataclass
class _Link:
    """One proxied connection: the two sockets and the state of the current reply."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    cut: bool = False
    #: a DataRow was forwarded (fully or in part) in the reply now in flight
    reply_has_row: bool = False


@dataclass
class FaultProxy:
    """An asyncio TCP proxy that can cut a PostgreSQL connection at a random byte."""

    target_host: str
    target_port: int
    connections: int = 0
    cuts: dict[str, int] = field(default_factory=lambda: {"c2s": 0, "s2c": 0, "after_sync": 0})
    #: server-to-client cuts inside a reply that already carried a result row: committed,
    #: but the client never read the result
    post_commit_cuts: int = 0
    #: bytes forwarded in each direction since the proxy started
    forwarded: dict[str, int] = field(default_factory=lambda: {"c2s": 0, "s2c": 0})
    _queue: deque[_Plan] = field(default_factory=deque)
    _server: asyncio.Server | None = None
    _links: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._links):
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    url_through = staticmethod(url_through)

    # ---- faults ---------------------------------------------------------------------------

    @staticmethod
    def bytes_fault(direction: Direction, after: int) -> _Plan:
        """A cut once ``after`` more bytes have gone ``direction`` (0: before the next byte)."""
        return _Plan("bytes", direction, max(0, after))

    @staticmethod
    def after_sync_fault() -> _Plan:
        """A cut right after the client's next Sync/Query reached the server."""
        return _Plan("after_sync", "c2s")

    def arm_bytes(self, direction: Direction, after: int) -> None:
        self._queue.append(self.bytes_fault(direction, after))

    def arm_after_sync(self) -> None:
        self._queue.append(self.after_sync_fault())

    def arm_sequence(self, plans: list[_Plan]) -> None:
        self._queue.extend(plans)

    def disarm(self) -> int:
        """Drop the faults that have not fired; returns how many there were."""
        left = len(self._queue)
        self._queue.clear()
        return left

    @property
    def armed(self) -> int:
        return len(self._queue)

    @property
    def _plan(self) -> _Plan | None:
        return self._queue[0] if self._queue else None

    def _fired(self) -> None:
        self._queue.popleft()

    # ---- forwarding -----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                writer.close()
                return
            self.connections += 1
            link = _Link(client=writer, server=up_writer)
            await asyncio.gather(
                self._client_to_server(reader, link),
                self._server_to_client(up_reader, link),
                return_exceptions=True,
            )
        finally:
            self._links.discard(task)

    def _cut(self, link: _Link) -> None:
        link.cut = True
        for side in (link.client, link.server):
            side.close()

    async def _send(self, link: _Link, direction: Direction, data: bytes) -> bool:
        """Forward ``data`` one way, applying an armed byte fault; False once cut."""
        if link.cut:
            return False
        out = link.server if direction == "c2s" else link.client
        plan = self._plan
        if plan is not None and plan.kind == "bytes" and plan.direction == direction:
            if plan.remaining < len(data):
                head = data[: plan.remaining]
                self._fired()
                if head:
                    out.write(head)
                    self.forwarded[direction] += len(head)
                    with contextlib.suppress(Exception):
                        await out.drain()
                self.cuts[direction] += 1
                if direction == "s2c" and link.reply_has_row:
                    self.post_commit_cuts += 1
                self._cut(link)
                return False
            plan.remaining -= len(data)
        out.write(data)
        self.forwarded[direction] += len(data)
        await out.drain()
        return True

    async def _client_to_server(self, reader: asyncio.StreamReader, link: _Link) -> None:
        try:
            # The startup packet (or a CancelRequest) has no type byte: a length, then a body.
            (length,) = struct.unpack("!I", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            if not await self._send(link, "c2s", struct.pack("!I", length) + body):
                return
            while True:
                kind = await reader.readexactly(1)
                (length,) = struct.unpack("!I", await reader.readexactly(4))
                body = await reader.readexactly(length - 4)
                if not await self._send(link, "c2s", kind + struct.pack("!I", length) + body):
                    return
                plan = self._plan
                if kind in SYNC_KINDS and plan is not None and plan.kind == "after_sync":
                    self._fired()
                    self.cuts["after_sync"] += 1
                    self._cut(link)
                    return
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if not link.cut:
                link.server.close()

    async def _server_to_client(self, reader: asyncio.StreamReader, link: _Link) -> None:
        try:
            while True:
                kind = await reader.readexactly(1)
                (length,) = struct.unpack("!I", await reader.readexactly(4))
                body = await reader.readexactly(length - 4)
                if kind == b"D":
                    link.reply_has_row = True
                if not await self._send(link, "s2c", kind + struct.pack("!I", length) + body):
                    return
                if kind == b"Z":
                    link.reply_has_row = False
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if not link.cut:
                link.client.close()


__all__ = ["FaultProxy"]
