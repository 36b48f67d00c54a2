"""The key store beside each test's store (tests of the HTTP API), and a watch on every
answer these tests get: none may hold the internals' text (see tests/server/leaks.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import requests

from episodic import EpisodicStore
from episodic.server.keys import KeyStore
from tests.server.leaks import leaks_in


@pytest.fixture
async def keys(store: EpisodicStore, database_url: str) -> AsyncIterator[KeyStore]:
    opened = KeyStore.open(database_url)
    try:
        yield opened
    finally:
        await opened.close()


class AnswerWatch:
    """The answers a test got that hold the internals' text, as ``request -> markers``.

    A marker the test itself sent (in a URL or a body, in this request or an earlier one) is
    the client's text echoed back, not a leak: Hypothesis draws strings from the literals of
    the code under test, so a fuzzed message may well say ``episodic_events``."""

    def __init__(self) -> None:
        self.leaks: list[str] = []
        self.answers = 0
        self.sent: list[str] = []

    def send(self, url: object, body: object) -> None:
        self.sent.append(str(url))
        if isinstance(body, bytes):
            self.sent.append(body.decode("utf-8", "replace"))
        elif isinstance(body, str):
            self.sent.append(body)

    def read(self, method: str, url: object, status: int, text: str) -> None:
        self.answers += 1
        found = [
            marker for marker in leaks_in(text) if not any(marker in sent for sent in self.sent)
        ]
        if found:
            self.leaks.append(f"{method} {url} -> {status}: {found}: {text[:500]!r}")


def _content(request: httpx.Request) -> bytes:
    """The body of a request httpx holds whole (a streamed one is not read here)."""
    try:
        return request.content
    except httpx.RequestNotRead:
        return b""


@pytest.fixture(autouse=True)
def answers_hold_no_internals(monkeypatch: pytest.MonkeyPatch) -> Iterator[AnswerWatch]:
    """Read every answer a server test gets through httpx (in process or over the wire)
    and requests (schemathesis), and fail the test if one holds SQL, a table's name, a
    driver's words or a traceback. An answer httpx streams is not read (it is the test's to
    read); requests' are (schemathesis streams every request and reads it whole), but for an
    event stream, which may not end."""
    watch = AnswerWatch()
    async_send = httpx.AsyncClient.send
    sync_send = httpx.Client.send
    requests_request = requests.Session.request

    async def watched_async(
        self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
    ) -> httpx.Response:
        watch.send(request.url, _content(request))
        response = await async_send(self, request, **kwargs)
        if not kwargs.get("stream"):
            watch.read(request.method, request.url, response.status_code, response.text)
        return response

    def watched_sync(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        watch.send(request.url, _content(request))
        response = sync_send(self, request, **kwargs)
        if not kwargs.get("stream"):
            watch.read(request.method, request.url, response.status_code, response.text)
        return response

    def watched_requests(
        self: requests.Session, method: str, url: str, *args: Any, **kwargs: Any
    ) -> requests.Response:
        response = requests_request(self, method, url, *args, **kwargs)
        watch.send(response.request.url, response.request.body)
        if "text/event-stream" not in response.headers.get("content-type", ""):
            watch.read(method, url, response.status_code, response.text)
        return response

    monkeypatch.setattr(httpx.AsyncClient, "send", watched_async)
    monkeypatch.setattr(httpx.Client, "send", watched_sync)
    monkeypatch.setattr(requests.Session, "request", watched_requests)
    yield watch
    if watch.leaks:
        pytest.fail(
            f"{len(watch.leaks)} of {watch.answers} answers hold the internals' text:\n"
            + "\n".join(watch.leaks[:20]),
            pytrace=False,
        )
