"""Database errors become episodic errors here, and only here.

By SQLSTATE for PostgreSQL (asyncpg raises them directly; SQLAlchemy wraps them), by message
for SQLite. Anything not recognised is re-raised unchanged: hiding an unknown failure behind a
generic error would make it harder to diagnose.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from episodic.errors import (
    ConfigurationError,
    LockTimeoutError,
    TenantDeniedError,
    TransientDatabaseError,
    ValidationError,
)

#: Connection lost or refused, server shutting down, serialization failure, deadlock.
TRANSIENT_SQLSTATE_CLASSES = ("08", "57P")
TRANSIENT_SQLSTATES = {"40001", "40P01", "53300", "57014"}
LOCK_NOT_AVAILABLE = "55P03"
NOT_MIGRATED_SQLSTATES = {"42P01", "42883"}  # undefined table, undefined function
PRIVILEGE_SQLSTATE = "42501"
#: character not in repertoire, untranslatable character, numeric value out of range,
#: datetime field overflow: input the database cannot store or compute with. The store checks
#: its input first; these catch what slips past, such as a sum of bounded counts overflowing.
UNSTORABLE_SQLSTATES = {"22021", "22P05", "22003", "22008"}

_NOT_MIGRATED = "the episodic schema is missing or out of date: run `episodic migrate`"


def _sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    if isinstance(state, str):
        return state
    orig = getattr(exc, "orig", None)
    if orig is not None and orig is not exc:
        return _sqlstate(orig)
    # __context__ too: leaving a transaction on a dead connection raises a second error
    # while the first (with its SQLSTATE) is being handled.
    linked = exc.__cause__ or exc.__context__
    return _sqlstate(linked) if linked is not None and linked is not exc else None


#: asyncpg's words for a connection that died under it (no SQLSTATE): a terminated backend's
#: FATAL read before the socket's close (MagicStack/asyncpg#1069), or a transaction left on a
#: closed connection.
_DEAD_CONNECTION_ERRORS = ("ConnectionDoesNotExistError", "InternalClientError", "InterfaceError")
_DEAD_CONNECTION_WORDS = ("connection is closed", "connection was closed", "cannot switch to state")


def _translate(exc: BaseException) -> BaseException | None:
    state = _sqlstate(exc)
    if state is not None:
        if state in NOT_MIGRATED_SQLSTATES:
            return ConfigurationError(f"{_NOT_MIGRATED} ({exc})")
        if state in UNSTORABLE_SQLSTATES:
            return ValidationError(f"the database cannot store this input: {exc}")
        if state == LOCK_NOT_AVAILABLE:
            return LockTimeoutError(f"gave up waiting for a lock held by another session: {exc}")
        if state == PRIVILEGE_SQLSTATE:
            return TenantDeniedError(f"the database refused this operation: {exc}")
        if state in TRANSIENT_SQLSTATES or state.startswith(TRANSIENT_SQLSTATE_CLASSES):
            return TransientDatabaseError(f"transient database failure ({state}): {exc}")
        return None
    orig = getattr(exc, "orig", exc)
    if isinstance(orig, sqlite3.OperationalError):
        text = str(orig)
        if "no such table" in text:
            return ConfigurationError(f"{_NOT_MIGRATED} ({text})")
        if "locked" in text or "busy" in text:
            return TransientDatabaseError(f"SQLite database is busy: {text}")
        return None
    if isinstance(exc, ConnectionError | OSError) or (
        isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated
    ):
        return TransientDatabaseError(f"database connection failed: {exc}")
    if type(exc).__name__ == "ConnectionDoesNotExistError" or (
        type(exc).__name__ in _DEAD_CONNECTION_ERRORS
        and any(words in str(exc) for words in _DEAD_CONNECTION_WORDS)
    ):
        return TransientDatabaseError(f"database connection failed: {exc}")
    return None


@contextmanager
def translated_errors() -> Iterator[None]:
    """Re-raise driver errors as episodic errors, ``from`` the original."""
    try:
        yield
    except Exception as exc:
        translated = _translate(exc)
        if translated is None:
            raise
        raise translated from exc


__all__ = ["translated_errors"]
