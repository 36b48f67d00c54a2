"""Database URLs: which backend a URL names, and the forms each driver wants.

A PostgreSQL URL may name several hosts, for a primary with standbys: libpq's form
``postgresql://user@db1:5432,db2:5432/app`` or the query form ``?host=db1:5432,db2:5432``
(``host`` repeated, as SQLAlchemy writes it, too). Each connection is opened to the first
host, in order, that accepts it and is writable (``target_session_attrs=read-write``, the
default here when several hosts are named: episodic writes, and a connection to a standby
would fail every append), so after a failover new connections find the promoted standby.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.engine import URL, make_url

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


#: libpq's multi-host authority: ``[user[:password]@]host[:port],host[:port]...``, up to the path
_HOST_LIST = re.compile(r"^(?P<scheme>[^:/]+://)(?P<userinfo>[^@/]*@)?(?P<hosts>[^/?]*,[^/?]*)")
#: What to ask of a host among several when the URL does not say (libpq's default is "any").
MULTI_HOST_TARGET = "read-write"
DEFAULT_PORT = 5432


def _hosts_into_query(url: str) -> str:
    """libpq's ``db1:5432,db2:5432`` authority moved into the ``host`` query parameter, the
    multi-host form SQLAlchemy parses."""
    found = _HOST_LIST.match(url)
    if found is None:
        return url
    rest = url[found.end() :]
    path, _, query = rest.partition("?")
    hosts = f"host={found['hosts']}"
    return f"{found['scheme']}{found['userinfo'] or ''}{path or '/'}?{hosts}" + (
        f"&{query}" if query else ""
    )


def _host_list(parsed: URL) -> list[str]:
    """The ``host`` query parameter's hosts (``host:port``), however it was written."""
    given = parsed.query.get("host")
    values = [given] if isinstance(given, str) else list(given or ())
    return [host for value in values for host in value.split(",") if host]


def _pairs(hosts: list[str]) -> list[tuple[str, int]]:
    """``host:port`` strings as (host, port), the port 5432 where none is given."""
    pairs = []
    for host in hosts:
        name, colon, port = host.rpartition(":")
        if not colon or not port.isdigit() or name.startswith("[") != name.endswith("]"):
            name, port = host, ""  # no port, or a bare IPv6 address
        pairs.append((name.strip("[]"), int(port) if port else DEFAULT_PORT))
    return pairs


def dsn_hosts(dsn: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a DSN that names several hosts in its ``host`` parameter (the
    form :func:`parse_database_url` gives asyncpg); empty for a DSN naming one."""
    hosts = _host_list(make_url(dsn)) if "host=" in dsn else []
    return _pairs(hosts) if len(hosts) > 1 else []


def _with_hosts(parsed: URL, hosts: list[str]) -> URL:
    """Several hosts as one comma-separated ``host`` parameter (the form asyncpg reads), and
    a writable one asked for unless the URL says otherwise."""
    query = dict(parsed.query)
    query["host"] = ",".join(hosts)
    query.setdefault("target_session_attrs", MULTI_HOST_TARGET)
    return parsed.set(query=query)


def _shown(parsed: URL, hosts: list[str]) -> str:
    """The URL to show a person: the password masked, several hosts as libpq writes them."""
    if len(hosts) < 2:
        return parsed.render_as_string(hide_password=True)
    hostless = parsed.difference_update_query(["host"]).set(host=None, port=None)
    scheme, _, rest = hostless.render_as_string(hide_password=True).partition("://")
    userinfo, slash, path = rest.partition("/")  # userinfo is "user:***@" or ""
    return f"{scheme}://{userinfo}{','.join(hosts)}{slash}{path}"


def parse_database_url(url: str) -> DatabaseUrl:
    """Accept ``postgresql://``, ``postgres://``, ``postgresql+asyncpg://``, ``sqlite://`` and
    ``sqlite+aiosqlite://`` URLs; a PostgreSQL URL may name several hosts (module docstring)."""
    try:
        parsed = make_url(_hosts_into_query(url))
    except Exception as exc:
        # Not echoed: the text may hold a password.
        raise ConfigurationError(
            "the database URL is not a URL; expected postgresql+asyncpg://user:password@host:"
            "5432/database or sqlite+aiosqlite:///path/to/file.db"
        ) from exc
    backend = parsed.get_backend_name()
    hosts = _host_list(parsed) if backend in ("postgresql", "postgres") else []
    if len(hosts) > 1:
        parsed = _with_hosts(parsed, hosts)
    masked = _shown(parsed, hosts)
    if backend in ("postgresql", "postgres"):
        driver_url = parsed.set(drivername="postgresql+asyncpg")
        if len(hosts) > 1:
            # SQLAlchemy's asyncpg dialect wants the host repeated, each with its port.
            each = tuple(
                f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                for host, port in _pairs(hosts)
            )
            driver_url = driver_url.update_query_dict({"host": each})
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


__all__ = ["DatabaseUrl", "Dialect", "dsn_hosts", "parse_database_url", "sqlalchemy_url"]
