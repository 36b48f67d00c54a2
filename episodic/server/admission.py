"""Overload is an answer, not a timeout: at most ``limit`` ``/v1`` requests are inside the
app at once. One more waits for a slot up to ``queue_timeout`` seconds (and at most
``limit`` of them wait), else it is refused at once with 503, ``Retry-After`` and a
problem naming :class:`~episodic.errors.OverloadedError`.

Without it every request beyond the pool's size queues for a connection with no bound: the
clients time out, then retry into a longer queue, and the answers that do come arrive after
their callers gave up. A refusal happens before the app sees the request, so a refused
append wrote nothing; an admitted one runs to its end as before.

The wait is short by default (0.1 s): with a free slot every few milliseconds at the
library's speed, a slot not freed in a tenth of a second means the pool is stuck behind slow
statements, and a longer wait only turns a prompt 503 into a late one. The probes
(``/healthz``, ``/readyz``) and ``/metrics`` are never limited: an overloaded server is alive,
and says so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from episodic.errors import OverloadedError
from episodic.server.problems import RETRY_AFTER_SECONDS, overloaded_problem

#: the requests this limits: the API's, which take a database connection
LIMITED_PREFIX = "/v1/"


class Admission:
    """The in-flight limit of one process (each worker has its own)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        queue_timeout: float,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"the in-flight limit must be at least 1, not {limit}")
        self.app = app
        self.limit = limit
        self.queue_timeout = queue_timeout
        self.on_refused = on_refused
        self._slots = asyncio.Semaphore(limit)
        self._waiting = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(LIMITED_PREFIX):
            await self.app(scope, receive, send)
            return
        if not await self._admitted():
            self.on_refused()
            error = OverloadedError(limit=self.limit, retry_after=RETRY_AFTER_SECONDS)
            state = scope.get("state", {})
            response = overloaded_problem(
                error, instance=scope["path"], request_id=state.get("request_id")
            )
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()

    async def _admitted(self) -> bool:
        """A slot taken (True), or none free within the queue timeout (False)."""
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns without suspending
            return True
        if self.queue_timeout <= 0 or self._waiting >= self.limit:
            return False
        self._waiting += 1
        try:
            async with asyncio.timeout(self.queue_timeout):
                await self._slots.acquire()
            return True
        except TimeoutError:
            return False
        finally:
            self._waiting -= 1
