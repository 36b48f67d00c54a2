"""Database URLs naming several hosts (a primary and its standbys), in each form a user
writes them, and the errors that say what a failed multi-host connection means."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from episodic.errors import ConfigurationError
from episodic.store.db_errors import connection_refused
from episodic.store.engine import parse_database_url

LIBPQ = "postgresql+asyncpg://app:secret@db1:5432,db2:5433/app"
QUERY = "postgresql://app:secret@/app?host=db1:5432,db2:5433"
REPEATED = "postgresql+asyncpg://app:secret@/app?host=db1:5432&host=db2:5433"


@pytest.mark.parametrize("url", [LIBPQ, QUERY, REPEATED], ids=["libpq", "query", "repeated"])
def test_several_hosts_in_any_form_ask_for_a_writable_one(url: str) -> None:
    parsed = parse_database_url(url)
    assert parsed.masked == (
        "postgresql+asyncpg://app:***@db1:5432,db2:5433/app?target_session_attrs=read-write"
        if url.startswith("postgresql+asyncpg")
        else "postgresql://app:***@db1:5432,db2:5433/app?target_session_attrs=read-write"
    )
    # asyncpg reads one comma-separated host parameter
    assert parsed.asyncpg == (
        "postgresql://app:secret@/app?host=db1%3A5432%2Cdb2%3A5433&target_session_attrs=read-write"
    )
    # SQLAlchemy (the migrations) wants the host repeated, each with its port
    assert "host=db1%3A5432&host=db2%3A5433" in parsed.sqlalchemy
    create_async_engine(parsed.sqlalchemy)


def test_a_target_the_url_names_is_kept_and_a_missing_port_is_the_default() -> None:
    parsed = parse_database_url("postgresql://app@db1,db2:6432/app?target_session_attrs=primary")
    assert parsed.asyncpg == (
        "postgresql://app@/app?host=db1%2Cdb2%3A6432&target_session_attrs=primary"
    )
    assert "host=db1%3A5432&host=db2%3A6432" in parsed.sqlalchemy
    assert parsed.masked == "postgresql://app@db1,db2:6432/app?target_session_attrs=primary"


def test_one_host_is_left_as_written() -> None:
    parsed = parse_database_url("postgresql+asyncpg://app:secret@db1:5432/app")
    assert parsed.asyncpg == "postgresql://app:secret@db1:5432/app"
    assert parsed.masked == "postgresql+asyncpg://app:***@db1:5432/app"


def test_a_port_that_is_not_a_number_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not a URL"):
        parse_database_url("postgresql://app@db1:54x32/app")


def test_a_refusal_through_several_hosts_says_a_failover_may_be_under_way() -> None:
    masked = parse_database_url(LIBPQ).masked
    refused = connection_refused(
        ConnectionRefusedError(111, "Connect call failed"), masked, several_hosts=True
    )
    assert refused is not None
    assert "until a standby is promoted" in str(refused)
    single = connection_refused(ConnectionRefusedError(111, "refused"), "postgresql://db1/app")
    assert single is not None
    assert "check the host and port" in str(single)
