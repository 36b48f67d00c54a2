"""A URL naming several hosts (a primary and its standbys) on a real PostgreSQL: each host is
tried in turn with the whole connect timeout (libpq's semantics), so a host that is down or
silent does not keep episodic from the one that answers."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.engine import make_url

from episodic import DatabaseUnavailableError, EpisodicStore, Message
from episodic.settings import EpisodicSettings
from tests.support_cluster import free_port

TIMEOUT = 1.0


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A port that accepts connections and never answers (a frozen server, a black hole)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in held:
            writer.close()


def _with_hosts(url: str, *ports: int) -> str:
    parsed = make_url(url)
    hosts = ",".join(f"127.0.0.1:{port}" for port in (*ports, parsed.port or 5432))
    return f"postgresql+asyncpg://{parsed.username}@{hosts}/{parsed.database}"


async def _appends_through(url: str) -> float:
    started = time.monotonic()
    settings = EpisodicSettings(_env_file=None, connect_timeout_seconds=TIMEOUT)
    store = await EpisodicStore.open(url, settings=settings)
    try:
        conv = await store.create_conversation()
        (stored,) = await store.append(conv, [Message.user("hello")])
        assert stored.seq == 1
    finally:
        await store.close()
    return time.monotonic() - started


async def test_a_silent_first_host_costs_one_timeout_then_the_next_answers(
    postgres_url: str, silent_port: int
) -> None:
    took = await _appends_through(_with_hosts(postgres_url, silent_port))
    # asyncpg's own timeout spans every host: the silent one would use it all up.
    assert TIMEOUT <= took < TIMEOUT * 5


async def test_a_refusing_first_host_is_passed_over_at_once(postgres_url: str) -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        took = await _appends_through(_with_hosts(postgres_url, closed.getsockname()[1]))
    assert took < TIMEOUT


async def test_no_host_answering_is_one_error_that_names_a_failover(
    postgres_url: str, silent_port: int
) -> None:
    parsed = make_url(postgres_url)
    url = (
        f"postgresql+asyncpg://{parsed.username}@127.0.0.1:{silent_port},"
        f"127.0.0.1:{free_port()}/{parsed.database}"
    )
    with pytest.raises(DatabaseUnavailableError, match="until a standby is promoted") as error:
        await EpisodicStore.open(
            url, settings=EpisodicSettings(_env_file=None, connect_timeout_seconds=TIMEOUT)
        )
    assert f"127.0.0.1:{silent_port},127.0.0.1:" in str(error.value)
