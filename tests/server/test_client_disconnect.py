"""A client that hangs up before its body arrives (a timeout, a load generator stopping) is
not a server error: the request gets 499 in the access log and the metrics, no traceback,
and nothing is written."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from starlette.types import Message

from episodic import EpisodicStore
from episodic.server import create_app
from episodic.server.keys import KeyStore


async def _disconnected(
    store: EpisodicStore, keys: KeyStore, path: str, secret: str
) -> list[Message]:
    """``path`` POSTed by a client that hangs up before sending its body; what the app sent."""
    app = create_app(store, keys)
    sent: list[Message] = []
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"episodic"),
            (b"authorization", f"Bearer {secret}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"64"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("episodic", 80),
    }

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("route", ["messages", "unpin"])
async def test_a_client_gone_before_its_body_is_a_499_not_a_500(
    store: EpisodicStore, keys: KeyStore, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = store.for_tenant("acme")
    conversation = await tenant.create_conversation()
    _, secret = await keys.create("acme")
    with caplog.at_level(logging.INFO):
        sent = await _disconnected(store, keys, f"/v1/conversations/{conversation}/{route}", secret)
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 499
    access = [json.loads(r.getMessage()) for r in caplog.records if r.name == "episodic.access"]
    assert [line["status"] for line in access] == [499]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert (await tenant.get_conversation(conversation)).last_seq == 0
