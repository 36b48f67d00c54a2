"""The HTTP API in process (httpx over ASGI), on PostgreSQL and SQLite: every route, its
status codes and headers, and errors as problem+json that leave the store unchanged."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from episodic import BoundaryRequest, EpisodicStore
from episodic.server import create_app
from episodic.server.keys import KeyStore
from episodic.server.operations import ManualCompaction
from episodic.summarizers import ExtractiveSummarizer
from episodic.worker import CompactionOptions
from tests.support import store_through_proxy

PROBLEM = "application/problem+json"


@pytest.fixture
async def anonymous(store: EpisodicStore, keys: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """A client sending no key."""
    app = create_app(store, keys, max_body_bytes=64 * 1024)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as http:
        yield http


@pytest.fixture
async def client(anonymous: httpx.AsyncClient, keys: KeyStore) -> httpx.AsyncClient:
    """A client with tenant acme's key."""
    _, secret = await keys.create("acme")
    anonymous.headers["Authorization"] = f"Bearer {secret}"
    return anonymous


def _body(content: bytes, content_type: str = "application/json") -> dict[str, object]:
    return {"content": content, "headers": {"content-type": content_type}}


def _user(text: str) -> dict[str, object]:
    return {"role": "user", "content": text}


async def _create(client: httpx.AsyncClient) -> str:
    created = await client.post("/v1/conversations", json={})
    assert created.status_code == 201, created.text
    cid: str = created.json()["conversation"]["conversation_id"]
    assert created.headers["location"] == f"/v1/conversations/{cid}"
    assert created.headers["etag"] == '"0"'
    return cid


async def test_create_append_read_and_load(client: httpx.AsyncClient) -> None:
    cid = await _create(client)
    appended = await client.post(
        f"/v1/conversations/{cid}/messages",
        json={"messages": [_user("hello"), {"role": "assistant", "content": "hi"}]},
    )
    assert appended.status_code == 201, appended.text
    assert [e["seq"] for e in appended.json()["events"]] == [1, 2]
    assert appended.headers["etag"] == '"2"'
    head = await client.get(f"/v1/conversations/{cid}")
    assert head.status_code == 200
    assert head.json()["conversation"]["last_seq"] == 2
    assert head.json()["pressure"]["total_user_messages"] == 1
    assert head.headers["etag"] == '"2"'
    events = await client.get(f"/v1/conversations/{cid}/events", params={"limit": 1})
    assert [e["seq"] for e in events.json()["events"]] == [1]
    assert events.json()["next_after_seq"] == 1
    rest = await client.get(f"/v1/conversations/{cid}/events", params={"after_seq": 1})
    assert [e["seq"] for e in rest.json()["events"]] == [2]
    assert rest.json()["next_after_seq"] is None
    for fmt, first in (
        ("openai", {"role": "user", "content": "hello"}),
        ("anthropic", {"role": "user", "content": [{"type": "text", "text": "hello"}]}),
    ):
        context = await client.get(f"/v1/conversations/{cid}/context", params={"format": fmt})
        assert context.status_code == 200, context.text
        assert context.json()["messages"][0] == first
        assert context.json()["last_seq"] == 2
    responses = await client.get(f"/v1/conversations/{cid}/context?format=responses")
    assert responses.json()["messages"][0]["role"] == "user"
    episodic = await client.get(f"/v1/conversations/{cid}/context")
    assert episodic.json()["messages"][1]["content"] == "hi"
    completed = await client.post(f"/v1/conversations/{cid}/run-completed")
    assert completed.status_code == 201
    assert completed.json()["last_seq"] == 3


