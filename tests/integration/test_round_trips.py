"""On PostgreSQL an append is one round trip, whatever the size of the batch."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from episodic import EpisodicStore, Message, ToolCall, Usage
from tests.support import RoundTripCounter, store_through_proxy


@pytest.fixture
async def counted(postgres_url: str) -> AsyncIterator[tuple[EpisodicStore, RoundTripCounter]]:
    async with store_through_proxy(postgres_url) as counted_store:
        yield counted_store


def _batch(size: int, start: int) -> list[Message]:
    out: list[Message] = []
    while len(out) < size:
        n = start + len(out)
        out.append(Message.assistant(None, tool_calls=[ToolCall(id=f"c{n}", name="run")]))
        out.append(Message.tool_result(f"c{n}", "x" * 300, name="run"))
    return out[:size] if size % 2 == 0 else [Message.user("go"), *out[: size - 1]]


@pytest.mark.parametrize("size", [1, 2, 10, 200, 1000])
async def test_append_is_one_round_trip(
    counted: tuple[EpisodicStore, RoundTripCounter], size: int
) -> None:
    store, counter = counted
    conv = await store.create_conversation()
    # The first append on a connection prepares the statement; every later one reuses it.
    await store.append(conv, [Message.user("warm up")])
    before = counter.round_trips
    events = await store.append(
        conv, _batch(size, 0), idempotency_key="k", usage=Usage(input_tokens=10)
    )
    assert len(events) == size
    assert counter.round_trips - before == 1


async def test_mark_run_completed_is_one_round_trip(
    counted: tuple[EpisodicStore, RoundTripCounter],
) -> None:
    store, counter = counted
    conv = await store.create_conversation()
    await store.append(conv, [Message.assistant(None, tool_calls=[ToolCall(id="a", name="t")])])
    await store.mark_run_completed(conv)
    await store.append(conv, [Message.assistant(None, tool_calls=[ToolCall(id="b", name="t")])])
    before = counter.round_trips
    completed = await store.mark_run_completed(conv)
    assert completed.abandoned_tool_call_ids == ("b",)
    assert counter.round_trips - before == 1


async def test_a_tenant_scoped_store_keeps_the_request_path_at_one_round_trip(
    counted: tuple[EpisodicStore, RoundTripCounter],
) -> None:
    """for_tenant() sets the tenant for row-level security inside each statement: no
    SET, BEGIN or COMMIT of its own."""
    store, counter = counted
    acme = store.for_tenant("acme")
    conv = await acme.create_conversation()
    await acme.append(conv, [Message.user("warm up")])
    await acme.load_context(conv)
    await acme.load_stored_context(conv)
    await acme.mark_run_completed(conv)
    for call in (
        lambda: acme.append(conv, [Message.user("next")]),
        lambda: acme.load_context(conv),
        lambda: acme.load_stored_context(conv),
        lambda: acme.mark_run_completed(conv),
        lambda: acme.get_conversation(conv),
    ):
        before = counter.round_trips
        await call()
        assert counter.round_trips - before == 1
