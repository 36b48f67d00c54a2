"""Connections cut under the store: reads and keyed appends recover by themselves; an unkeyed
append surfaces a typed TransientDatabaseError (the store cannot know whether it committed)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from episodic import EpisodicStore, Message, TransientDatabaseError
from tests.support import RoundTripCounter, store_through_proxy


@pytest.fixture
async def cut(postgres_url: str) -> AsyncIterator[tuple[EpisodicStore, RoundTripCounter]]:
    async with store_through_proxy(postgres_url, pool_max_size=2) as proxied:
        yield proxied


async def test_reads_and_keyed_appends_recover_from_a_cut_connection(
    cut: tuple[EpisodicStore, RoundTripCounter],
) -> None:
    store, proxy = cut
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("before")])

    proxy.cut_requests = 1
    ctx = await store.load_context(conv)
    assert [m.text for m in ctx.messages] == ["before"]
    assert proxy.cut_requests == 0  # the cut happened, and the read was retried

    proxy.cut_requests = 1
    [event] = await store.append(conv, [Message.user("keyed")], idempotency_key="k-1")
    assert event.seq == 2
    assert proxy.cut_requests == 0

    proxy.cut_requests = 1
    with pytest.raises(TransientDatabaseError):
        await store.append(conv, [Message.user("unkeyed")])
    # The request never reached the server here, so nothing was written; in general the
    # outcome is unknown, which is why the store did not retry it.
    assert [e.seq for e in await store.read_events(conv)] == [1, 2]


async def test_a_lasting_outage_reaches_the_caller(
    cut: tuple[EpisodicStore, RoundTripCounter],
) -> None:
    store, proxy = cut
    conv = await store.create_conversation()
    proxy.cut_requests = 10
    with pytest.raises(TransientDatabaseError):
        await store.load_context(conv)
    assert proxy.cut_requests == 7  # three attempts, then the error
