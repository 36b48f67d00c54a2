"""The names the SDK's backend session tests construct, ``SQLiteSession``,
``AsyncSQLiteSession`` and ``SQLAlchemySession``, as EpisodicSessions (run.py copies this file
into the SDK's tree as ``tests/utils/episodic_backends.py`` and points those tests' imports
here). A database the
tests name (a file, a URL, an engine) is a tenant of the conformance database: sessions on
the same one share it, ``:memory:`` is a new one each time."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from agents.memory.session_settings import SessionSettings

from tests.utils.simple_session import CASES, ConnectedSession


def _tenant(kind: str, name: str) -> str:
    if ":memory:" in name:
        return f"{kind}-{uuid.uuid4().hex[:12]}"
    return f"{kind}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"


def _note() -> None:
    import os

    with CASES.open("a") as cases:
        cases.write(os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0] + "\n")


class SQLiteSession(ConnectedSession):
    """``SQLiteSession(session_id, db_path=":memory:", ...)``, on episodic."""

    def __init__(
        self,
        session_id: str,
        db_path: Any = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: SessionSettings | None = None,
    ) -> None:
        super().__init__(session_id, _tenant("sqlite", str(db_path)), session_settings)
        _note()

    def close(self) -> None:
        """Nothing to close: every call opens and closes its own connections."""


class AsyncSQLiteSession(SQLiteSession):
    """``AsyncSQLiteSession(session_id, db_path=":memory:", ...)``, on episodic."""

    async def close(self) -> None:  # type: ignore[override]
        """Nothing to close: every call opens and closes its own connections."""


class _Engine:
    """What ``SQLAlchemySession.from_url`` makes ``.engine`` of: the tenant its URL names,
    so a session made with ``engine=backend.engine`` shares the other's history."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant

    async def dispose(self) -> None:
        """Nothing to dispose of: every call opens and closes its own connections."""


class SQLAlchemySession(ConnectedSession):
    """``SQLAlchemySession(session_id, engine=..., ...)`` and ``.from_url(...)``, on episodic."""

    def __init__(
        self,
        session_id: str,
        *,
        engine: Any,
        create_tables: bool = False,
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: SessionSettings | None = None,
    ) -> None:
        tenant = engine.tenant if isinstance(engine, _Engine) else f"engine-{id(engine)}"
        super().__init__(session_id, tenant, session_settings)
        self.engine = engine
        _note()

    @classmethod
    def from_url(
        cls,
        session_id: str,
        *,
        url: str,
        engine_kwargs: dict[str, Any] | None = None,
        session_settings: SessionSettings | None = None,
        **kwargs: Any,
    ) -> SQLAlchemySession:
        session = cls.__new__(cls)
        engine = _Engine(_tenant("url", url))
        ConnectedSession.__init__(session, session_id, engine.tenant, session_settings)
        session.engine = engine
        _note()
        return session

    async def close(self) -> None:
        """Nothing to close: every call opens and closes its own connections."""
