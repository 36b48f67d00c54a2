"""An append in each format a context is served in (``?format=`` or the body's ``format``):
OpenAI's chat completions, OpenAI's Responses items, Anthropic's turns, and episodic's own.
What a context gives in a format appends back to another conversation as the same context;
bad input in a format is a problem naming its field; Idempotency-Key and If-Match act the
same in every format; and the published schema states each role's rules, so what it accepts
is taken and what it refuses is refused."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]  # schemathesis installs it
import pytest

from episodic import EpisodicStore
from episodic.server import create_app
from episodic.server.keys import KeyStore

PROBLEM = "application/problem+json"
FORMATS = ("episodic", "openai", "responses", "anthropic")
#: a message's fields the store sets: another conversation's differ
STORE_SET = ("seq", "created_at", "token_estimate")
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
#: the assistant message of the issue, in OpenAI's chat format
CHAT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "run", "arguments": '{"cmd": "pytest"}'},
        }
    ],
}
CHAT_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "E1234: column missing"}


@pytest.fixture
async def client(store: EpisodicStore, keys: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """The API with tenant acme's key."""
    _, secret = await keys.create("acme")
    transport = httpx.ASGITransport(app=create_app(store, keys))
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://episodic",
        headers={"Authorization": f"Bearer {secret}"},
    ) as http:
        yield http


async def _conversation(http: httpx.AsyncClient) -> str:
    created = await http.post("/v1/conversations", json={})
    assert created.status_code == 201, created.text
    cid: str = created.json()["conversation"]["conversation_id"]
    return cid


async def _log(http: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = (await http.get(f"/v1/conversations/{cid}/events")).json()[
        "events"
    ]
    return events


async def _context(http: httpx.AsyncClient, cid: str, fmt: str) -> list[Any]:
    loaded = await http.get(f"/v1/conversations/{cid}/context", params={"format": fmt})
    assert loaded.status_code == 200, loaded.text
    messages: list[Any] = loaded.json()["messages"]
    if fmt == "episodic":
        return [{k: v for k, v in m.items() if k not in STORE_SET} for m in messages]
    return messages


#: a conversation with what each format has to carry: text and image blocks, parallel calls
#: (one with an id Anthropic refuses, one failed), results, a reply, and a call left open
SOURCE = [
    {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image", "url": PNG}]},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "functions.run:0", "name": "run", "args": {"cmd": "ls"}},
            {"id": "call_b", "name": "read", "args": {"path": "a.txt"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_b", "content": "hello", "is_error": True},
    {"role": "tool", "tool_call_id": "functions.run:0", "content": "a.txt"},
    {"role": "user", "content": "and now?"},
    {"role": "assistant", "content": "Done.", "reasoning": "it is done"},
    {"role": "assistant", "tool_calls": [{"id": "call_c", "name": "run", "args": {}}]},
]


async def test_the_issue_an_openai_assistant_message_is_taken(client: httpx.AsyncClient) -> None:
    cid = await _conversation(client)
    url = f"/v1/conversations/{cid}/messages"
    refused = await client.post(url, json={"messages": [CHAT_CALL]})  # episodic's format
    assert refused.status_code == 422
    by_query = await client.post(f"{url}?format=openai", json={"messages": [CHAT_CALL]})
    assert by_query.status_code == 201, by_query.text
    by_body = await client.post(url, json={"format": "openai", "messages": [CHAT_RESULT]})
    assert by_body.status_code == 201, by_body.text
    stored = [event["message"] for event in await _log(client, cid)]
    assert stored[0]["tool_calls"] == [
        {
            "id": "call_1",
            "name": "run",
            "args": {"cmd": "pytest"},
            "arguments_json": '{"cmd": "pytest"}',  # as sent: not compact JSON
        }
    ]
    assert (stored[1]["tool_call_id"], stored[1]["name"]) == ("call_1", None)
    assert await _context(client, cid, "openai") == [CHAT_CALL, CHAT_RESULT]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_context_appends_back_as_the_same_context(
    client: httpx.AsyncClient, fmt: str
) -> None:
    source = await _conversation(client)
    appended = await client.post(f"/v1/conversations/{source}/messages", json={"messages": SOURCE})
    assert appended.status_code == 201, appended.text
    given = (await client.get(f"/v1/conversations/{source}/context?format={fmt}")).json()
    copy = await _conversation(client)
    posted = await client.post(
        f"/v1/conversations/{copy}/messages",
        params={"format": fmt},
        json={"messages": given["messages"]},
    )
    assert posted.status_code == 201, posted.text
    assert await _context(client, copy, fmt) == await _context(client, source, fmt)
    # the context's body itself, with its format, is a body too
    again = await _conversation(client)
    body = {"format": given["format"], "messages": given["messages"]}
    assert (await client.post(f"/v1/conversations/{again}/messages", json=body)).status_code == 201
    assert await _context(client, again, fmt) == await _context(client, source, fmt)


#: bad input in each format, and the pointer of the part its problem names
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("episodic", {"role": "tool", "content": "x"}, "/body/messages/0/tool_call_id"),
    ("episodic", {"role": "user", "content": "x", "tool_calls": [{}]},
     "/body/messages/0/tool_calls"),
    ("openai", {"role": "tool", "content": "x"}, "/body/messages/0/tool_call_id"),
    ("openai", {"role": "assistant", "tool_calls": [{"id": "a", "function": {}}]},
     "/body/messages/0/tool_calls/0/function/name"),
    ("openai", {"role": "system", "content": [{"type": "text", "text": "x"}]},
     "/body/messages/0/content"),
    ("responses", {"type": "function_call", "name": "run", "arguments": "{}"},
     "/body/messages/0/call_id"),
    ("responses", {"type": "function_call_output", "call_id": "a"}, "/body/messages/0/output"),
    ("anthropic", {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "x",
                                                "input": {}}]}, "/body/messages/0/content/0"),
    ("anthropic", {"role": "assistant", "content": [{"type": "tool_use", "id": "a.b",
                                                     "name": "x", "input": {}}]},
     "/body/messages/0/content/0/id"),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "message", "pointer"), BAD)
