"""The coalescer's scheduling, with send functions that record what they were given (the
database side is tests/integration/test_coalesced_appends.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from episodic.store.postgres.coalesce import AppendCoalescer, CallRolledBack


class Sender:
    """Records each call; a call ends when ``release`` is set (at once by default)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], str]] = []
        self.running = 0
        self.most_running = 0
        self.release = asyncio.Event()
        self.release.set()
        self.roll_back: set[int] = set()

    async def _run(self, kind: str, requests: list[int], key: str) -> None:
        self.calls.append((kind, requests, key))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.release.wait()
            await asyncio.sleep(0)
        finally:
            self.running -= 1

    async def one(self, request: int, key: str) -> str:
        await self._run("one", [request], key)
        if request in self.roll_back:
            raise ValueError(f"refused {request}")
        return f"{key}:{request}"

    async def many(self, requests: Sequence[int], key: str) -> list[str]:
        await self._run("many", list(requests), key)
        if self.roll_back & set(requests):
            raise CallRolledBack
        return [f"{key}:{r}" for r in requests]


def _coalescer(sender: Sender, calls: int = 1, wait: float = 5.0) -> AppendCoalescer[int, str, str]:
    return AppendCoalescer(sender.one, sender.many, max_calls=calls, max_wait=wait)


async def test_an_append_with_a_free_slot_goes_alone_at_once() -> None:
    sender = Sender()
    coalescer = _coalescer(sender)
    assert [await coalescer.append(i, "k") for i in range(3)] == ["k:0", "k:1", "k:2"]
    assert [kind for kind, _, _ in sender.calls] == ["one"] * 3


async def test_appends_beyond_the_calls_in_flight_go_together() -> None:
    sender = Sender()
    coalescer = _coalescer(sender, calls=2)
    outcomes = await asyncio.gather(*(coalescer.append(i, "k") for i in range(10)))
    assert outcomes == [f"k:{i}" for i in range(10)]
    assert sender.most_running <= 2
    assert sender.calls[:2] == [("one", [0], "k"), ("one", [1], "k")]
    # The eight that waited, in the order they came, in the one slot the first call freed.
    assert sender.calls[2:] == [("many", [2, 3, 4, 5, 6, 7, 8, 9], "k")]


async def test_only_appends_with_the_same_key_share_a_call() -> None:
    sender = Sender()
    coalescer = _coalescer(sender)
    keys = ["a", "b", "a", "b", "a"]
    outcomes = await asyncio.gather(*(coalescer.append(i, k) for i, k in enumerate(keys)))
    assert outcomes == [f"{k}:{i}" for i, k in enumerate(keys)]
    for _, requests, key in sender.calls:
        assert all(keys[r] == key for r in requests)


async def test_a_rolled_back_call_sends_each_append_alone() -> None:
    sender = Sender()
    sender.roll_back = {3}
    coalescer = _coalescer(sender)
    outcomes = await asyncio.gather(
        *(coalescer.append(i, "k") for i in range(5)), return_exceptions=True
    )
    assert [str(o) for o in outcomes] == ["k:0", "k:1", "k:2", "refused 3", "k:4"]
    assert ("many", [1, 2, 3, 4], "k") in sender.calls
    assert [r for kind, (r,), _ in (c for c in sender.calls if c[0] == "one")] == [0, 1, 2, 3, 4]


async def test_an_append_waits_at_most_max_wait_for_a_slot() -> None:
    sender = Sender()
    coalescer = _coalescer(sender, wait=0.01)
    sender.release.clear()  # the first call hangs
    first = asyncio.ensure_future(coalescer.append(0, "k"))
    await asyncio.sleep(0)
    sender.release = asyncio.Event()  # later calls run
    sender.release.set()
    assert await asyncio.wait_for(coalescer.append(1, "k"), 1.0) == "k:1"
    assert not first.done()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_cancelled_waiting_append_is_never_sent() -> None:
    sender = Sender()
    coalescer = _coalescer(sender)
    sender.release.clear()
    first = asyncio.ensure_future(coalescer.append(0, "k"))
    waiting = asyncio.ensure_future(coalescer.append(1, "k"))
    kept = asyncio.ensure_future(coalescer.append(2, "k"))
    await asyncio.sleep(0)
    waiting.cancel()
    sender.release.set()
    assert await first == "k:0"
    assert await kept == "k:2"
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert all(1 not in requests for _, requests, _ in sender.calls)
