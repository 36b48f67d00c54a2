"""The three workloads, the same for every store, each with a time cap, and episodic's fourth:
loads behind a compaction boundary.

A store that hits a cap stops there and the report says how far it got; nothing is
extrapolated.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field

from bench.peers.stores import Episodic, Store

WARMUP = 20


@dataclass
class Appends:
    messages: int
    seconds: float
    capped: bool
    #: (messages in the conversation when the window started, msg/s in the window)
    windows: list[tuple[int, float]] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else float("nan")


@dataclass
class Load:
    size: int
    loaded: int
    samples: list[float]
    #: behind a boundary: the seq it covers through, and the messages appended after it
    covers: int | None = None
    tail: int = 0

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000


@dataclass
class Loads:
    points: list[Load]
    capped_before: int | None = None  # first size not reached, if the cap stopped it


@dataclass
class Concurrent:
    messages: int
    target: int
    seconds: float
    capped: bool

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else float("nan")


async def warm(store: Store) -> None:
    spare = await store.conversation()
    for i in range(0, WARMUP, store.per_call):
        await store.append(spare, i)


async def appends(store: Store, n: int, cap_s: float, windows: int = 10) -> Appends:
    """``n`` sequential messages to one new conversation, ``per_call`` per append call."""
    conv = await store.conversation()
    step = store.per_call
    window = max(step, n // windows // step * step)
    done = 0
    seconds = 0.0
    out = Appends(0, 0.0, False)
    deadline = time.perf_counter() + cap_s
    while done < n:
        start_count = done
        t0 = time.perf_counter()
        while done < min(n, start_count + window):
            await store.append(conv, done)
            done += step
        dt = time.perf_counter() - t0
        seconds += dt
        out.windows.append((start_count, (done - start_count) / dt))
        if done < n and time.perf_counter() > deadline:
            out.capped = True
            break
    out.messages, out.seconds = done, seconds
    return out


async def loads(
    store: Store,
    sizes: list[int],
    calls: int,
    cap_s: float,
    per_size_cap_s: float,
    log: object = None,
) -> Loads:
    """One conversation grown to each size in turn (untimed), then ``calls`` timed loads of it
    (fewer once ``per_size_cap_s`` of loading is spent, at least 5)."""
    conv = await store.conversation()
    have = 0
    points: list[Load] = []
    deadline = time.perf_counter() + cap_s
    for size in sizes:
        if time.perf_counter() > deadline:
            return Loads(points, capped_before=size)
        await store.grow(conv, have, size - have)
        have = size
        loaded = await store.load(conv)  # warm
        samples: list[float] = []
        for _ in range(calls):
            t0 = time.perf_counter()
            loaded = await store.load(conv)
            samples.append(time.perf_counter() - t0)
            if len(samples) >= 5 and sum(samples) > per_size_cap_s:
                break
        points.append(Load(size, loaded, samples))
        if callable(log):
            log(f"  load @{size:,}: {points[-1].median_ms:.2f} ms over {len(samples)} calls")
    return Loads(points)


async def boundary_loads(
    store: Episodic,
    sizes: list[int],
    tail: int,
    calls: int,
    rounds: int,
    cap_s: float,
    per_size_cap_s: float,
    log: object = None,
) -> Loads:
    """For each size, its own conversation grown to ``size`` messages (untimed), a boundary
    through the last safe cut and a ``tail``-message tail; then, after one warm load each,
    ``calls`` timed ``load_context`` calls per size, rotating over the sizes in ``rounds``
    rounds so that a burst of noise hits every size alike (fewer calls, at least 5, once
    ``per_size_cap_s`` of loading is spent). Growth is capped at ``cap_s``; the sizes built
    by then are measured."""
    deadline = time.perf_counter() + cap_s
    built: list[tuple[int, uuid.UUID, int]] = []
    capped_before = None
    for size in sizes:
        if time.perf_counter() > deadline:
            capped_before = size
            break
        t0 = time.perf_counter()
        conv, covers = await store.behind_boundary(size, tail)
        built.append((size, conv, covers))
        if callable(log):
            log(f"  built @{size:,} + {tail} tail in {time.perf_counter() - t0:.1f} s")
    loaded: dict[int, int] = {}
    samples: dict[int, list[float]] = {size: [] for size, _, _ in built}
    for size, conv, _ in built:
        loaded[size] = await store.load(conv)  # warm
    per_round = [calls // rounds + (1 if r < calls % rounds else 0) for r in range(rounds)]
    for n in per_round:
        for size, conv, _ in built:
            got = samples[size]
            for _ in range(n):
                if len(got) >= 5 and sum(got) > per_size_cap_s:
                    break
                t0 = time.perf_counter()
                loaded[size] = await store.load(conv)
                got.append(time.perf_counter() - t0)
    points = [
        Load(size, loaded[size], samples[size], covers=covers, tail=tail)
        for size, _, covers in built
    ]
    if callable(log):
        for p in points:
            log(
                f"  load behind a boundary @{p.size:,}: {p.median_ms:.2f} ms over "
                f"{len(p.samples)} calls, {p.loaded} messages returned"
            )
    return Loads(points, capped_before=capped_before)


async def concurrent(
    store: Store, tasks: int, conversations: int, per_task: int, cap_s: float
) -> Concurrent:
    """``tasks`` tasks, each appending round-robin to its own ``conversations`` (created
    untimed); ``per_task`` messages per task unless the cap stops them first."""
    await store.concurrent_setup(tasks)
    views = [store.for_task(t) for t in range(tasks)]
    owned = [[await store.conversation() for _ in range(conversations)] for _ in range(tasks)]
    step = store.per_call
    counts = [0] * tasks
    deadline = time.perf_counter() + cap_s
    capped = False

    async def run(t: int) -> None:
        nonlocal capped
        view, convs = views[t], owned[t]
        next_index = [0] * conversations
        calls = 0
        while counts[t] < per_task:
            k = calls % conversations
            await view.append(convs[k], next_index[k])
            next_index[k] += step
            counts[t] += step
            calls += 1
            if time.perf_counter() > deadline and counts[t] < per_task:
                capped = True
                return

    start = time.perf_counter()
    await asyncio.gather(*(run(t) for t in range(tasks)))
    seconds = time.perf_counter() - start
    return Concurrent(sum(counts), tasks * per_task, seconds, capped)
