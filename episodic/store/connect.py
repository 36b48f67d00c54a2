"""The one place that chooses a backend for a database URL and builds it from the settings:
the only shared store module that imports either backend."""

from __future__ import annotations

from episodic.settings import EpisodicSettings
from episodic.store.backend import Backend
from episodic.store.engine import DatabaseUrl
from episodic.store.postgres import PostgresBackend
from episodic.store.sqlite import SqliteBackend


async def open_backend(url: DatabaseUrl, settings: EpisodicSettings) -> Backend:
    """A connected backend for ``url``: PostgreSQL (its pool, timeouts, coalescing and Citus
    shard count from ``settings``) or SQLite."""
    if url.dialect == "postgresql":
        return await PostgresBackend.connect(
            url,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            server_settings={
                "lock_timeout": str(settings.lock_timeout_ms),
                "idle_in_transaction_session_timeout": str(settings.idle_in_transaction_timeout_ms),
            },
            connect_timeout=settings.connect_timeout_seconds,
            append_calls=settings.append_calls,
            citus_shard_count=settings.citus_shard_count,
        )
    return await SqliteBackend.connect(url)


__all__ = ["open_backend"]
