"""Helpers shared by the tests: database snapshots and a PostgreSQL protocol-counting proxy."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import struct
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import orjson
import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from episodic.context import Context
from episodic.models import MessageEvent, StoredEvent
from episodic.settings import EpisodicSettings
from episodic.store import EpisodicStore
from episodic.store.engine import sqlalchemy_url
from episodic.store.projection import counters_of
from episodic.store.schema import metadata
from episodic.store.stored_context import StoredContext

__all__ = [
    "INSTALL_LINE",
    "RoundTripCounter",
    "asyncpg_dsn",
    "counters_of",
    "execute_raw",
    "require_extra",
    "sent_after_cut",
    "snapshot",
    "store_through_proxy",
    "url_through",
]

TABLES = (
    "episodic_conversations",
    "episodic_events",
    "episodic_compaction_attempts",
    "episodic_shared_state",
    "episodic_erasures",
)

#: What README tells a new user to install; every optional package the suite needs is in it.
INSTALL_LINE = 'pip install -e ".[dev]"'
#: Set by .ci/run, which installs everything: there a missing extra fails the run instead of
#: skipping tests. Read at import, before the tests' environment is scrubbed.
REQUIRE_EXTRAS = os.environ.get("EPISODIC_TEST_REQUIRE_EXTRAS") == "1"


#: A tool-sized text (about 250 tokens): what a compaction exists to shrink. A conversation
#: of a few short lines is smaller than any handoff, and the worker rightly writes no boundary
#: for it (the context would grow); tests of the worker's other duties put this in theirs.
FILE_LISTING = "\n".join(
    f"-rw-r--r--  1 agent  staff  {n * 1013 % 9000:>5}  reports/quarter_{n:02}.csv"
    for n in range(20)
)


def require_extra(module: str, extra: str) -> ModuleType:
    """Import ``module``, which the ``episodic-store[extra]`` extra installs; when it is missing,
    skip the calling test (or module) saying how to install it, or fail the run where CI
    requires every extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f"needs {module} (episodic-store[{extra}]): {INSTALL_LINE} installs it"
        if REQUIRE_EXTRAS:
            pytest.fail(f"{message}; EPISODIC_TEST_REQUIRE_EXTRAS=1 ({exc})", pytrace=False)
        pytest.skip(message, allow_module_level=True)


def url_through(url: str, port: int) -> str:
    """``url`` pointed at a local proxy on ``port``, unencrypted so the proxy can read the
    protocol."""
    parsed = make_url(url).set(host="127.0.0.1", port=port)
    return parsed.update_query_dict({"sslmode": "disable"}).render_as_string(hide_password=False)


def asyncpg_dsn(url: str) -> str:
    """``postgresql+asyncpg://...`` as a DSN asyncpg accepts."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class LoggedExceptions(logging.Handler):
    """The messages logged at ``level`` or above, and the exceptions logged with them: what
    a worker or a listener met (they log and go on instead of raising)."""

    def __init__(self, level: int = logging.ERROR) -> None:
        super().__init__(level)
        self.exceptions: list[BaseException] = []
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            self.exceptions.append(record.exc_info[1])


class TerminalSummary:
    """Prints a run's counts in pytest's terminal summary under ``title`` (plain ``python -m
    pytest`` shows it, passed or failed): register it with
    ``request.config.pluginmanager.register``."""

    def __init__(self, title: str, lines: list[str]) -> None:
        self.title = title
        self.lines = lines

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("-", self.title)
        for line in self.lines:
            terminalreporter.write_line(line)


def assert_stored_context_is(stored: StoredContext, context: Context) -> None:
    """``stored`` (``load_stored_context``) is ``context`` (``load_context``) of the same
    conversation: the same figures, and its spliced JSON parses to the models' dump without
    nulls, which is what a server answers in episodic's format."""
    assert (
        stored.conversation_id,
        stored.estimated_tokens,
        stored.last_seq,
        stored.boundary_seq,
    ) == (context.conversation_id, context.estimated_tokens, context.last_seq, context.boundary_seq)
    dumped = [m.model_dump(mode="json", exclude_none=True) for m in context.messages]
    assert orjson.loads(stored.messages_json()) == dumped


