"""Database errors become episodic errors here, and only here.

By SQLSTATE for PostgreSQL (asyncpg raises them directly; SQLAlchemy wraps them), by message
for SQLite. Anything not recognised is re-raised unchanged: hiding an unknown failure behind a
generic error would make it harder to diagnose.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from episodic.errors import (
    DatabaseUnavailableError,
    EpisodicError,
    IntegrityViolationError,
    LockTimeoutError,
    SchemaNotMigratedError,
    StorageFullError,
    TenantDeniedError,
    TransientDatabaseError,
    ValidationError,
)

#: Connection lost or refused, server shutting down, serialization failure, deadlock.
TRANSIENT_SQLSTATE_CLASSES = ("08", "57P")
#: (25006, read-only transaction: the server this connection reached is a standby now; the
#: pool drops the connection (postgres/pool.py) and the next one finds the writable host.)
TRANSIENT_SQLSTATES = {"40001", "40P01", "53300", "57014", "25006"}
#: disk_full: PostgreSQL could not extend a table's file or write a temporary one; the
#: statement's transaction is rolled back, so nothing was written. (A full WAL volume is no
#: error but a PANIC: the server restarts and clients see a dropped connection.)
DISK_FULL = "53100"
#: insufficient_resources, out_of_memory: the server is short of memory (or of another
#: resource) for a moment.
RESOURCE_SHORTAGE_SQLSTATES = {"53000", "53200"}
LOCK_NOT_AVAILABLE = "55P03"
NOT_MIGRATED_SQLSTATES = {"42P01", "42883"}  # undefined table, undefined function
PRIVILEGE_SQLSTATE = "42501"
#: Integrity constraint violations: the store checks for every one it expects (a taken id, a
#: reused key), so one that reaches here means a row was changed outside episodic.
INTEGRITY_SQLSTATE_CLASS = "23"
#: What a server says when it will not let this client in, and what to do about each.
#: (Too many clients and "starting up" stay plain transient errors: a moment later a
#: retry connects.)
CONNECTION_REFUSALS = {
    "3D000": "create the database (createdb NAME, or CREATE DATABASE) or fix its name in the URL",
    "28000": "create the role, or fix the user name in the URL",
    "28P01": "check the password in the URL",
    "42501": "grant the role CONNECT on the database, or connect as another role",
}
#: character not in repertoire, untranslatable character, numeric value out of range,
#: datetime field overflow: input the database cannot store or compute with. The store checks
#: its input first; these catch what slips past, such as a sum of bounded counts overflowing.
UNSTORABLE_SQLSTATES = {"22021", "22P05", "22003", "22008"}

#: asyncpg's error when every host of a multi-host URL answered but none was what
#: ``target_session_attrs`` asks for (all standbys, say, while one is being promoted)
_NO_HOST_MATCHES = "TargetServerAttributeNotMatched"
_NOT_WRITABLE = (
    "no host in the URL was reachable and writable; during a failover this lasts until a "
    "standby is promoted (retry), otherwise check that the primary is running and named in "
    "the URL"
)
_NOT_MIGRATED = "the episodic schema is missing or out of date: run `episodic migrate`"
_DISK_FULL = (
    "the database server is out of disk space ({said}); nothing was written: free space on "
    "the volume that holds the database's data (or grow it), and writes resume by themselves"
)
_UNREACHABLE = (
    "check the host and port in the URL (EPISODIC_DATABASE_URL or --database-url) and that "
    "the server is running and accepts TCP connections"
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it wraps: SQLAlchemy's ``orig``, else its cause or context (leaving
    a transaction on a dead connection raises a second error while the first, with its
    SQLSTATE, is being handled)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        current = (
            orig if isinstance(orig, BaseException) else current.__cause__ or current.__context__
        )


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of the outermost error in ``exc``'s chain that has one."""
    for link in _chain(exc):
        state = getattr(link, "sqlstate", None)
        if isinstance(state, str):
            return state
    return None


#: asyncpg's words for a connection that died under it (no SQLSTATE): a terminated backend's
#: FATAL read before the socket's close (MagicStack/asyncpg#1069), or a transaction left on a
#: closed connection.
_DEAD_CONNECTION_ERRORS = ("ConnectionDoesNotExistError", "InternalClientError", "InterfaceError")
_DEAD_CONNECTION_WORDS = ("connection is closed", "connection was closed", "cannot switch to state")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _server_said(exc: BaseException) -> str:
    """What the server said, on one line, without the statement SQLAlchemy adds: the message
    of the driver's own error (the innermost one in ``exc``'s chain with a SQLSTATE)."""
    found = exc
    for link in _chain(exc):
        if isinstance(getattr(link, "sqlstate", None), str):
            found = link
    message = getattr(found, "message", None)  # asyncpg's: without the HINT line
    return " ".join(message.split()) if isinstance(message, str) and message else _one_line(found)


