"""The same workloads through episodic's public API."""

from __future__ import annotations

import asyncio
import time
from uuid import UUID

from bench.stats import Latency, Throughput
from bench.workload import History, text
from episodic import BoundaryRequest, EpisodicStore, Message

BATCH = 1_000
TAIL = 200
SUMMARY = "Handoff: " + " ".join(text(i) for i in range(5))


class Sequential:
    """Single-message appends to one new conversation, run in blocks (see raw.Sequential)."""

    def __init__(self, store: EpisodicStore, conversation: UUID) -> None:
        self._store = store
        self.conversation = conversation
        self.samples: list[float] = []
        self.seconds = 0.0

    @classmethod
    async def open(cls, store: EpisodicStore, warmup: int = 20) -> Sequential:
        spare = await store.create_conversation(tenant_id="bench")
        for i in range(warmup):
            await store.append(spare, [Message.user(text(i))])
        return cls(store, await store.create_conversation(tenant_id="bench"))

    async def block(self, n: int) -> None:
        store, conv, samples = self._store, self.conversation, self.samples
        first = len(samples)
        start = time.perf_counter()
        for i in range(first, first + n):
            t0 = time.perf_counter()
            await store.append(conv, [Message.user(text(i))])
            samples.append(time.perf_counter() - t0)
        self.seconds += time.perf_counter() - start

    def result(self) -> tuple[Throughput, Latency]:
        return Throughput(len(self.samples), self.seconds), Latency(tuple(self.samples))


async def concurrent(
    store: EpisodicStore, tasks: int, conversations: int, per_task: int
) -> Throughput:
    """``tasks`` tasks, each appending round-robin to its own ``conversations``."""
    owned = [
        [await store.create_conversation(tenant_id="bench") for _ in range(conversations)]
        for _ in range(tasks)
    ]
    # Fill the pool with one connection per task before timing.
    await asyncio.gather(*(store.append(convs[0], [Message.user(text(0))]) for convs in owned))

    async def run(convs: list[UUID]) -> None:
        for i in range(per_task):
            await store.append(convs[i % conversations], [Message.user(text(i))])

    start = time.perf_counter()
    await asyncio.gather(*(run(convs) for convs in owned))
    return Throughput(tasks * per_task, time.perf_counter() - start)


async def grow(store: EpisodicStore, conv: UUID, history: History, last: int, target: int) -> int:
    """Batch-append until the conversation's last seq is ``target``; every batch ends at a safe
    cut. Returns the new last seq."""
    while last < target:
        n = min(BATCH, target - last)
        stored = await store.append(conv, history.take(n))
        last = stored[-1].seq
    return last


class Loader:
    """Timed ``load_context`` calls on one conversation, run in blocks; a block stops early
    once ``budget_s`` of loading has been spent and ``min_calls`` were made."""

    def __init__(self, store: EpisodicStore, conversation: UUID) -> None:
        self._store = store
        self.conversation = conversation
        self.samples: list[float] = []
        self.loaded = 0

    async def block(self, n: int, budget_s: float, min_calls: int = 10) -> None:
        if not self.samples:
            await self._store.load_context(self.conversation)  # warm
        for _ in range(n):
            if len(self.samples) >= min_calls and sum(self.samples) >= budget_s:
                return
            t0 = time.perf_counter()
            ctx = await self._store.load_context(self.conversation)
            self.samples.append(time.perf_counter() - t0)
            self.loaded = len(ctx.messages)

    def result(self) -> tuple[int, Latency]:
        return self.loaded, Latency(tuple(self.samples))


async def behind_boundary(store: EpisodicStore, size: int, name: str) -> UUID:
    """A conversation of ``size`` events, a boundary covering all of them, then a fixed
    200-message tail."""
    conv = await store.create_conversation(tenant_id="bench")
    history = History(name)
    last = await grow(store, conv, history, 0, size)
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary=SUMMARY,
            covers_through_seq=last,
            retained=[text(1), text(2)],
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conv, history.take(TAIL))
    return conv
