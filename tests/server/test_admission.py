"""Overload is an answer: past the in-flight limit a /v1 request waits at most the queue
timeout, then gets 503 problem+json with Retry-After, having written nothing; the admitted
ones finish as usual; the probes and the metrics are never limited; the refusals are
counted."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any
from uuid import UUID

import httpx
import pytest

from episodic import EpisodicStore, Message, StoredEvent
from episodic.server import create_app
from episodic.server.keys import KeyStore

LIMIT = 2
PROBLEM = "application/problem+json"


class Gate:
    """Holds every append inside the store until opened (the slow requests of a test)."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.inside = 0
        self.entered = asyncio.Event()

    def enter(self) -> None:
        self.inside += 1
        self.entered.set()

    async def wait_inside(self, count: int) -> None:
        async with asyncio.timeout(10):
            while self.inside < count:
                self.entered.clear()
                await self.entered.wait()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    held = Gate()
    append = EpisodicStore.append

    async def held_append(
        self: EpisodicStore, conversation_id: UUID | str, messages: Sequence[Message], **kw: Any
    ) -> list[StoredEvent]:
        held.enter()
        await held.opened.wait()
        return await append(self, conversation_id, messages, **kw)

    monkeypatch.setattr(EpisodicStore, "append", held_append)
    return held


async def _client(
    store: EpisodicStore, keys: KeyStore, *, queue_timeout: float
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, keys, max_inflight=LIMIT, queue_timeout=queue_timeout)
    _, secret = await keys.create("acme")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://episodic",
        headers={"Authorization": f"Bearer {secret}"},
    ) as http:
        yield http


@pytest.fixture
async def client(store: EpisodicStore, keys: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """No waiting: a request over the limit is refused at once."""
    async for http in _client(store, keys, queue_timeout=0):
        yield http


async def _conversation(client: httpx.AsyncClient) -> str:
    created = await client.post("/v1/conversations", json={})
    assert created.status_code == 201, created.text
    cid: str = created.json()["conversation"]["conversation_id"]
    return cid


def _append(client: httpx.AsyncClient, cid: str, text: str) -> Any:
    return client.post(
        f"/v1/conversations/{cid}/messages",
        json={"messages": [{"role": "user", "content": text}]},
    )


async def test_requests_over_the_limit_get_503_at_once_and_write_nothing(
    client: httpx.AsyncClient, gate: Gate
) -> None:
    cid = await _conversation(client)
    admitted = [asyncio.create_task(_append(client, cid, f"admitted {i}")) for i in range(LIMIT)]
    await gate.wait_inside(LIMIT)
    # the app is full: the next requests are answered while the admitted ones still wait
    refused = [await _append(client, cid, f"refused {i}") for i in range(3)]
    reading = await client.get(f"/v1/conversations/{cid}/events")
    for answer in [*refused, reading]:
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"] == "1"
        assert answer.headers["content-type"] == PROBLEM
        body = answer.json()
        assert body["type"].endswith("/OverloadedError")
        assert body["status"] == 503
        assert "retry" in body["detail"]
    # never limited: the probe and the metrics
    assert (await client.get("/healthz")).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert "episodic_http_overloaded_total 4.0" in metrics
    assert gate.inside == LIMIT  # a refused append never reached the store
    gate.opened.set()
    assert [(await task).status_code for task in admitted] == [201, 201]
    events = (await client.get(f"/v1/conversations/{cid}/events")).json()["events"]
    assert sorted(e["message"]["content"] for e in events) == ["admitted 0", "admitted 1"]
    # the slots are free again
    assert (await _append(client, cid, "later")).status_code == 201


async def test_a_request_waits_for_a_slot_up_to_the_queue_timeout(
    store: EpisodicStore, keys: KeyStore, gate: Gate
) -> None:
    async for client in _client(store, keys, queue_timeout=5.0):
        cid = await _conversation(client)
        admitted = [asyncio.create_task(_append(client, cid, f"first {i}")) for i in range(LIMIT)]
        await gate.wait_inside(LIMIT)
        waiting = asyncio.create_task(_append(client, cid, "waited"))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # queued for a slot, not refused
        assert gate.inside == LIMIT
        gate.opened.set()
        assert [(await task).status_code for task in admitted] == [201, 201]
        assert (await waiting).status_code == 201


async def test_a_request_that_finds_no_slot_in_time_is_refused(
    store: EpisodicStore, keys: KeyStore, gate: Gate
) -> None:
    async for client in _client(store, keys, queue_timeout=0.05):
        cid = await _conversation(client)
        admitted = [asyncio.create_task(_append(client, cid, f"first {i}")) for i in range(LIMIT)]
        await gate.wait_inside(LIMIT)
        late = await _append(client, cid, "late")
        assert late.status_code == 503
        assert late.headers["retry-after"] == "1"
        gate.opened.set()
        assert [(await task).status_code for task in admitted] == [201, 201]


async def test_an_unknown_route_under_v1_is_limited_like_the_rest(
    client: httpx.AsyncClient, gate: Gate
) -> None:
    cid = await _conversation(client)
    admitted = [asyncio.create_task(_append(client, cid, f"a {i}")) for i in range(LIMIT)]
    await gate.wait_inside(LIMIT)
    assert (await client.get(f"/v1/nothing/{uuid.uuid4()}")).status_code == 503
    gate.opened.set()
    await asyncio.gather(*admitted)
    assert (await client.get(f"/v1/nothing/{uuid.uuid4()}")).status_code == 404
