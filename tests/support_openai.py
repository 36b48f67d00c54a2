"""A fake OpenAI-compatible HTTP server for tests: real HTTP on 127.0.0.1, stdlib asyncio only.

Replies are scripted in order; every request is recorded::

    async with FakeOpenAIServer() as server:
        server.add(chat_completion("the handoff", prompt_tokens=120))
        server.add(Reply(429, error_body("slow down"), headers={"retry-after": "2"}))
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ...
        assert server.requests[0].json["model"] == "fake-model"

Any method and path is answered from the same queue (the path is recorded, so a test can check
it). When the queue is empty the ``default`` reply is used, and without one a 500 saying no
reply was scripted, so an unexpected extra request fails loudly. A reply's ``delay`` holds the
answer back (the request is recorded first), to drive client timeouts; its ``hold`` (an
:class:`asyncio.Event`) holds it until the test sets the event, for tests that must know the
answer cannot have been sent yet, whatever the machine's load::

    release = asyncio.Event()
    server.add(Reply(200, chat_completion("late"), hold=release))
    ...  # the client is certainly still waiting here
    release.set()

Each connection serves one request (``Connection: close``). Streaming is not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

__all__ = [
    "FakeOpenAIServer",
    "Received",
    "Reply",
    "chat_completion",
    "error_body",
]


@dataclass(frozen=True)
class Reply:
    """One scripted answer: ``status``, a JSON-serialisable ``body`` (``None`` for an empty
    body), seconds of ``delay`` before answering, extra response ``headers``, and an event to
    ``hold`` the answer until it is set (waited for after the delay)."""

    status: int = 200
    body: Any = None
    delay: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    hold: asyncio.Event | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Received:
    """One request as the server saw it: header names are lower-cased; ``json`` is the parsed
    body (``None`` when the body is empty or not JSON) and ``body`` the raw bytes."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any


class FakeOpenAIServer:
    """An HTTP server on a free port of 127.0.0.1, usable as an async context manager.

    ``base_url`` ends in ``/v1``, ready for an OpenAI client. ``add`` queues replies (a plain
    mapping is a 200 with that JSON body); ``requests`` lists what arrived, oldest first.
    """

    def __init__(
        self,
        replies: Iterable[Reply | Mapping[str, Any]] = (),
        *,
        default: Reply | Mapping[str, Any] | None = None,
    ) -> None:
        self._replies: deque[Reply] = deque(_as_reply(reply) for reply in replies)
        self.default = None if default is None else _as_reply(default)
        self.requests: list[Received] = []
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = asyncio.Event()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pending(self) -> int:
        """How many scripted replies have not been used yet."""
        return len(self._replies)

    def add(self, *replies: Reply | Mapping[str, Any]) -> None:
        """Queue ``replies`` after the ones already scripted."""
        self._replies.extend(_as_reply(reply) for reply in replies)

    async def __aenter__(self) -> FakeOpenAIServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is None:
            return
        self._server.close()
        # Wake delayed replies and close open connections rather than cancelling handlers:
        # asyncio 3.11 logs an error for a connection callback that ends cancelled.
        self._closing.set()
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def _next_reply(self) -> Reply:
        if self._replies:
            return self._replies.popleft()
        if self.default is not None:
            return self.default
        return Reply(500, error_body("fake server: no reply was scripted for this request"))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        self._writers.add(writer)
        try:
            request = await _read_request(reader)
            if request is None:
                return
            self.requests.append(request)
            reply = self._next_reply()
            if reply.delay:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), reply.delay)
            if reply.hold is not None and not self._closing.is_set():
                await _either(reply.hold, self._closing)
            if self._closing.is_set() or reader.at_eof():
                return  # shutting down, or the client gave up waiting (a timeout, typically)
            self._answering(reply)
            writer.write(_encode(reply))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away: nothing to answer
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)

    def _answering(self, reply: Reply) -> None:
        """Called right before ``reply`` is written (a hook for subclasses that time it)."""


async def _either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Wait until either event is set."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # connection opened and closed without a request
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in header_lines:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return Received(method=method, path=path, headers=headers, body=body, json=parsed)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # the empty trailer
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _encode(reply: Reply) -> bytes:
    body = b"" if reply.body is None else json.dumps(reply.body).encode()
    try:
        reason = HTTPStatus(reply.status).phrase
    except ValueError:
        reason = "Scripted"
    lines = [
        f"HTTP/1.1 {reply.status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in reply.headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _as_reply(reply: Reply | Mapping[str, Any]) -> Reply:
    return reply if isinstance(reply, Reply) else Reply(200, dict(reply))


def chat_completion(
    content: str | None,
    *,
    model: str = "fake-model",
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    cached_tokens: int | None = None,
    reasoning_tokens: int | None = None,
    usage: bool = True,
    finish_reason: str = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A chat-completions response body with one choice. ``usage=False`` leaves usage out (as
    some compatible servers do); token details appear only when given. ``tool_calls`` are
    OpenAI-shaped (``{"id", "type": "function", "function": {"name", "arguments"}}``)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage:
        counts: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if cached_tokens is not None:
            counts["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        if reasoning_tokens is not None:
            counts["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        body["usage"] = counts
    return body


def error_body(
    message: str, *, error_type: str = "server_error", code: str | None = None
) -> dict[str, Any]:
    """An OpenAI-shaped error body."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
