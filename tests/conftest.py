"""Test databases.

PostgreSQL: ``EPISODIC_TEST_DATABASE_URL`` names a server we may create databases on; without
it, testcontainers starts one when Docker answers; otherwise the run stops with a message
saying what to set. The schema is migrated once into a template database, and every test gets
its own database cloned from it (dropped afterwards). SQLite: a migrated template file,
copied per test.

``pytest --citus``: the Citus lane. Every PostgreSQL database is a distributed one on the
cluster ``EPISODIC_TEST_CITUS_URL`` names (tests/support_citus.py), made whole per test since
Citus refuses template cloning; SQLite halves are skipped. Without the variable the lane's
tests skip, saying what to set.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from episodic import EpisodicStore
from episodic.settings import EpisodicSettings
from tests.support import asyncpg_dsn
from tests.support_citus import (
    CITUS_URL,
    NOT_CONFIGURED,
    TEST_SHARD_COUNT,
    create_distributed_database,
    drop_distributed_database,
    empty_distributed_database,
)

SERVER_URL_VARIABLE = "EPISODIC_TEST_DATABASE_URL"
_SERVER_URL = os.environ.get(SERVER_URL_VARIABLE)
BACKENDS = ("postgresql", "sqlite")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--citus",
        action="store_true",
        help="run the PostgreSQL tests on distributed databases of the Citus cluster "
        "EPISODIC_TEST_CITUS_URL names (SQLite tests are skipped)",
    )


_citus_lane = False


def pytest_configure(config: pytest.Config) -> None:
    global _citus_lane
    _citus_lane = bool(config.getoption("citus"))


def citus_lane() -> bool:
    """Whether this run is the Citus lane (``--citus``)."""
    return _citus_lane


def isolated_settings() -> EpisodicSettings:
    """Defaults only: no environment variables, no .env file."""
    return EpisodicSettings(_env_file=None)


async def create_database(server: str, name: str, *, owner: str | None = None) -> None:
    """An empty database on the test server: on the Citus lane, one on every node, ready to
    be distributed by its migration."""
    if _citus_lane:
        await create_distributed_database(server, name, owner=owner)
    else:
        await _admin(server, f'CREATE DATABASE "{name}"' + (f" OWNER {owner}" if owner else ""))


async def drop_database(server: str, name: str) -> None:
    if _citus_lane:
        await drop_distributed_database(server, name)
    else:
        await _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _start_container() -> tuple[str, object]:
    try:
        from testcontainers.community.postgres import PostgresContainer

        container = PostgresContainer("postgres:15-alpine", driver="asyncpg")
        container.start()
    except Exception as exc:
        pytest.exit(
            f"No PostgreSQL for the tests. Set {SERVER_URL_VARIABLE} to a server the tests may "
            "create databases on, e.g. "
            "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres, or start Docker so "
            f"testcontainers can run one. (testcontainers: {type(exc).__name__}: {exc})",
            returncode=2,
        )
    return container.get_connection_url(), container


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """URL of a PostgreSQL server (its maintenance database); on the Citus lane, the
    cluster's coordinator."""
    if _citus_lane:
        if not CITUS_URL:
            pytest.skip(NOT_CONFIGURED)
        yield CITUS_URL
        return
    if _SERVER_URL:
        yield _SERVER_URL
        return
    url, container = _start_container()
    try:
        yield url
    finally:
        container.stop()  # type: ignore[attr-defined]


async def _admin(server: str, sql: str) -> None:
    connection = await asyncpg.connect(asyncpg_dsn(server))
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def postgres_template(postgres_server: str) -> Iterator[str | None]:
    """Name of a migrated database that test databases are cloned from (none on the Citus
    lane, whose test databases are made whole)."""
    if _citus_lane:
        yield None
        return
    name = f"episodic_template_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_server, f'CREATE DATABASE "{name}"'))

    async def migrate() -> None:
        store = await EpisodicStore.open(
            _with_database(postgres_server, name), settings=isolated_settings()
        )
        try:
            await store.migrate()
        finally:
            await store.close()

    asyncio.run(migrate())
    try:
        yield name
    finally:
        asyncio.run(_admin(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "episodic.db"

    async def migrate() -> None:
        store = await EpisodicStore.open(
            f"sqlite+aiosqlite:///{path}", settings=isolated_settings()
        )
        try:
            await store.migrate()
        finally:
            await store.close()

    asyncio.run(migrate())
    return path


@pytest.fixture(scope="session")
def citus_databases(postgres_server: str) -> Iterator[list[str]]:
    """The Citus lane's migrated, distributed databases that no test is using, emptied after
    each test for the next (dropped at the end of the run)."""
    free: list[str] = []
    yield free
    for name in free:
        asyncio.run(drop_distributed_database(postgres_server, name))


async def _distributed_database(server: str) -> str:
    name = f"episodic_test_{uuid.uuid4().hex[:12]}"
    await create_distributed_database(server, name)
    settings = EpisodicSettings(_env_file=None, citus_shard_count=TEST_SHARD_COUNT)
    store = await EpisodicStore.open(_with_database(server, name), settings=settings)
    try:
        await store.migrate()
    finally:
        await store.close()
    return name


@pytest.fixture
async def postgres_url(
    postgres_server: str, postgres_template: str | None, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    """A fresh, migrated PostgreSQL database for one test (on the Citus lane, distributed:
    made once, then emptied for each next test unless the test is marked ``alters_schema``)."""
    if postgres_template is None:
        free: list[str] = request.getfixturevalue("citus_databases")
        name = free.pop() if free else await _distributed_database(postgres_server)
        reusable = request.node.get_closest_marker("alters_schema") is None
        try:
            yield _with_database(postgres_server, name)
        finally:
            try:
                if reusable:
                    await empty_distributed_database(postgres_server, name)
                    free.append(name)
            finally:
                if not reusable or name not in free:
                    await drop_distributed_database(postgres_server, name)
        return
    name = f"episodic_test_{uuid.uuid4().hex[:12]}"
    await _admin(postgres_server, f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template}"')
    try:
        yield _with_database(postgres_server, name)
    finally:
        await _admin(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def empty_postgres_url(postgres_server: str) -> AsyncIterator[str]:
    """A new PostgreSQL database with no tables, for tests that migrate it themselves as a
    user would."""
    name = f"episodic_test_{uuid.uuid4().hex[:12]}"
    await create_database(postgres_server, name)
    try:
        yield _with_database(postgres_server, name)
    finally:
        await drop_database(postgres_server, name)


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh, migrated SQLite file for one test."""
    path = tmp_path / "episodic.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A fresh migrated database on each backend (the contract suite runs on both)."""
    if _citus_lane and backend == "sqlite":
        pytest.skip("the Citus lane runs the PostgreSQL half of each test")
    fixture = "postgres_url" if backend == "postgresql" else "sqlite_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EpisodicStore]:
    opened = await EpisodicStore.open(database_url, settings=isolated_settings())
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def pg_store(postgres_url: str) -> AsyncIterator[EpisodicStore]:
    opened = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def db(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection to the test's PostgreSQL database, for checks outside the
    store."""
    conn = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture(autouse=True)
def _scrub_episodic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see no EPISODIC_* variables from the shell that runs them."""
    for name in list(os.environ):
        if name.startswith("EPISODIC_"):
            monkeypatch.delenv(name)
