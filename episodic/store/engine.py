"""Database URLs: which backend a URL names, and the forms each driver wants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy.engine import make_url

from episodic.errors import ConfigurationError

Dialect = Literal["postgresql", "sqlite"]


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """A parsed database URL. ``sqlalchemy`` is the async SQLAlchemy form, ``asyncpg`` the
    plain DSN asyncpg takes (PostgreSQL only), ``masked`` the form to show a person (the
    password replaced by ``***``), ``sqlite_path`` the file of a SQLite URL (None in memory)."""

    dialect: Dialect
    sqlalchemy: str
    asyncpg: str | None
    masked: str
    sqlite_path: str | None = None


def parse_database_url(url: str) -> DatabaseUrl:
    """Accept ``postgresql://``, ``postgres://``, ``postgresql+asyncpg://``, ``sqlite://`` and
    ``sqlite+aiosqlite://`` URLs."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        # Not echoed: the text may hold a password.
        raise ConfigurationError(
            "the database URL is not a URL; expected postgresql+asyncpg://user:password@host:"
            "5432/database or sqlite+aiosqlite:///path/to/file.db"
        ) from exc
    masked = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        driver_url = parsed.set(drivername="postgresql+asyncpg")
        plain = parsed.set(drivername="postgresql")
        return DatabaseUrl(
            dialect="postgresql",
            sqlalchemy=driver_url.render_as_string(hide_password=False),
            asyncpg=plain.render_as_string(hide_password=False),
            masked=masked,
        )
    if backend == "sqlite":
        driver_url = parsed.set(drivername="sqlite+aiosqlite")
        path = parsed.database
        return DatabaseUrl(
            dialect="sqlite",
            sqlalchemy=driver_url.render_as_string(hide_password=False),
            asyncpg=None,
            masked=masked,
            sqlite_path=path if path and path != ":memory:" else None,
        )
    raise ConfigurationError(
        f"unsupported database {backend!r} in {masked}: episodic runs on PostgreSQL "
        "(postgresql+asyncpg://...) or SQLite (sqlite+aiosqlite:///path.db)"
    )


def sqlalchemy_url(url: str) -> str:
    """The async SQLAlchemy form of ``url``."""
    return parse_database_url(url).sqlalchemy


__all__ = ["DatabaseUrl", "Dialect", "parse_database_url", "sqlalchemy_url"]