async def test_bad_input_in_a_format_is_a_problem_naming_its_field(
    client: httpx.AsyncClient, fmt: str, message: dict[str, Any], pointer: str
) -> None:
    cid = await _conversation(client)
    before = await _log(client, cid)
    answer = await client.post(
        f"/v1/conversations/{cid}/messages?format={fmt}", json={"messages": [message]}
    )
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == PROBLEM
    problem = answer.json()
    assert problem["type"] == "https://episodic.dev/errors/ValidationError"
    assert pointer in [error["pointer"] for error in problem["errors"]], problem
    assert await _log(client, cid) == before


#: one batch, the same messages in every format
SAME_BATCH: dict[str, list[dict[str, Any]]] = {
    "episodic": [
        {"role": "assistant", "tool_calls": [{"id": "call_1", "name": "run", "args": {"n": 1}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "run", "content": "ok"},
    ],
    "openai": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "run",
                                                               "arguments": '{"n":1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ],
    "anthropic": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "run",
                                           "input": {"n": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": "ok"}]},
    ],
}  # fmt: skip


async def test_an_idempotency_key_replays_the_same_messages_in_any_format(
    client: httpx.AsyncClient,
) -> None:
    cid = await _conversation(client)
    url = f"/v1/conversations/{cid}/messages"
    key = {"Idempotency-Key": "turn-1"}
    first = await client.post(url, json={"messages": SAME_BATCH["episodic"]}, headers=key)
    assert first.status_code == 201, first.text
    for fmt in ("openai", "anthropic", "episodic"):
        again = await client.post(f"{url}?format={fmt}", json={"messages": SAME_BATCH[fmt]},
                                  headers=key)  # fmt: skip
        assert again.status_code == 201, (fmt, again.text)
        assert again.json() == first.json(), fmt  # the first result, nothing appended
    # the same key and other messages, in a format, are a mismatch: the converted batches
    # are compared, not the bodies
    other = [*SAME_BATCH["openai"][:1], {**SAME_BATCH["openai"][1], "content": "not ok"}]
    mismatch = await client.post(f"{url}?format=openai", json={"messages": other}, headers=key)
    assert mismatch.status_code == 422
    assert mismatch.json()["type"].endswith("/IdempotencyMismatchError")
    assert [event["seq"] for event in await _log(client, cid)] == [1, 2]


@pytest.mark.parametrize("fmt", ["openai", "responses", "anthropic"])
async def test_if_match_is_the_expected_seq_in_every_format(
    client: httpx.AsyncClient, fmt: str
) -> None:
    cid = await _conversation(client)
    url = f"/v1/conversations/{cid}/messages?format={fmt}"
    user = {"role": "user", "content": "hi"}
    if fmt == "responses":
        user = {"type": "message", **user}
    ok = await client.post(url, json={"messages": [user]}, headers={"If-Match": '"0"'})
    assert ok.status_code == 201, ok.text
    assert ok.headers["etag"] == '"1"'
    stale = await client.post(url, json={"messages": [user]}, headers={"If-Match": '"0"'})
    assert stale.status_code == 412
    assert stale.json()["type"].endswith("/ConflictError")
    assert [event["seq"] for event in await _log(client, cid)] == [1]


async def test_the_query_and_the_body_name_one_format(client: httpx.AsyncClient) -> None:
    cid = await _conversation(client)
    url = f"/v1/conversations/{cid}/messages"
    user = [{"role": "user", "content": "hi"}]
    both = await client.post(f"{url}?format=openai", json={"format": "anthropic", "messages": user})
    assert both.status_code == 422
    assert both.json()["field"] == "format"
    unknown = await client.post(f"{url}?format=gemini", json={"messages": user})
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["pointer"] == "/query/format"
    in_body = await client.post(url, json={"format": "gemini", "messages": user})
    assert in_body.status_code == 422
    assert await _log(client, cid) == []


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("episodic", {"role": "assistant", "tool_calls": [
            {"id": "a", "name": "x"}, {"id": "a", "name": "y"}]}),
        ("openai", {"role": "assistant", "tool_calls": [
            {"id": "a", "function": {"name": "x"}}, {"id": "a", "function": {"name": "y"}}]}),
        ("anthropic", {"role": "assistant", "content": [
            {"type": "tool_use", "id": "a", "name": "x", "input": {}},
            {"type": "tool_use", "id": "a", "name": "y", "input": {}}]}),
    ],
)  # fmt: skip
async def test_a_call_id_twice_in_one_message_is_a_duplicate(
    client: httpx.AsyncClient, fmt: str, message: dict[str, Any]
) -> None:
    cid = await _conversation(client)
    answer = await client.post(
        f"/v1/conversations/{cid}/messages?format={fmt}", json={"messages": [message]}
    )
    assert answer.status_code == 422
    assert answer.json()["type"].endswith("/DuplicateToolCallError")
    assert await _log(client, cid) == []


