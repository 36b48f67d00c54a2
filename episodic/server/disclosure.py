"""What an error may tell the caller, and what only the server's log may hold.

An error's own message is written for the operator: a database's refusal quotes the driver,
whose text can carry the statement (``[SQL: SELECT ... FROM episodic_api_keys ...]``), the
tables and the database URL. So a 5xx, and any error the database raised, answers with
its class and a fixed sentence of this module's; its message goes to the log, under the
request's id, which the answer carries so that the two can be matched.
"""

from __future__ import annotations

import logging

from episodic import errors

logger = logging.getLogger("episodic.server.errors")

#: The top-level packages whose exceptions are a database driver's (or SQLAlchemy's).
DRIVER_PACKAGES = frozenset(
    {"asyncpg", "sqlalchemy", "sqlite3", "aiosqlite", "psycopg", "psycopg2"}
)
#: What an error says instead of its message, by class, most specific first.
PUBLIC_DETAILS: tuple[tuple[type[errors.EpisodicError], str], ...] = (
    (
        errors.SchemaNotMigratedError,
        "the database is not ready: its episodic schema is missing or out of date; retry later",
    ),
    (
        errors.OverloadedError,
        "the server has as many requests in flight as it can serve; nothing was done; retry "
        "after Retry-After seconds",
    ),
    (errors.DatabaseUnavailableError, "the database cannot be reached; retry later"),
    (errors.LockTimeoutError, "the database is busy; nothing was written; retry later"),
    (
        errors.StorageFullError,
        "the database server is out of disk space; nothing was written; retry (a write with "
        "the same Idempotency-Key) once its operator has freed space",
    ),
    (
        errors.TransientDatabaseError,
        "the database failed for a moment; retry (a write with the same Idempotency-Key)",
    ),
    (
        errors.CompactionUnavailableError,
        "this server has no summarizer, so it cannot compact now; the worker still compacts "
        "due conversations",
    ),
    (errors.IntegrityViolationError, "the database refused the write; nothing was written"),
    (errors.TenantDeniedError, "the database refused this operation; nothing was written"),
    (
        errors.ValidationError,
        "the database cannot store this input (text holding a NUL character, say); nothing "
        "was written",
    ),
)
#: What any other withheld error says.
FALLBACK_DETAIL = "the server could not do this; its log has why"
#: What an error that is not episodic's (a bug) says.
UNEXPECTED_DETAIL = "an unexpected error; the server's log has it under this request's id"


def from_database(error: BaseException) -> bool:
    """Whether ``error`` was raised for a database driver's error (one is in its chain of
    causes): its message quotes the driver."""
    seen: set[int] = set()
    cause = _cause(error)
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if type(cause).__module__.split(".")[0] in DRIVER_PACKAGES:
            return True
        cause = _cause(cause)
    return False


def _cause(error: BaseException) -> BaseException | None:
    """What ``error`` was raised for: its ``from``, else the error being handled when it was
    raised (unless ``from None`` said that one is not its cause)."""
    if error.__cause__ is not None or error.__suppress_context__:
        return error.__cause__
    return error.__context__


def withheld(error: errors.EpisodicError, status: int) -> bool:
    """Whether the answer to ``error`` must not carry its message: a server error, or one the
    database raised."""
    return status >= 500 or from_database(error)


def public_detail(error: errors.EpisodicError, status: int, request_id: str | None) -> str:
    """What the answer to ``error`` (with ``status``) says: its own message when that is
    written for the caller; else a fixed sentence for its class, the message logged with
    ``request_id``."""
    if not withheld(error, status):
        return str(error)
    logger.warning("request %s answered %d %s: %s", request_id, status, type(error).__name__, error)
    return next((said for cls, said in PUBLIC_DETAILS if isinstance(error, cls)), FALLBACK_DETAIL)


__all__ = [
    "FALLBACK_DETAIL",
    "PUBLIC_DETAILS",
    "UNEXPECTED_DETAIL",
    "from_database",
    "public_detail",
    "withheld",
]
