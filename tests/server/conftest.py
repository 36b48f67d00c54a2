"""The key store beside each test's store (tests of the HTTP API)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from episodic import EpisodicStore
from episodic.server.keys import KeyStore


@pytest.fixture
async def keys(store: EpisodicStore, database_url: str) -> AsyncIterator[KeyStore]:
    opened = KeyStore.open(database_url)
    try:
        yield opened
    finally:
        await opened.close()