async def test_the_schema_states_each_role_s_rules(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    append = document["paths"]["/v1/conversations/{conversation_id}/messages"]["post"]
    assert append["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AppendRequest"
    }
    assert {s["$ref"].rsplit("/", 1)[-1] for s in schemas["AppendRequest"]["oneOf"]} == {
        "AppendBatch", "OpenAIAppendBatch", "ResponsesAppendBatch", "AnthropicAppendBatch"
    }  # fmt: skip
    assert schemas["NewMessage"]["discriminator"]["propertyName"] == "role"
    assert {"role", "tool_call_id", "content"} <= set(schemas["NewToolMessage"]["required"])
    assert "tool_call_id" not in schemas["NewUserMessage"]["properties"]
    assert schemas["NewUserMessage"]["properties"]["tool_calls"]["maxItems"] == 0
    assert schemas["ChatMessage"]["discriminator"]["mapping"]["developer"].endswith(
        "/ChatSystemMessage"
    )


#: bodies the schema alone decides (no state: no result, no call left open)
DECIDED_BY_THE_SCHEMA: list[dict[str, Any]] = [
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "tool", "tool_call_id": "a"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": "x", "is_error": True}]},
    {"messages": [{"role": "user", "content": "x", "tool_call_id": "a"}]},
    {"messages": [{"role": "user", "content": "x", "tool_call_id": None}]},
    {"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}]},
    {"messages": [{"role": "system", "content": "be brief"}]},
    {"messages": [{"role": "user", "content": [{"url": PNG}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "url": PNG}]}]},
    {"messages": [{"role": "assistant", "tool_calls": [{"id": "a\x00", "name": "x"}]}]},
    {"messages": [{"role": "assistant", "content": "x", "seq": 4, "token_estimate": 2.0}]},
    {"messages": [{"role": "user", "content": "x"}], "usage": {"input_tokens": True}},
    {"messages": [{"role": "user", "content": "x"}], "usage": {"input_tokens": 12.0}},
    {"messages": [{"role": "wizard", "content": "x"}]},
    {"format": "openai", "messages": [{"role": "developer", "content": "x"}]},
    {"format": "openai", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": PNG, "detail": 5}}]}]},
    {"format": "openai", "messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]},
    {"format": "responses", "messages": [{"role": "user", "content": "x"}]},
    {"format": "responses", "messages": [{"type": "web_search_call", "id": "ws", "n": 2**70}]},
    {"format": "responses", "messages": [{"type": "message", "content": "x"}]},
    {"format": "anthropic", "messages": [{"role": "user", "content": []}]},
    {"format": "anthropic", "messages": [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": "s"},
        {"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "hi"}]}]},
    {"format": "anthropic", "messages": [{"role": "user", "content": [{"type": "document"}]}]},
]  # fmt: skip


@pytest.mark.parametrize("body", DECIDED_BY_THE_SCHEMA)
async def test_what_the_schema_accepts_is_taken_and_what_it_refuses_is_refused(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    document = (await client.get("/openapi.json")).json()
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/AppendRequest", "components": document["components"]}
    )
    cid = await _conversation(client)
    answer = await client.post(f"/v1/conversations/{cid}/messages", json=body)
    assert validator.is_valid(body) is (answer.status_code == 201), answer.text


async def test_numbers_beyond_64_bits_are_kept_as_floats(client: httpx.AsyncClient) -> None:
    """The store writes no integer beyond 64 bits; JSON promises no more, and JavaScript
    reads such a number as the nearest float: so does the API, in messages and metadata."""
    created = await client.post("/v1/conversations", json={"metadata": {"n": 2**70}})
    assert created.status_code == 201, created.text
    assert created.json()["conversation"]["metadata"] == {"n": float(2**70)}
    cid = created.json()["conversation"]["conversation_id"]
    message = {"role": "user", "content": "x", "metadata": {"n": 2**70, "m": 2**64 - 1}}
    appended = await client.post(f"/v1/conversations/{cid}/messages", json={"messages": [message]})
    assert appended.status_code == 201, appended.text
    assert appended.json()["events"][0]["message"]["metadata"] == {
        "n": float(2**70), "m": 2**64 - 1
    }  # fmt: skip


async def test_conversation_metadata_is_a_document(client: httpx.AsyncClient) -> None:
    """A NUL in it, which no document holds, is refused where it is, before the database;
    its compaction overrides are checked as the schema says."""
    for metadata, pointer in (
        ({"a": {"b": ["x\x00"]}}, "/body/metadata/a"),
        ({"a\x00": 1}, "/body/metadata"),
        ({"compaction": {"trigger_age_days": -1}}, "/body/metadata/compaction/trigger_age_days"),
        ({"compaction": {"window": 1}}, "/body/metadata/compaction/window"),
    ):
        answer = await client.post("/v1/conversations", json={"metadata": metadata})
        assert answer.status_code == 422, (metadata, answer.text)
        assert answer.json()["errors"][0]["pointer"] == pointer
    kept = {"compaction": {"trigger_age_days": 3.0}, "team": "search"}
    created = await client.post("/v1/conversations", json={"metadata": kept})
    assert created.status_code == 201, created.text
    assert created.json()["conversation"]["metadata"] == {
        "compaction": {"trigger_age_days": 3}, "team": "search"
    }  # fmt: skip
    assert (await client.get("/v1/conversations")).json()["items"][0]["metadata"]["team"]
