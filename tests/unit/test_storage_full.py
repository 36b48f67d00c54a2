"""A database server out of disk space is one typed error, :class:`StorageFullError`: the
translation of SQLSTATE 53100 (and of SQLite's "database or disk is full"), what the store's
retries do with it, and what HTTP answers. The real thing, a full volume under PostgreSQL,
is T18 (tests/reliability/test_t18_full_disk.py)."""

from __future__ import annotations

import sqlite3

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc

from episodic import StorageFullError, TransientDatabaseError, errors
from episodic.server.disclosure import PUBLIC_DETAILS
from episodic.server.problems import error_problem, status_of
from episodic.store.db_errors import translated, translated_errors
from episodic.store.retry import retry_transient

EXTEND = 'could not extend file "base/16385/16407": No space left on device'
ADVICE = (
    "nothing was written: free space on the volume that holds the database's data (or grow "
    "it), and writes resume by themselves"
)


def _disk_full() -> asyncpg.exceptions.DiskFullError:
    return asyncpg.exceptions.DiskFullError(EXTEND)


def test_disk_full_is_a_storage_full_error_that_says_what_to_do() -> None:
    with pytest.raises(StorageFullError) as raised, translated_errors():
        raise _disk_full()
    assert isinstance(raised.value, TransientDatabaseError)
    assert str(raised.value) == (f"the database server is out of disk space ({EXTEND}); {ADVICE}")
    assert isinstance(raised.value.__cause__, asyncpg.exceptions.DiskFullError)


class _AdaptedError(Exception):
    """What SQLAlchemy's asyncpg adapter raises: the driver's error as its cause."""

    sqlstate = "53100"


def test_through_sqlalchemy_the_message_is_the_servers_without_the_statement() -> None:
    try:
        try:
            raise _disk_full()
        except asyncpg.PostgresError as driver:
            raise _AdaptedError(f"<class 'asyncpg.exceptions.DiskFullError'>: {EXTEND}") from (
                driver
            )
    except _AdaptedError as adapted:
        wrapped = sa_exc.OperationalError("INSERT INTO episodic_events ...", {}, adapted)
    error = translated(wrapped)
    assert isinstance(error, StorageFullError)
    assert "INSERT" not in str(error)
    assert "<class" not in str(error)
    assert str(error).startswith(f"the database server is out of disk space ({EXTEND})")


def test_sqlite_out_of_space_is_a_storage_full_error() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    error = translated(sa_exc.OperationalError("INSERT ...", {}, full))
    assert isinstance(error, StorageFullError)
    assert "SQLite: database or disk is full" in str(error)


@pytest.mark.parametrize("sqlstate", ["53000", "53200"])
def test_a_server_short_of_other_resources_is_transient_not_full(sqlstate: str) -> None:
    class Short(Exception):
        pass

    short = Short("out of memory")
    short.sqlstate = sqlstate  # type: ignore[attr-defined]
    error = translated(short)
    assert type(error) is TransientDatabaseError, error


async def test_the_store_does_not_retry_a_full_disk() -> None:
    calls = 0

    async def append() -> None:
        nonlocal calls
        calls += 1
        raise StorageFullError("the database server is out of disk space")

    with pytest.raises(StorageFullError):
        await retry_transient(append, safe=True)
    assert calls == 1  # milliseconds do not free disk space


def test_over_http_a_503_with_retry_after_that_names_the_class() -> None:
    try:
        try:
            raise _disk_full()
        except asyncpg.PostgresError as driver:
            raise translated(driver) from driver
    except StorageFullError as full:
        error = full
    assert status_of(error) == 503
    answer = error_problem(error, instance="/v1/conversations/x/messages", request_id="r1")
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    body = bytes(answer.body).decode()
    assert "https://episodic.dev/errors/StorageFullError" in body
    assert dict(PUBLIC_DETAILS)[errors.StorageFullError] in body
    assert "base/16385" not in body  # the server's words are the log's
