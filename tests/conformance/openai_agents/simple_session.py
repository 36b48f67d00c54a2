"""Replaces the OpenAI Agents SDK's ``tests/utils/simple_session.py`` (copied over it by
``run.py``): ``SimpleListSession``, the in-memory session that 25+ of the SDK's runtime test
files use, becomes an :class:`~episodic.integrations.openai_agents.EpisodicSession` on a real
store, so those files drive the Runner's whole session machinery (saving turns, rewinding
with ``pop_item``, resuming, deferred writes, compaction) through episodic.

Every instance gets a tenant of its own (the tests' session ids repeat: ``"test"``) on the
database of ``EPISODIC_CONFORMANCE_URL``. The SDK's tests read
``saved_items`` and ``_items`` without awaiting: they are a copy of the view, refreshed after
each call. Each instance records the test that made it, so run.py can count the cases that
went through episodic.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory.session import OpenAIResponsesCompactionArgs
from agents.memory.session_settings import SessionSettings
from agents.run_context import RunContextWrapper

from episodic import EpisodicStore
from episodic.integrations.openai_agents import EpisodicSession, session_settings_of
from episodic.settings import EpisodicSettings

URL = os.environ["EPISODIC_CONFORMANCE_URL"]
#: Where each instance notes its test (one line each): run.py counts the distinct ones.
CASES = Path(os.environ["EPISODIC_CONFORMANCE_CASES"])

#: A pool per call: pytest-asyncio gives each test a loop of its own, and a pool belongs to
#: one loop, so a store opened in one test cannot serve the next.
SETTINGS = EpisodicSettings(_env_file=None, pool_min_size=0, pool_max_size=1)


class ConnectedSession(EpisodicSession):
    """An EpisodicSession whose every call runs on an EpisodicSession of its own, on a store
    opened for that call, on a tenant of its own (some tests share one session object among
    threads, each with its loop: nothing a call uses is kept on the shared object)."""

    def __init__(
        self, session_id: str, tenant: str, settings: SessionSettings | dict[str, Any] | None
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings_of(settings)
        self._tenant = tenant
        self._pending: list[TResponseInputItem] = []
        self._view: list[TResponseInputItem] = []

    @asynccontextmanager
    async def _connected(self, *, refresh: bool = False) -> AsyncIterator[EpisodicSession]:
        """The session on a store opened for this call (and, first, the history given to
        the constructor, appended like any items); ``refresh``: the view copied after."""
        store = await EpisodicStore.open(URL, settings=SETTINGS)
        try:
            session = EpisodicSession(
                self.session_id,
                store.for_tenant(self._tenant),
                session_settings=self.session_settings,  # a test may have set its own
            )
            if self._pending:
                pending, self._pending = self._pending, []
                await session.add_items(pending)
            yield session
            if refresh:
                self._view[:] = await session.get_items()
        finally:
            await store.close()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        async with self._connected() as session:
            return await session.get_items(limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        async with self._connected(refresh=True) as session:
            await session.add_items([cast(Any, dict(item)) for item in items])

    async def pop_item(self) -> TResponseInputItem | None:
        async with self._connected(refresh=True) as session:
            return await session.pop_item()

    async def clear_session(self) -> None:
        async with self._connected(refresh=True) as session:
            await session.clear_session()

    async def _read_view(self) -> Any:
        async with self._connected() as session:
            return await session._read_view()

    async def _write_compaction(self, view: Any, handoff: list[dict[str, Any]]) -> bool:
        async with self._connected(refresh=True) as session:
            return await session._write_compaction(view, handoff)

    async def run_compaction(
        self,
        args: OpenAIResponsesCompactionArgs | None = None,
        *,
        wrapper: RunContextWrapper[Any] | None = None,
    ) -> None:
        async with self._connected() as session:
            await session.run_compaction(args, wrapper=wrapper)


class SimpleListSession(ConnectedSession):
    """The SDK tests' in-memory session, on episodic."""

    # The SDK's list session has no suffix-snapshot hook, and its tests pin the compaction
    # path a store without one takes; the backend files test the hook (run.py).
    _get_compaction_snapshot = None  # type: ignore[assignment]

    def __init__(
        self,
        session_id: str = "test",
        history: list[TResponseInputItem] | None = None,
    ) -> None:
        super().__init__(session_id, f"sdk-{uuid.uuid4().hex[:12]}", None)
        self._pending = list(history) if history else []
        # Some session implementations strip IDs on write; tests can opt in via attribute.
        self._ignore_ids_for_matching = False
        self._view = list(self._pending)
        with CASES.open("a") as cases:
            cases.write(os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0] + "\n")

    @property
    def saved_items(self) -> list[TResponseInputItem]:
        return self._view

    @property
    def _items(self) -> list[TResponseInputItem]:
        return self._view


class CountingSession(SimpleListSession):
    """Session that tracks how many times pop_item is invoked (for rewind tests)."""

    def __init__(
        self,
        session_id: str = "test",
        history: list[TResponseInputItem] | None = None,
    ) -> None:
        super().__init__(session_id=session_id, history=history)
        self.pop_calls = 0

    async def pop_item(self) -> TResponseInputItem | None:
        self.pop_calls += 1
        return await super().pop_item()


class IdStrippingSession(CountingSession):
    """Session that strips IDs on add to mimic hosted stores that reassign IDs."""

    def __init__(
        self,
        session_id: str = "test",
        history: list[TResponseInputItem] | None = None,
    ) -> None:
        super().__init__(session_id=session_id, history=history)
        self._ignore_ids_for_matching = True

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        sanitized: list[TResponseInputItem] = []
        for item in items:
            if isinstance(item, dict):
                clean = dict(item)
                clean.pop("id", None)
                sanitized.append(cast(TResponseInputItem, clean))
            else:
                sanitized.append(item)
        await super().add_items(sanitized)
