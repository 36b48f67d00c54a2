"""The HTTP API's limits: the largest page a list may ask for, and a request body limit that
answers as every other error does (problem+json 413), whether the size is announced
(Content-Length) or only found while streaming."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from episodic.server.problems import problem

#: the largest page a list (of conversations, of events) may ask for, over /v1 and in /ui
MAX_PAGE = 1_000


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        announced = dict(scope["headers"]).get(b"content-length")
        if announced is not None and announced.isdigit() and int(announced) > self.max_bytes:
            response = problem(413, self._detail(), instance=scope.get("path"))
            await response(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self._detail())
            return message

        await self.app(scope, counted, send)

    def _detail(self) -> str:
        return f"the request body is over {self.max_bytes:,} bytes"
