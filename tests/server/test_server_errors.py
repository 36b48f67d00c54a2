"""A server error tells the caller its class and the request's id, nothing of the internals:
the database's words, its statements and its tables go to the server's log, under that id.
The case that leaked: a database not yet migrated, and a request with a key that is not one."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from episodic import EpisodicStore, errors
from episodic.server import create_app
from episodic.server.disclosure import PUBLIC_DETAILS
from episodic.server.keys import KeyStore
from tests.conftest import isolated_settings
from tests.server.leaks import leaks_in

PROBLEM = "application/problem+json"
NOT_MIGRATED = dict(PUBLIC_DETAILS)[errors.SchemaNotMigratedError]
#: a key of the right shape, so that it is looked up (a malformed one is refused before)
BOGUS_KEY = "ep_0123456789abcdef_not-a-secret"


@pytest.fixture(params=["postgresql", "sqlite"])
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with no episodic tables (not migrated yet), on each backend."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("empty_postgres_url"))


@pytest.fixture
async def unmigrated(unmigrated_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The API on a database not migrated yet."""
    store = await EpisodicStore.open(unmigrated_url, settings=isolated_settings())
    keys = KeyStore.open(unmigrated_url)
    try:
        app = create_app(store, keys)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as http:
            yield http
    finally:
        await keys.close()
        await store.close()


async def test_an_unmigrated_database_and_a_bogus_key_is_a_clean_503(
    unmigrated: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="episodic.server.errors"):
        answer = await unmigrated.post(
            "/v1/conversations/0b6f4d43-84b1-4c59-9a4b-5b0f3b0d9d43/messages",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {BOGUS_KEY}", "X-Request-ID": "req-503"},
        )
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == PROBLEM
    assert answer.headers["retry-after"] == "1"
    assert answer.headers["x-request-id"] == "req-503"
    problem = answer.json()
    assert problem == {
        "type": "https://episodic.dev/errors/SchemaNotMigratedError",
        "title": "Service Unavailable",
        "status": 503,
        "detail": NOT_MIGRATED,
        "request_id": "req-503",
        "instance": "/v1/conversations/0b6f4d43-84b1-4c59-9a4b-5b0f3b0d9d43/messages",
    }
    assert leaks_in(answer.text) == []
    # what the caller was not told is in the log, under the request's id
    logged = [r.getMessage() for r in caplog.records if r.name == "episodic.server.errors"]
    assert any("req-503" in line and "episodic migrate" in line for line in logged), logged
    assert any(leaks_in(line) for line in logged), logged  # the driver's words: the log's


async def test_the_other_routes_and_the_inspector_say_no_more(
    unmigrated: httpx.AsyncClient,
) -> None:
    bearer = {"Authorization": f"Bearer {BOGUS_KEY}"}
    for method, path in (("GET", "/readyz"), ("GET", "/v1/conversations"), ("GET", "/ui")):
        answer = await unmigrated.request(method, path, headers=bearer)
        assert answer.status_code == 503, (path, answer.text)
        assert leaks_in(answer.text) == [], path
        assert NOT_MIGRATED in answer.text, path
    signed_in = await unmigrated.post(
        "/ui/sign-in",
        content=f"key={BOGUS_KEY}&next=/ui".encode(),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Sec-Fetch-Site": "same-origin",
        },
    )
    assert signed_in.status_code == 503, signed_in.text
    assert leaks_in(signed_in.text) == []
    assert "(request " in signed_in.text  # the id the log has it under


async def test_an_unexpected_error_is_a_500_with_the_request_id_only(
    store: EpisodicStore,
    keys: KeyStore,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    internals = "SELECT secret_sha256 FROM episodic_api_keys [SQL: SELECT 1]"

    async def broken(**_: object) -> object:
        raise RuntimeError(internals)

    _, secret = await keys.create("acme")
    app = create_app(store, keys)
    tenant_store = store.for_tenant("acme")
    monkeypatch.setattr(store, "for_tenant", lambda _tenant: tenant_store)
    monkeypatch.setattr(tenant_store, "list_conversations", broken)
    # Starlette re-raises after answering, for the server's log: the client gets the answer
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as http:
        with caplog.at_level(logging.ERROR, logger="episodic.server.errors"):
            answer = await http.get(
                "/v1/conversations", headers={"Authorization": f"Bearer {secret}"}
            )
    assert answer.status_code == 500
    assert answer.headers["content-type"] == PROBLEM
    problem = answer.json()
    request_id = answer.headers["x-request-id"]
    assert len(request_id) == 32
    assert problem["request_id"] == request_id
    assert (problem["type"], problem["title"]) == ("about:blank", "Internal Server Error")
    assert leaks_in(answer.text) == []
    logged = [r.getMessage() for r in caplog.records if r.name == "episodic.server.errors"]
    assert any(request_id in line and internals in line for line in logged), logged