async def test_idempotency_key_replays_and_refuses_another_body(
    client: httpx.AsyncClient,
) -> None:
    cid = await _create(client)
    url = f"/v1/conversations/{cid}/messages"
    body = {"messages": [_user("once")]}
    first = await client.post(url, json=body, headers={"Idempotency-Key": "k1"})
    again = await client.post(url, json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    other = await client.post(
        url, json={"messages": [_user("twice")]}, headers={"Idempotency-Key": "k1"}
    )
    assert other.status_code == 422
    assert other.headers["content-type"] == PROBLEM
    assert other.json()["type"].endswith("/IdempotencyMismatchError")
    assert (await client.get(f"/v1/conversations/{cid}")).json()["conversation"]["last_seq"] == 1


async def test_if_match_is_the_expected_seq(client: httpx.AsyncClient) -> None:
    cid = await _create(client)
    url = f"/v1/conversations/{cid}/messages"
    ok = await client.post(url, json={"messages": [_user("a")]}, headers={"If-Match": '"0"'})
    assert ok.status_code == 201
    stale = await client.post(url, json={"messages": [_user("b")]}, headers={"If-Match": '"0"'})
    assert stale.status_code == 412
    assert stale.json()["type"].endswith("/ConflictError")
    bad = await client.post(url, json={"messages": [_user("b")]}, headers={"If-Match": "x"})
    assert bad.status_code == 422
    assert (await client.get(f"/v1/conversations/{cid}")).json()["conversation"]["last_seq"] == 1


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "kind"),
    [
        ("get", "/v1/conversations/not-a-uuid", {}, 422, "ValidationError"),
        ("get", f"/v1/conversations/{uuid.uuid4()}", {}, 404, "NotFoundError"),
        ("get", f"/v1/conversations/{uuid.uuid4()}/context", {}, 404, "NotFoundError"),
        ("get", "/v1/conversations", {"params": {"limit": 10**6}}, 422, "ValidationError"),
        ("post", "/v1/conversations", _body(b"{not json"), 422, "ValidationError"),
        ("post", "/v1/conversations", _body(b"{}", "text/plain"), 415, "UnsupportedMediaTypeError"),
        ("post", "/v1/conversations", _body(b"x" * (65 * 1024)), 413, None),
        ("get", "/v1/nowhere", {}, 404, None),
        ("get", "/v1/conversations", {"headers": {"Authorization": "Bearer x"}}, 401, None),
    ],
)
async def test_bad_requests_are_problems(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    kwargs: dict[str, object],
    status: int,
    kind: str | None,
) -> None:
    before = (await client.get("/v1/conversations")).json()
    response = await client.request(method.upper(), path, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["status"] == status
    if kind is not None:
        assert problem["type"].endswith(f"/{kind}")
    assert (await client.get("/v1/conversations")).json() == before


async def test_append_errors_leave_the_log_as_it_was(client: httpx.AsyncClient) -> None:
    cid = await _create(client)
    url = f"/v1/conversations/{cid}/messages"
    cases = [
        ({"messages": [{"role": "wizard", "content": "x"}]}, 422),
        ({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}, 422),
        ({"messages": []}, 422),
        ({"messages": [_user("x" * 70_000)]}, 413),
    ]
    for body, status in cases:
        response = await client.post(url, json=body)
        assert response.status_code == status, (body, response.text)
        assert response.headers["content-type"] == PROBLEM
    assert (await client.get(f"/v1/conversations/{cid}")).json()["conversation"]["last_seq"] == 0


async def test_health_and_openapi(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ok"}
    schema = (await client.get("/openapi.json")).json()
    assert schema["openapi"].startswith("3.1")
    names = set(schema["components"]["schemas"])
    assert {"Problem", "AppendBatch", "Message", "ConversationHead", "LoadedContext"} <= names
    append = schema["paths"]["/v1/conversations/{conversation_id}/messages"]["post"]
    assert PROBLEM in append["responses"]["422"]["content"]
    assert (await client.get("/docs")).status_code == 200


async def test_keys_scope_every_request_to_their_tenant(
    anonymous: httpx.AsyncClient, keys: KeyStore
) -> None:
    _, acme = await keys.create("acme")
    _, globex = await keys.create("globex")
    as_acme = {"Authorization": f"Bearer {acme}"}
    as_globex = {"Authorization": f"Bearer {globex}"}
    created = await anonymous.post("/v1/conversations", json={}, headers=as_acme)
    assert created.json()["conversation"]["tenant_id"] == "acme"
    cid = created.json()["conversation"]["conversation_id"]
    await anonymous.post(
        f"/v1/conversations/{cid}/messages", json={"messages": [_user("secret")]}, headers=as_acme
    )
    leaks = 0
    for method, path, body in [
        ("GET", f"/v1/conversations/{cid}", None),
        ("GET", f"/v1/conversations/{cid}/events", None),
        ("GET", f"/v1/conversations/{cid}/context", None),
        ("GET", f"/v1/conversations/{cid}/search?q=secret", None),
        ("POST", f"/v1/conversations/{cid}/messages", {"messages": [_user("x")]}),
        ("POST", f"/v1/conversations/{cid}/run-completed", None),
        ("POST", f"/v1/conversations/{cid}/unpin", {"seq": 1}),
    ]:
        response = await anonymous.request(method, path, json=body, headers=as_globex)
        assert response.status_code == 404, (method, path, response.text)
        leaks += "secret" in response.text
    listed = await anonymous.get("/v1/conversations", headers=as_globex)
    assert listed.json()["items"] == []
    assert leaks == 0
    head = await anonymous.get(f"/v1/conversations/{cid}", headers=as_acme)
    assert head.json()["conversation"]["last_seq"] == 1


async def test_no_key_a_wrong_key_and_a_revoked_key_are_401(
    anonymous: httpx.AsyncClient, keys: KeyStore
) -> None:
    key, secret = await keys.create("acme")
    for headers in (
        {},
        {"Authorization": "Bearer ep_0000_nope"},
        {"Authorization": f"Bearer {secret}x"},
        {"Authorization": "Basic abc"},
    ):
        response = await anonymous.get("/v1/conversations", headers=headers)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["content-type"] == PROBLEM
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert (await keys.revoke(key.key_id)).revoked_at is not None
    revoked = await anonymous.get(
        "/v1/conversations", headers={"Authorization": f"Bearer {secret}"}
    )
    assert revoked.status_code == 401
    assert "revoked" in revoked.json()["detail"]


async def test_compaction_status_is_for_operator_keys(
    anonymous: httpx.AsyncClient, keys: KeyStore
) -> None:
    _, tenant = await keys.create("acme")
    _, operator = await keys.create("ops", operator=True)
    refused = await anonymous.get("/v1/compaction", headers={"Authorization": f"Bearer {tenant}"})
    assert refused.status_code == 403
    assert refused.json()["type"].endswith("/OperatorRequiredError")
    status = await anonymous.get("/v1/compaction", headers={"Authorization": f"Bearer {operator}"})
    assert status.status_code == 200, status.text
    assert status.json()["due"] == 0


async def test_export_streams_the_log_as_json_lines(client: httpx.AsyncClient) -> None:
    cid = await _create(client)
    await client.post(f"/v1/conversations/{cid}/messages", json={"messages": [_user("hi")]})
    exported = await client.get(f"/v1/conversations/{cid}/export")
    assert exported.status_code == 200, exported.text
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    lines = exported.text.splitlines()
    assert len(lines) >= 2  # the header, then the event
    assert '"hi"' in exported.text
    missing = await client.get(f"/v1/conversations/{uuid.uuid4()}/export")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == PROBLEM


async def test_erase_is_for_operator_keys_in_their_tenant(
    anonymous: httpx.AsyncClient, keys: KeyStore
) -> None:
    _, tenant = await keys.create("acme")
    _, operator = await keys.create("acme", operator=True)
    _, other = await keys.create("globex", operator=True)
    as_tenant = {"Authorization": f"Bearer {tenant}"}
    created = await anonymous.post("/v1/conversations", json={}, headers=as_tenant)
    cid = created.json()["conversation"]["conversation_id"]
    url = f"/v1/conversations/{cid}/erase"
    body = {"reason": "user asked"}
    refused = await anonymous.post(url, json=body, headers=as_tenant)
    assert refused.status_code == 403
    elsewhere = await anonymous.post(url, json=body, headers={"Authorization": f"Bearer {other}"})
    assert elsewhere.status_code == 404
    assert (await anonymous.get(f"/v1/conversations/{cid}", headers=as_tenant)).status_code == 200
    erased = await anonymous.post(url, json=body, headers={"Authorization": f"Bearer {operator}"})
    assert erased.status_code == 200, erased.text
    assert erased.json()["reason"] == "user asked"
    assert (await anonymous.get(f"/v1/conversations/{cid}", headers=as_tenant)).status_code == 404


async def test_metrics_count_requests_by_route_template(client: httpx.AsyncClient) -> None:
    cid = await _create(client)
    await client.get(f"/v1/conversations/{cid}")
    await client.get(f"/v1/conversations/{uuid.uuid4()}")
    text = (await client.get("/metrics")).text
    route = 'route="/v1/conversations/{conversation_id}"'
    assert f'episodic_http_requests_total{{method="GET",{route},status="200"}} 1.0' in text
    assert f'episodic_http_requests_total{{method="GET",{route},status="404"}} 1.0' in text
    assert str(cid) not in text


async def test_if_none_match_is_a_304_until_the_log_moves(client: httpx.AsyncClient) -> None:
    cid = await _create(client)
    path = f"/v1/conversations/{cid}/context"
    tag = (await client.get(path)).headers["etag"]
    unchanged = await client.get(path, headers={"If-None-Match": tag})
    assert unchanged.status_code == 304
    assert unchanged.headers["etag"] == tag
    assert unchanged.content == b""
    # the head's compaction state and pressure move without a new seq: never a 304
    head = await client.get(f"/v1/conversations/{cid}", headers={"If-None-Match": tag})
    assert head.status_code == 200
    assert head.headers["etag"] == tag
    await client.post(f"/v1/conversations/{cid}/messages", json={"messages": [_user("hi")]})
    moved = await client.get(f"/v1/conversations/{cid}/context", headers={"If-None-Match": '"0"'})
    assert moved.status_code == 200
    assert moved.headers["etag"] == '"1"'


async def test_cors_is_off_unless_origins_are_configured(
    store: EpisodicStore, keys: KeyStore
) -> None:
    preflight = {
        "Origin": "https://app.example.com",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,idempotency-key",
    }
    for origins, allowed in (((), None), (["https://app.example.com"], "https://app.example.com")):
        app = create_app(store, keys, cors_origins=origins)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as http:
            answer = await http.options("/v1/conversations", headers=preflight)
            assert answer.headers.get("access-control-allow-origin") == allowed
            other = await http.options(
                "/v1/conversations", headers={**preflight, "Origin": "https://evil.example"}
            )
            assert "access-control-allow-origin" not in other.headers


async def test_each_request_is_logged_as_json_with_its_request_id(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    cid = await _create(client)
    with caplog.at_level(logging.INFO, logger="episodic.access"):
        given = await client.get(f"/v1/conversations/{cid}", headers={"X-Request-ID": "req-42"})
        made = await client.get(f"/v1/conversations/{uuid.uuid4()}")
    assert given.headers["x-request-id"] == "req-42"
    assert len(made.headers["x-request-id"]) == 32
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "episodic.access"]
    assert [line["status"] for line in lines] == [200, 404]
    first = lines[0]
    assert first["request_id"] == "req-42"
    assert first["route"] == "/v1/conversations/{conversation_id}"
    assert first["path"] == f"/v1/conversations/{cid}"
    assert first["tenant"] == "acme"
    assert first["key"]
    assert first["ms"] >= 0


async def test_compact_now_is_for_operator_keys_and_writes_a_boundary(
    store: EpisodicStore, keys: KeyStore
) -> None:
    compaction = ManualCompaction(ExtractiveSummarizer(), CompactionOptions(), 60.0)
    _, tenant = await keys.create("acme")
    _, operator = await keys.create("acme", operator=True)
    for configured in (None, compaction):
        app = create_app(store, keys, compaction=configured)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as http:
            http.headers["Authorization"] = f"Bearer {tenant}"
            cid = await _create(http)
            for i in range(6):
                answer = {"role": "assistant", "content": f"answer {i} " * 300}
                turn = [_user(f"question {i}"), answer]
                await http.post(f"/v1/conversations/{cid}/messages", json={"messages": turn})
            url = f"/v1/conversations/{cid}/compact"
            refused = await http.post(url)
            assert refused.status_code == 403
            as_operator = {"Authorization": f"Bearer {operator}"}
            ran = await http.post(url, headers=as_operator)
            if configured is None:
                assert ran.status_code == 501
                assert ran.json()["type"].endswith("/CompactionUnavailableError")
                assert (await http.get(f"/v1/conversations/{cid}/context")).json()[
                    "boundary_seq"
                ] is None
                continue
            assert ran.status_code == 200, ran.text
            result = ran.json()
            assert result["outcome"] == "succeeded"
            assert result["tokens_after"] < result["tokens_before"]
            context = (await http.get(f"/v1/conversations/{cid}/context")).json()
            assert context["boundary_seq"] == 13
            missing = await http.post(
                f"/v1/conversations/{uuid.uuid4()}/compact", headers=as_operator
            )
            assert missing.status_code == 404


async def test_a_database_that_goes_away_is_a_503_with_retry_after(postgres_url: str) -> None:
    keys = KeyStore.open(postgres_url)
    try:
        _, secret = await keys.create("acme")
        async with store_through_proxy(postgres_url) as (store, proxy):
            app = create_app(store, keys)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as http:
                http.headers["Authorization"] = f"Bearer {secret}"
                assert (await http.get("/readyz")).status_code == 200
                # the database is away: the open connection cut, new ones refused
                proxy.cut_requests = 1_000_000
                await proxy.stop()
                for path in ("/readyz", "/v1/conversations"):
                    away = await http.get(path)
                    assert away.status_code == 503, (path, away.text)
                    assert away.headers["content-type"] == PROBLEM
                    assert away.headers["retry-after"] == "1"
                    assert "TransientDatabaseError" in away.json()["type"] or (
                        away.json()["type"].endswith("/DatabaseUnavailableError")
                    )
    finally:
        await keys.close()


async def test_search_finds_messages_by_their_words_and_refuses_a_blank_query(
    client: httpx.AsyncClient,
) -> None:
    cid = await _create(client)
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    await client.post(
        f"/v1/conversations/{cid}/messages",
        params={"format": "openai"},
        json={
            "messages": [
                _user("fix the login test"),
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "FAILED: AuthError E2147"},
            ]
        },
    )
    found = await client.get(f"/v1/conversations/{cid}/search", params={"q": "E2147", "limit": 5})
    assert found.status_code == 200, found.text
    assert found.json()["query"] == "E2147"
    assert [(e["seq"], e["message"]["role"]) for e in found.json()["events"]] == [(3, "tool")]
    ranked = await client.get(f"/v1/conversations/{cid}/search", params={"q": "failing login"})
    assert [e["seq"] for e in ranked.json()["events"]] == [3, 1]
    for params in ({"q": " "}, {"q": ""}, {"q": "x", "limit": 0}, {"q": "x", "limit": 101}, {}):
        refused = await client.get(f"/v1/conversations/{cid}/search", params=params)
        assert refused.status_code == 422, (params, refused.text)
        assert refused.headers["content-type"] == PROBLEM
    missing = await client.get(f"/v1/conversations/{uuid.uuid4()}/search", params={"q": "x"})
    assert missing.status_code == 404


async def test_a_pinned_message_is_unpinned_by_an_event(client: httpx.AsyncClient) -> None:
    cid = await _create(client)
    appended = await client.post(
        f"/v1/conversations/{cid}/messages",
        json={"messages": [{**_user("always answer in French"), "pinned": True}, _user("hi")]},
    )
    assert appended.status_code == 201, appended.text
    assert [e["message"].get("pinned", False) for e in appended.json()["events"]] == [True, False]
    unpinned = await client.post(f"/v1/conversations/{cid}/unpin", json={"seq": 1})
    assert unpinned.status_code == 201, unpinned.text
    assert unpinned.headers["ETag"] == '"3"'
    [event] = unpinned.json()["events"]
    assert (event["kind"], event["seq"], event["unpinned_seq"]) == ("unpin", 3, 1)
    for body in ({"seq": 2}, {"seq": 0}, {"seq": "one"}, {}):
        refused = await client.post(f"/v1/conversations/{cid}/unpin", json=body)
        assert refused.status_code == 422, (body, refused.text)
        assert refused.headers["content-type"] == PROBLEM
        # what only the conversation's state refuses has a type of its own
        assert refused.json()["type"].endswith("/NotPinnedError") == (body == {"seq": 2})
    assistant = {"role": "assistant", "content": "ok", "pinned": True}
    refused = await client.post(f"/v1/conversations/{cid}/messages", json={"messages": [assistant]})
    assert refused.status_code == 422, refused.text
    missing = await client.post(f"/v1/conversations/{uuid.uuid4()}/unpin", json={"seq": 1})
    assert missing.status_code == 404
    assert (await client.get(f"/v1/conversations/{cid}")).json()["conversation"]["last_seq"] == 3


async def test_a_session_view_pop_and_clear(
    client: httpx.AsyncClient, store: EpisodicStore
) -> None:
    """The routes the TypeScript sessions stand on: the view (the boundary's messages first,
    then the messages as appended, a reasoning-only turn kept), retract-last (a pop, one
    message a call, the log keeps it) and clear (an empty view, a clear in the log)."""
    cid = await _create(client)
    reasoning_only = {"role": "assistant", "content": "", "reasoning": "thinking it over"}
    batch = [_user("fix the refund job"), {"role": "assistant", "content": "on it"}]
    appended = await client.post(f"/v1/conversations/{cid}/messages", json={"messages": batch})
    assert appended.status_code == 201, appended.text
    await store.for_tenant("acme").write_boundary(
        cid,
        BoundaryRequest(
            summary="the refund job posts twice",
            covers_through_seq=2,
            retained=["fix the refund job"],
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    after = [_user("and the test?"), reasoning_only]
    await client.post(f"/v1/conversations/{cid}/messages", json={"messages": after})

    view = await client.get(f"/v1/conversations/{cid}/view")
    assert view.status_code == 200, view.text
    seen = view.json()
    assert [m["content"] for m in seen["messages"]][1:] == [
        "fix the refund job",
        "and the test?",
        "",
    ]
    assert "the refund job posts twice" in seen["messages"][0]["content"]
    assert seen["messages"][3]["reasoning"] == "thinking it over"  # the context drops it
    assert (seen["covers_through_seq"], seen["boundary_seq"], seen["last_seq"]) == (5, 3, 5)
    assert view.headers["etag"] == '"5"'

    popped = await client.post(f"/v1/conversations/{cid}/retract-last")
    assert popped.status_code == 200, popped.text
    assert popped.json()["retracted"]["seq"] == 5
    popped = await client.post(f"/v1/conversations/{cid}/retract-last")
    assert popped.json()["retracted"]["message"]["content"] == "and the test?"
    assert len((await client.get(f"/v1/conversations/{cid}/view")).json()["messages"]) == 2
    assert (await client.post(f"/v1/conversations/{cid}/retract-last")).json() == {
        "retracted": None
    }

    cleared = await client.post(f"/v1/conversations/{cid}/clear")
    assert cleared.json()["cleared"]["kind"] == "clear"
    assert (await client.get(f"/v1/conversations/{cid}/view")).json()["messages"] == []
    assert (await client.post(f"/v1/conversations/{cid}/clear")).json() == {"cleared": None}
    kinds = [
        e["kind"] for e in (await client.get(f"/v1/conversations/{cid}/events")).json()["events"]
    ]
    assert kinds == ["message"] * 2 + ["boundary"] + ["message"] * 2 + ["retraction"] * 2 + [
        "clear"
    ]

    unknown = uuid.uuid4()
    for method, path in (("GET", "view"), ("POST", "retract-last"), ("POST", "clear")):
        answer = await client.request(method, f"/v1/conversations/{unknown}/{path}")
        assert answer.status_code == 404, (path, answer.text)
        assert answer.headers["content-type"].startswith(PROBLEM)