def sent_after_cut(events: Sequence[StoredEvent], covers: int) -> Counter[int]:
    """The seqs of the stored messages ``load_context`` sends after the cut, each once: not
    system messages, nor assistant turns with neither text nor calls (kept in the log only)."""
    return Counter(
        e.seq
        for e in events
        if isinstance(e, MessageEvent)
        and e.seq > covers
        and e.message.role != "system"
        and not (
            e.message.role == "assistant"
            and not e.message.tool_calls
            and not e.message.text.strip()
        )
    )


async def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every episodic table, ordered: equal snapshots mean nothing changed."""
    engine = create_async_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            out: dict[str, list[tuple[Any, ...]]] = {}
            for name in TABLES:
                table = metadata.tables[name]
                rows = await conn.execute(select(table).order_by(*table.primary_key.columns))
                out[name] = [tuple(row) for row in rows]
            return out
    finally:
        await engine.dispose()


async def execute_raw(url: str, sql: str) -> None:
    """Run one statement outside the store, as an operator would."""
    engine = create_async_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


@dataclass
class RoundTripCounter:
    """A TCP proxy in front of PostgreSQL that counts the client's synchronisation points.

    Each Sync ('S') or simple Query ('Q') message from the client ends a request the client
    then waits on: their count is the number of round trips. Needs an unencrypted connection
    (``sslmode=disable``) to read the protocol.
    """

    target_host: str
    target_port: int
    round_trips: int = 0
    messages: list[bytes] = field(default_factory=list)
    #: when above zero, the next requests are not forwarded: the connection is cut instead,
    #: as a network fault or a crashed server would
    cut_requests: int = 0
    _server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def url_through(self, url: str, port: int) -> str:
        return url_through(url, port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            self.target_host, self.target_port
        )
        session = self._new_session()
        await asyncio.gather(
            self._client_to_server(session, reader, upstream_writer),
            self._server_to_client(session, upstream_reader, writer),
            return_exceptions=True,
        )

    def _new_session(self) -> Any:
        """Per-connection state for a subclass's hooks."""
        return None

    def _client_message(self, session: Any, kind: bytes, body: bytes) -> None:
        """Called with each message from the client after the startup packet, before it
        is forwarded (a subclass reads the protocol here)."""

    async def _server_to_client(
        self, session: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self._pipe(reader, writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def _client_to_server(
        self, session: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            # The startup packet has no type byte: a length, then the body.
            (length,) = struct.unpack("!I", await reader.readexactly(4))
            writer.write(struct.pack("!I", length) + await reader.readexactly(length - 4))
            while True:
                kind = await reader.readexactly(1)
                (length,) = struct.unpack("!I", await reader.readexactly(4))
                body = await reader.readexactly(length - 4)
                self.messages.append(kind)
                if kind in (b"S", b"Q") and self.cut_requests > 0:
                    self.cut_requests -= 1
                    return
                self._client_message(session, kind, body)
                if kind in (b"S", b"Q"):
                    self.round_trips += 1
                writer.write(kind + struct.pack("!I", length) + body)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()


@asynccontextmanager
async def store_through_proxy(
    postgres_url: str, *, pool_max_size: int = 1
) -> AsyncIterator[tuple[EpisodicStore, RoundTripCounter]]:
    """A store whose every connection goes through a :class:`RoundTripCounter`."""
    target = make_url(postgres_url)
    proxy = RoundTripCounter(target.host or "127.0.0.1", target.port or 5432)
    port = await proxy.start()
    settings = EpisodicSettings(_env_file=None, pool_min_size=1, pool_max_size=pool_max_size)
    store = await EpisodicStore.open(proxy.url_through(postgres_url, port), settings=settings)
    try:
        yield store, proxy
    finally:
        await store.close()
        await proxy.stop()