def connection_refused(
    exc: BaseException, url: str, *, several_hosts: bool = False
) -> DatabaseUnavailableError | None:
    """``exc``, raised while opening a connection to ``url`` (masked), as the error that says
    what to do about it; None when it is not a refusal of the connection (the caller then
    translates it as any other error). Only for connection attempts: a 42501 or an OSError
    in the middle of a session means something else."""
    state = _sqlstate(exc)
    if state is not None:
        advice = CONNECTION_REFUSALS.get(state)
        if advice is None:
            return None
        return DatabaseUnavailableError(
            f"cannot connect to {url}: {_one_line(exc)}; {advice}", url=url
        )
    if type(exc).__name__ == _NO_HOST_MATCHES or (several_hosts and isinstance(exc, OSError)):
        # (The error is the last host's; an earlier one may have been down or a standby.)
        what = "no answer in time" if isinstance(exc, TimeoutError) else _one_line(exc)
        return DatabaseUnavailableError(
            f"cannot connect to {url}: {what}; {_NOT_WRITABLE}", url=url
        )
    if isinstance(exc, TimeoutError):
        return DatabaseUnavailableError(
            f"cannot connect to {url}: no answer in time; {_UNREACHABLE}", url=url
        )
    if isinstance(exc, OSError):
        return DatabaseUnavailableError(
            f"cannot connect to {url}: {_one_line(exc)}; {_UNREACHABLE}", url=url
        )
    return None


# Citus relays a worker's violation as text only, naming the shard's copy of the constraint
# (the table's name with the shard id appended, as the shard's).
_VIOLATION = re.compile(
    r'relation "(?P<relation>[^"]+)" violates [a-z ]*constraint "(?P<constraint>[^"]+)"'
)
_SHARD_SUFFIX = re.compile(r"_(\d+)$")


def _constraint_in_message(message: str) -> str | None:
    found = _VIOLATION.search(message)
    if found is None:
        return None
    constraint = found["constraint"]
    shard = _SHARD_SUFFIX.search(found["relation"])
    if shard is not None and constraint.endswith(shard.group(0)):
        constraint = constraint[: -len(shard.group(0))]
    return constraint


def _translate(exc: BaseException, url: str | None) -> BaseException | None:
    if isinstance(exc, EpisodicError):
        return None  # already ours (a refused connection, translated where it was made)
    state = _sqlstate(exc)
    if state is not None:
        if state in NOT_MIGRATED_SQLSTATES:
            return SchemaNotMigratedError(
                f"{_NOT_MIGRATED} ({_one_line(exc)})", revision=None, expected=None
            )
        if state.startswith(INTEGRITY_SQLSTATE_CLASS):
            constraint = getattr(exc, "constraint_name", None) or getattr(
                getattr(exc, "orig", None), "constraint_name", None
            )
            if not isinstance(constraint, str):
                constraint = _constraint_in_message(str(exc))
            return IntegrityViolationError(
                f"the database refused the write ({_one_line(exc)}): episodic's tables were "
                "probably changed outside episodic; nothing was written",
                constraint=constraint if isinstance(constraint, str) else None,
            )
        if state in UNSTORABLE_SQLSTATES:
            return ValidationError(f"the database cannot store this input: {exc}")
        if state == DISK_FULL:
            return StorageFullError(_DISK_FULL.format(said=_server_said(exc)))
        if state == LOCK_NOT_AVAILABLE:
            return LockTimeoutError(f"gave up waiting for a lock held by another session: {exc}")
        if state == PRIVILEGE_SQLSTATE:
            return TenantDeniedError(f"the database refused this operation: {exc}")
        if (
            state in TRANSIENT_SQLSTATES
            or state in RESOURCE_SHORTAGE_SQLSTATES
            or state.startswith(TRANSIENT_SQLSTATE_CLASSES)
        ):
            return TransientDatabaseError(f"transient database failure ({state}): {exc}")
        return None
    orig = getattr(exc, "orig", exc)
    if isinstance(orig, sqlite3.OperationalError):
        text = str(orig)
        if "no such table" in text:
            return SchemaNotMigratedError(f"{_NOT_MIGRATED} ({text})", revision=None, expected=None)
        if "database or disk is full" in text:
            return StorageFullError(_DISK_FULL.format(said=f"SQLite: {text}"))
        if "locked" in text or "busy" in text:
            return TransientDatabaseError(f"SQLite database is busy: {text}")
        if "unable to open" in text:
            where = url or "file"
            return DatabaseUnavailableError(
                f"cannot open the SQLite database {where}: {text}; check that the path is "
                "right and that its directory exists and is writable",
                url=where,
            )
        return None
    if isinstance(orig, sqlite3.IntegrityError):
        return IntegrityViolationError(
            f"the database refused the write ({orig}): episodic's tables were probably "
            "changed outside episodic; nothing was written"
        )
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


def translated(exc: Exception, url: str | None = None) -> BaseException:
    """``exc`` as the episodic error to raise ``from`` it (``exc`` itself when it is not one
    episodic knows): for the request path, which catches without a context manager."""
    return _translate(exc, url) or exc


@contextmanager
def translated_errors(url: str | None = None) -> Iterator[None]:
    """Re-raise driver errors as episodic errors, ``from`` the original. ``url`` (masked) is
    named in the error of a SQLite file that cannot be opened."""
    try:
        yield
    except Exception as exc:
        translated = _translate(exc, url)
        if translated is None:
            raise
        raise translated from exc


__all__ = ["connection_refused", "translated", "translated_errors"]
