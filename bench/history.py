"""Does cost grow with history? Append latency and ``load_context`` at several history lengths.

Each length gets its own conversation, grown first; the measurements then rotate over the
lengths in rounds, so a burst of noise on the shared machine hits every length alike.
"""

from __future__ import annotations

from typing import Protocol, TypeVar
from uuid import UUID

from bench import ours
from bench.stats import Latency, split
from bench.workload import History
from episodic import EpisodicStore

LOAD_BUDGET_S = 5.0
Loaded = tuple[int, Latency]
K = TypeVar("K")


async def grown(store: EpisodicStore, sizes: list[int]) -> dict[int, UUID]:
    """A conversation of exactly ``size`` events for each size."""
    convs = {}
    for size in sizes:
        conv = await store.create_conversation(tenant_id="bench")
        await ours.grow(store, conv, History(f"g{size}"), 0, size)
        convs[size] = conv
    return convs


class Timed(Protocol):
    """A loader run in blocks: ``ours.Loader`` or ``raw.Loader``."""

    async def block(self, n: int, budget_s: float, min_calls: int = 10) -> None: ...

    def result(self) -> Loaded: ...


async def loads(loaders: dict[K, Timed], calls: int, rounds: int) -> dict[K, Loaded]:
    """Each loader ``calls`` times, in ``rounds`` rotations, so that they share the machine's
    drift (raw asyncpg's references among episodic's loads)."""
    for part in split(calls, rounds):
        for loader in loaders.values():
            await loader.block(part, LOAD_BUDGET_S)
    return {key: loader.result() for key, loader in loaders.items()}


async def append_windows(
    store: EpisodicStore, convs: dict[int, UUID], appends: int, rounds: int
) -> dict[int, Latency]:
    windows = {size: ours.Sequential(store, conv) for size, conv in convs.items()}
    for part in split(appends, rounds):
        for window in windows.values():
            await window.block(part)
    return {size: window.result()[1] for size, window in windows.items()}


async def behind_boundaries(store: EpisodicStore, sizes: list[int]) -> dict[int, UUID]:
    return {size: await ours.behind_boundary(store, size, f"b{size}") for size in sizes}
