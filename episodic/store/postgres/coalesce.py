"""Appends that a process has in flight at once, sent together in one call.

On a busy process most of what an append costs is not its work but its call: the driver's
round trip, the server's protocol and executor start-up, the commit (``bench/PROFILE.md``).
So at most ``max_calls`` append calls run at once per pool; an append that finds them all
busy waits, and when a call ends, the appends waiting by then go together in one call of
``episodic_append_many``: one round trip, one transaction, one commit, an outcome each. An
append never waits for company: with a call slot free it goes alone at once, so a process
that appends one at a time pays nothing for this.

What going together couples, and how far:

- *Outcomes.* A refusal (conflict, orphan result, unknown conversation...) is an outcome row,
  so it refuses that append alone. An error the server reports rolls the whole call back,
  so nothing of it was written, and each of its appends is then sent alone: only the one at
  fault fails. A connection lost mid-call fails each of its appends as a call of its own
  would (the store retries those with an idempotency key).
- *Time.* A call's appends wait for all of them, and the heads it locked stay locked until
  it commits: at most ``max_batch`` go in one call. An append never waits longer than
  ``max_wait`` seconds for a slot: past that it is sent even if ``max_calls`` are running
  (a call held up by a lock elsewhere does not hold up the process).
- *Locks.* ``episodic_append_many`` locks heads in conversation id order, so two calls cannot
  deadlock on each other.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Request = TypeVar("Request")  # one append, as the send functions take it
Key = TypeVar("Key")  # what the appends of one call must share (compared with ==)
Outcome = TypeVar("Outcome")  # an append's outcome

SendOne = Callable[[Request, Key], Awaitable[Outcome]]
SendMany = Callable[[Sequence[Request], Key], Awaitable[list[Outcome]]]


class CallRolledBack(Exception):
    """Raised by ``send_many``: the server refused the call as a whole and rolled it back, so
    none of its appends was written."""


class _Alone:
    """Stands for "send it alone" in a waiting append's future: its call was rolled back."""


_ALONE = _Alone()


@dataclass(slots=True)
class _Waiting(Generic[Request, Key, Outcome]):
    request: Request
    key: Key
    future: asyncio.Future[Outcome | _Alone]


class AppendCoalescer(Generic[Request, Key, Outcome]):
    """Sends each append with ``send_one`` while fewer than ``max_calls`` calls run, else
    queues it for the next ``send_many`` (see the module's docstring)."""

    def __init__(
        self,
        send_one: SendOne[Request, Key, Outcome],
        send_many: SendMany[Request, Key, Outcome],
        *,
        max_calls: int,
        max_batch: int = 32,
        max_wait: float = 0.005,
    ) -> None:
        self._send_one = send_one
        self._send_many = send_many
        self._max_calls = max_calls
        self._max_batch = max_batch
        self._max_wait = max_wait
        self._calls = 0
        self._waiting: deque[_Waiting[Request, Key, Outcome]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        #: a coalesced call just ended: until the tasks it woke have run (one turn of the
        #: event loop), appends wait, so the ones those tasks make go together again
        self._gathering = False
        #: the calls of waiting appends, running as tasks of their own (a caller's
        #: cancellation must not cut short its call-mates' call)
        self._tasks: set[asyncio.Task[None]] = set()

    async def append(self, request: Request, key: Key) -> Outcome:
        if self._calls < self._max_calls and not self._waiting and not self._gathering:
            return await self._alone(request, key)
        future: asyncio.Future[Outcome | _Alone] = asyncio.get_running_loop().create_future()
        waiting = _Waiting(request, key, future)
        self._waiting.append(waiting)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._max_wait, self._overdue)
        try:
            outcome = await waiting.future
        except asyncio.CancelledError:
            # Not sent yet: it never will be. Already in a call: that call goes on (and may
            # commit it), as a cancelled call of its own would.
            if waiting in self._waiting:
                self._waiting.remove(waiting)
            raise
        if isinstance(outcome, _Alone):
            return await self._alone(request, key)
        return outcome

    async def _alone(self, request: Request, key: Key) -> Outcome:
        self._calls += 1
        try:
            return await self._send_one(request, key)
        finally:
            self._calls -= 1
            self._start_calls()

    def _start_calls(self) -> None:
        """Start calls for the waiting appends while a slot is free, shared evenly among the
        free slots: calls that run side by side keep the server's cores and the client busy
        at once."""
        while self._waiting and self._calls < self._max_calls and not self._gathering:
            free = self._max_calls - self._calls
            self._start_call(-(-len(self._waiting) // free))

    def _gathered(self) -> None:
        self._gathering = False
        self._start_calls()

    def _overdue(self) -> None:
        """The oldest waiting append has waited ``max_wait``: send what waits now, slot or
        not."""
        self._timer = None
        while self._waiting:
            self._start_call(self._max_batch)

    def _start_call(self, size: int) -> None:
        batch = self._take(min(size, self._max_batch))
        if not batch:
            return
        self._calls += 1
        task = asyncio.get_running_loop().create_task(self._call(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(self, size: int) -> list[_Waiting[Request, Key, Outcome]]:
        """Up to ``size`` waiting appends that share the first one's key, in order."""
        batch: list[_Waiting[Request, Key, Outcome]] = []
        others: list[_Waiting[Request, Key, Outcome]] = []
        while self._waiting and len(batch) < size:
            waiting = self._waiting.popleft()
            if waiting.future.done():  # cancelled by its caller
                continue
            if batch and waiting.key != batch[0].key:
                others.append(waiting)
                continue
            batch.append(waiting)
        self._waiting.extendleft(reversed(others))
        if not self._waiting and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return batch

    async def _call(self, batch: list[_Waiting[Request, Key, Outcome]]) -> None:
        try:
            if len(batch) == 1:
                outcomes: list[Outcome | _Alone] = [
                    await self._send_one(batch[0].request, batch[0].key)
                ]
            else:
                outcomes = list(await self._send_many([w.request for w in batch], batch[0].key))
        except CallRolledBack:
            # Nothing of the call was written: each append may be sent alone, and only the
            # one at fault fails.
            outcomes = [_ALONE] * len(batch)
        except Exception as exc:
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            outcomes = []
        except BaseException:
            for waiting in batch:
                waiting.future.cancel()
            self._calls -= 1
            raise
        for waiting, outcome in zip(batch, outcomes, strict=False):
            if not waiting.future.done():
                waiting.future.set_result(outcome)
        self._calls -= 1
        # The tasks just woken run before this callback: what they append next waits for it.
        self._gathering = True
        asyncio.get_running_loop().call_soon(self._gathered)


__all__ = ["AppendCoalescer", "CallRolledBack"]
