"""Issue 19's acceptance over HTTP: two tenants' keys, and every route that takes a
conversation refuses the other tenant's (0 leaks); bad input of every kind is a
problem+json 4xx that leaves the store exactly as it was."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from episodic import EpisodicStore
from episodic.server import create_app
from episodic.server.keys import KeyStore
from episodic.server.operations import ManualCompaction
from episodic.summarizers import ExtractiveSummarizer
from episodic.worker import CompactionOptions

PROBLEM = "application/problem+json"
SECRET = "the launch code is 0000"


async def snapshot(store: EpisodicStore) -> list[dict[str, Any]]:
    """Every conversation of every tenant, with its counters and its whole log."""
    conversations = await store.list_conversations(limit=1_000)
    return [
        {
            "head": c.model_dump(mode="json"),
            "log": [
                e.model_dump(mode="json")
                for e in await store.for_tenant(c.tenant_id).read_events(
                    c.conversation_id, limit=1_000
                )
            ],
        }
        for c in conversations
    ]


@pytest.fixture
async def http(store: EpisodicStore, keys: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """The app as `episodic serve` makes it by default (8 MiB bodies), with "compact now"."""
    compaction = ManualCompaction(ExtractiveSummarizer(), CompactionOptions(), 60.0)
    app = create_app(store, keys, compaction=compaction)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as client:
        yield client


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def _conversation(http: httpx.AsyncClient, secret: str) -> str:
    created = await http.post("/v1/conversations", json={}, headers=_bearer(secret))
    cid: str = created.json()["conversation"]["conversation_id"]
    appended = await http.post(
        f"/v1/conversations/{cid}/messages",
        json={"messages": [{"role": "user", "content": SECRET}]},
        headers=_bearer(secret),
    )
    assert appended.status_code == 201, appended.text
    return cid


#: one request for each route that takes a conversation id, by route name
CONVERSATION_ROUTES: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "get_conversation": ("GET", "", None),
    "append": ("POST", "/messages", {"messages": [{"role": "user", "content": "x"}]}),
    "read_events": ("GET", "/events", None),
    "load_context": ("GET", "/context", None),
    "search": ("GET", "/search?q=launch+code", None),
    "mark_run_completed": ("POST", "/run-completed", None),
    "unpin": ("POST", "/unpin", {"seq": 1}),
    "export_conversation": ("GET", "/export", None),
    "erase_conversation": ("POST", "/erase", {"reason": "not yours"}),
    "compact_now": ("POST", "/compact", None),
    "retract_last": ("POST", "/retract-last", None),
    "clear": ("POST", "/clear", None),
    "view": ("GET", "/view", None),
}


async def test_every_conversation_route_refuses_another_tenant(
    http: httpx.AsyncClient, keys: KeyStore, store: EpisodicStore
) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    taking_an_id = {
        operation["operationId"]
        for path, item in paths.items()
        if "{conversation_id}" in path
        for operation in item.values()
    }
    # a new route that takes a conversation must join the matrix
    assert taking_an_id == set(CONVERSATION_ROUTES)
    _, acme = await keys.create("acme")
    _, globex = await keys.create("globex")
    _, globex_operator = await keys.create("globex", operator=True)
    cid = await _conversation(http, acme)
    before = await snapshot(store)
    requests = leaks = 0
    for name, (method, suffix, body) in CONVERSATION_ROUTES.items():
        for secret in (globex, globex_operator):
            response = await http.request(
                method,
                f"/v1/conversations/{cid}{suffix}",
                headers=_bearer(secret),
                **({"json": body} if body is not None else {}),
            )
            requests += 1
            # a tenant key is refused operator routes first (403): neither says it exists
            expected = {404, 403} if secret == globex else {404}
            assert response.status_code in expected, (name, secret == globex, response.text)
            assert response.headers["content-type"] == PROBLEM
            # the id is the caller's own input; the content and the owner are not theirs
            leaks += SECRET in response.text or "acme" in response.text
    for secret in (globex, globex_operator):
        listed = await http.get("/v1/conversations", headers=_bearer(secret))
        assert listed.status_code == 200
        leaks += len(listed.json()["items"]) + (SECRET in listed.text)
    assert leaks == 0
    assert requests == 2 * len(CONVERSATION_ROUTES)
    assert await snapshot(store) == before
    mine = await http.get(f"/v1/conversations/{cid}/context", headers=_bearer(acme))
    assert SECRET in mine.text
    found = await http.get(f"/v1/conversations/{cid}/search?q=launch+code", headers=_bearer(acme))
    assert SECRET in found.text


async def test_bad_input_is_a_problem_and_changes_nothing(
    http: httpx.AsyncClient, keys: KeyStore, store: EpisodicStore
) -> None:
    _, acme = await keys.create("acme")
    cid = await _conversation(http, acme)
    messages = f"/v1/conversations/{cid}/messages"
    one = {"messages": [{"role": "user", "content": "again"}]}
    ten_mb = json.dumps({"messages": [{"role": "user", "content": "x" * 10_000_000}]})
    cases: list[tuple[str, str, str, dict[str, Any], int, str | None]] = [
        ("a 10 MB body", "POST", messages, {"content": ten_mb.encode()}, 413, None),
        ("malformed JSON", "POST", messages, {"content": b'{"messages": ['}, 422,
         "ValidationError"),
        ("a wrong content type", "POST", messages,
         {"content": json.dumps(one).encode(), "headers": {"Content-Type": "text/plain"}},
         415, "UnsupportedMediaTypeError"),
        ("form data", "POST", "/v1/conversations", {"data": {"metadata": "x"}}, 415,
         "UnsupportedMediaTypeError"),
        ("an erasure in plain text", "POST", f"/v1/conversations/{cid}/erase",
         {"content": b'{"reason": "x"}', "headers": {"Content-Type": "text/plain"}}, 415,
         "UnsupportedMediaTypeError"),
        ("a taken id, with If-Match", "POST", "/v1/conversations",
         {"json": {"conversation_id": cid}, "headers": {"If-Match": '"1"'}}, 409,
         "ConflictError"),
        ("a huge page of events", "GET", f"/v1/conversations/{cid}/events",
         {"params": {"limit": 10**9}}, 422, "ValidationError"),
        ("a huge page of conversations", "GET", "/v1/conversations",
         {"params": {"limit": 10**9}}, 422, "ValidationError"),
        ("a non-UUID id", "GET", "/v1/conversations/12345", {}, 422, "ValidationError"),
        ("a non-UUID id, appending", "POST", "/v1/conversations/nope/messages",
         {"json": one}, 422, "ValidationError"),
        ("a stale If-Match", "POST", messages, {"json": one, "headers": {"If-Match": '"0"'}},
         412, "ConflictError"),
        ("an If-Match that is no ETag", "POST", messages,
         {"json": one, "headers": {"If-Match": "yesterday"}}, 422, "ValidationError"),
    ]  # fmt: skip
    before = await snapshot(store)
    for what, method, path, kwargs, status, kind in cases:
        headers = {"Content-Type": "application/json", **_bearer(acme)}
        headers.update(kwargs.pop("headers", {}))
        if "data" in kwargs:
            headers.pop("Content-Type")
        response = await http.request(method, path, headers=headers, **kwargs)
        assert response.status_code == status, (what, response.text[:300])
        assert response.headers["content-type"] == PROBLEM, what
        problem = response.json()
        assert problem["status"] == status, what
        assert problem["detail"], what
        if kind is not None:
            assert problem["type"] == f"https://episodic.dev/errors/{kind}", what
        assert await snapshot(store) == before, what
