"""The Claude Agent SDK's SessionStore over HTTP (``/v1/claude-agent``): the Python
``EpisodicSessionStore`` behind each route, so an HTTP client and the Python store see one
store; the caller's own summary kept apart and written only at the seq it was folded at."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from episodic import EpisodicStore
from episodic.integrations.claude_agent import EpisodicSessionStore, key_conversation_id
from episodic.server import create_app
from episodic.server.keys import KeyStore

KEY = {"project_key": "/repo", "session_id": "s-1"}
QUERY = {"project_key": "/repo", "session_id": "s-1"}


def _entry(uid: str, text: str, kind: str = "user") -> dict[str, object]:
    return {"type": kind, "uuid": uid, "message": {"role": kind, "content": text}}


@pytest.fixture
async def http(store: EpisodicStore, keys: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, keys, max_body_bytes=1 << 20)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as client:
        _, secret = await keys.create("acme")
        client.headers["Authorization"] = f"Bearer {secret}"
        yield client


async def test_append_load_dedupe_and_list(http: httpx.AsyncClient, store: EpisodicStore) -> None:
    empty = await http.get("/v1/claude-agent/summary", params=QUERY)
    assert empty.json() == {"summary": None, "at_seq": None}
    assert (await http.get("/v1/claude-agent/entries", params=QUERY)).json() == {"entries": None}
    first = [_entry("u1", "fix the refund job"), _entry("a1", "on it", "assistant")]
    written = await http.post(
        "/v1/claude-agent/entries",
        json={"key": KEY, "entries": first, "summary": {"sessionId": "s-1", "data": {"n": 1}}},
    )
    assert written.status_code == 204, written.text
    # a retried batch: its entries are already there, nothing is stored twice
    again = [*first, {"type": "custom-title", "customTitle": "Refunds"}]
    folded = await http.get("/v1/claude-agent/summary", params=QUERY)
    at_seq = folded.json()["at_seq"]
    assert folded.json()["summary"]["data"] == {"n": 1}
    assert folded.json()["summary"]["mtime"] > 0
    resent = await http.post(
        "/v1/claude-agent/entries",
        json={"key": KEY, "entries": again, "summary": {"data": {"n": 2}}, "at_seq": at_seq},
    )
    assert resent.status_code == 204, resent.text
    loaded = (await http.get("/v1/claude-agent/entries", params=QUERY)).json()["entries"]
    assert loaded == again
    # the Python store sees the same entries under the same key
    python = EpisodicSessionStore(store.for_tenant("acme"))
    assert await python.load(KEY) == again  # type: ignore[arg-type]
    assert key_conversation_id(KEY, "acme")  # type: ignore[arg-type]

    sub = {**KEY, "subpath": "subagents/agent-1"}
    await http.post("/v1/claude-agent/entries", json={"key": sub, "entries": [_entry("x", "sub")]})
    sessions = (await http.get("/v1/claude-agent/sessions", params={"project_key": "/repo"})).json()
    assert [s["session_id"] for s in sessions["sessions"]] == ["s-1"]
    summaries = await http.get("/v1/claude-agent/summaries", params={"project_key": "/repo"})
    assert [s["data"] for s in summaries.json()["summaries"]] == [{"n": 2}]
    subkeys = await http.get("/v1/claude-agent/subkeys", params=QUERY)
    assert subkeys.json() == {"subkeys": ["subagents/agent-1"]}


async def test_a_summary_folded_at_a_stale_seq_is_refused(http: httpx.AsyncClient) -> None:
    await http.post("/v1/claude-agent/entries", json={"key": KEY, "entries": [_entry("u1", "a")]})
    stale = (await http.get("/v1/claude-agent/summary", params=QUERY)).json()["at_seq"]
    await http.post(
        "/v1/claude-agent/entries",
        json={"key": KEY, "entries": [_entry("u2", "b")], "summary": {}, "at_seq": stale},
    )
    raced = await http.post(
        "/v1/claude-agent/entries",
        json={"key": KEY, "entries": [_entry("u3", "c")], "summary": {}, "at_seq": stale},
    )
    assert raced.status_code == 412, raced.text
    assert raced.json()["type"].endswith("/ConflictError")
    loaded = (await http.get("/v1/claude-agent/entries", params=QUERY)).json()["entries"]
    assert [e["uuid"] for e in loaded] == ["u1", "u2"]  # the refused batch wrote nothing


async def test_delete_is_an_erasure_for_operator_keys(
    http: httpx.AsyncClient, keys: KeyStore
) -> None:
    await http.post("/v1/claude-agent/entries", json={"key": KEY, "entries": [_entry("u", "x")]})
    sub = {**KEY, "subpath": "subagents/a"}
    await http.post("/v1/claude-agent/entries", json={"key": sub, "entries": [_entry("v", "y")]})
    refused = await http.post("/v1/claude-agent/delete", json={"key": KEY})
    assert refused.status_code == 403
    assert refused.json()["type"].endswith("/OperatorRequiredError")
    _, operator = await keys.create("acme", operator=True)
    deleted = await http.post(
        "/v1/claude-agent/delete",
        json={"key": KEY},
        headers={"Authorization": f"Bearer {operator}"},
    )
    assert deleted.status_code == 204, deleted.text
    for key in (QUERY, {**QUERY, "subpath": "subagents/a"}):
        assert (await http.get("/v1/claude-agent/entries", params=key)).json() == {"entries": None}


async def test_another_tenant_sees_nothing_and_bad_keys_are_problems(
    http: httpx.AsyncClient, keys: KeyStore
) -> None:
    await http.post("/v1/claude-agent/entries", json={"key": KEY, "entries": [_entry("u", "x")]})
    _, globex = await keys.create("globex")
    other = {"Authorization": f"Bearer {globex}"}
    seen = await http.get("/v1/claude-agent/entries", params=QUERY, headers=other)
    assert seen.json() == {"entries": None}
    listed = await http.get(
        "/v1/claude-agent/sessions", params={"project_key": "/repo"}, headers=other
    )
    assert listed.json() == {"sessions": []}
    for body in (
        {"key": {**KEY, "subpath": ""}, "entries": []},
        {"key": KEY, "entries": [{"no": "type"}]},
    ):
        bad = await http.post("/v1/claude-agent/entries", json=body)
        assert bad.status_code == 422, bad.text
        assert bad.headers["content-type"].startswith("application/problem+json")


async def test_long_keys_list_their_subpaths(http: httpx.AsyncClient) -> None:
    """A session's subpaths are listed under a name made of both key parts; past the
    listing's length (escaped JSON of long non-ASCII parts) it is their digest."""
    key = {"project_key": "é" * 400, "session_id": "ü" * 400}
    sub = {**key, "subpath": "subagents/agent-1"}
    written = await http.post(
        "/v1/claude-agent/entries", json={"key": sub, "entries": [_entry("s", "x")]}
    )
    assert written.status_code == 204, written.text
    listed = await http.get("/v1/claude-agent/subkeys", params=key)
    assert listed.json() == {"subkeys": ["subagents/agent-1"]}
