"""store/gc_pause.py: loads pause the cyclic collector, and it always comes back as it was."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from episodic.store.gc_pause import collection_paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_a_pause_restores_a_running_collector_even_on_error() -> None:
    gc.enable()
    seen: list[bool] = []

    def decode() -> None:
        with collection_paused():
            seen.append(gc.isenabled())
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        decode()
    assert seen == [False]
    assert gc.isenabled()


def test_a_stopped_collector_stays_stopped() -> None:
    gc.disable()
    with collection_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


async def test_overlapping_pauses_resume_when_the_last_ends() -> None:
    """Two pauses at once (two threads decoding), the first begun ending first: it must not
    restart the collector under the second."""
    gc.enable()
    first_done = asyncio.Event()
    second_paused = asyncio.Event()
    during_second: list[bool] = []

    async def first() -> None:
        with collection_paused():
            await second_paused.wait()
        first_done.set()

    async def second() -> None:
        with collection_paused():
            second_paused.set()
            await first_done.wait()
            during_second.append(gc.isenabled())

    await asyncio.gather(first(), second())
    assert during_second == [False]
    assert gc.isenabled()
