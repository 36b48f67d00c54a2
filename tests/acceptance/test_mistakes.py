"""Every mistake a newcomer makes gets one clear line: a table of them, each driven through
the ``episodic`` command line as a subprocess and through the API.

For each: the exit code is non-zero, stderr is exactly one line saying what to do, with no
``Traceback`` and no password; the API raises the ``episodic.errors`` type; and the store is
exactly as it was (snapshots compared, or no SQLite file created).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from alembic import command
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from episodic import (
    ConfigurationError,
    DatabaseUnavailableError,
    EpisodicError,
    EpisodicStore,
    Message,
    NotFoundError,
    SchemaNotMigratedError,
    ValidationError,
)
from episodic.store.engine import sqlalchemy_url
from episodic.store.migrate import REVISIONS, alembic_config
from tests.acceptance.test_cli import clean_env, run_cli
from tests.conftest import isolated_settings
from tests.support import asyncpg_dsn, snapshot
from tests.support_cluster import PASSWORD, Cluster, free_port, private_cluster

SECRET = "not-the-password-7f3a"


@dataclass(frozen=True)
class Databases:
    """The databases the mistakes are made against."""

    migrated: str  # at head, with one conversation of tenant "acme"
    conversation: str
    unmigrated: str  # exists, no episodic tables
    older: str  # migrated to the revision before head
    server: str
    missing: str  # a database name that does not exist on the server
    unknown_role: str
    refused: str  # a port nothing listens on
    wrong_host: str
    wrong_password: str | None  # a server that checks passwords, when one can run here


def _with(url: str, *, database: str | None = None, user: str | None = None) -> str:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if database is not None:
        parsed = parsed.set(database=database)
    if user is not None:
        parsed = parsed.set(username=user, password=SECRET)
    return parsed.render_as_string(hide_password=False)


async def _migrate_to(url: str, revision: str) -> None:
    engine = create_async_engine(sqlalchemy_url(url), poolclass=NullPool)

    def upgrade(connection: object) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    try:
        async with engine.begin() as connection:
            await connection.run_sync(upgrade)
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def password_cluster() -> Iterator[Cluster | None]:
    """A private server that checks passwords; None where none can run (the reason is in
    the skipped test's report)."""
    try:
        with private_cluster(password=True) as cluster:
            yield cluster
    except pytest.skip.Exception:
        yield None


@pytest.fixture(scope="module")
def databases(
    postgres_server: str, postgres_template: str, password_cluster: Cluster | None
) -> Iterator[Databases]:
    """Made once for the module: every mistake leaves them as they were (each test checks)."""
    suffix = uuid.uuid4().hex[:10]
    names = [f"episodic_{kind}_{suffix}" for kind in ("migrated", "unmigrated", "older")]

    async def make() -> Databases:
        admin = await asyncpg.connect(asyncpg_dsn(postgres_server))
        try:
            await admin.execute(f'CREATE DATABASE "{names[0]}" TEMPLATE "{postgres_template}"')
            for name in names[1:]:
                await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        migrated, unmigrated, older = (_with(postgres_server, database=n) for n in names)
        await _migrate_to(older, REVISIONS[-2])
        store = await EpisodicStore.open(migrated, settings=isolated_settings())
        try:
            acme = store.for_tenant("acme")
            conversation = await acme.create_conversation()
            await acme.append(conversation, [Message.user("hello")])
        finally:
            await store.close()
        return Databases(
            migrated=migrated,
            conversation=str(conversation),
            unmigrated=unmigrated,
            older=older,
            server=postgres_server,
            missing=_with(postgres_server, database=f"no_such_db_{suffix}"),
            unknown_role=_with(postgres_server, user=f"no_such_role_{suffix}"),
            refused=f"postgresql+asyncpg://postgres:{SECRET}@127.0.0.1:{free_port()}/postgres",
            wrong_host="postgresql+asyncpg://postgres@no-such-host.invalid:5432/postgres",
            wrong_password=(
                password_cluster.url(password=SECRET) if password_cluster is not None else None
            ),
        )

    async def drop() -> None:
        admin = await asyncpg.connect(asyncpg_dsn(postgres_server))
        try:
            for name in names:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    made = asyncio.run(make())
    try:
        yield made
    finally:
        asyncio.run(drop())


@dataclass(frozen=True)
class Mistake:
    """One mistake: the command line that makes it, what the one line must say, the error
    the API raises, and the API call that makes it."""

    name: str
    args: Callable[[Databases, Path], list[str]]
    says: str
    error: type[EpisodicError]
    api: Callable[[Databases, Path], Awaitable[object]] | None = None
    env: dict[str, str] = field(default_factory=dict)


async def _open_and(url: str, call: str = "status", **kwargs: object) -> object:
    store = await EpisodicStore.open(url, settings=isolated_settings())
    try:
        if call == "status":
            return await store.compaction_status()
        if call == "show":
            return await store.get_conversation(str(kwargs["conversation"]))
        raise AssertionError(call)
    finally:
        await store.close()


async def _open_scoped(url: str, tenant: str, conversation: str) -> object:
    store = await EpisodicStore.open(url, settings=isolated_settings())
    try:
        return await store.for_tenant(tenant).load_context(conversation)
    finally:
        await store.close()


def _sqlite(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


MISTAKES = [
    Mistake(
        "wrong host",
        lambda d, _: ["status", "--database-url", d.wrong_host],
        "check the host and port",
        DatabaseUnavailableError,
        lambda d, _: _open_and(d.wrong_host),
    ),
    Mistake(
        "connection refused",
        lambda d, _: ["status", "--database-url", d.refused],
        "that the server is running",
        DatabaseUnavailableError,
        lambda d, _: _open_and(d.refused),
    ),
    Mistake(
        "database does not exist",
        lambda d, _: ["status", "--database-url", d.missing],
        "create the database",
        DatabaseUnavailableError,
        lambda d, _: _open_and(d.missing),
    ),
    Mistake(
        "unknown role",
        lambda d, _: ["status", "--database-url", d.unknown_role],
        "create the role",
        DatabaseUnavailableError,
        lambda d, _: _open_and(d.unknown_role),
    ),
    Mistake(
        "wrong password",
        lambda d, _: ["status", "--database-url", d.wrong_password or ""],
        "check the password",
        DatabaseUnavailableError,
        lambda d, _: _open_and(d.wrong_password or ""),
    ),
    Mistake(
        "unmigrated database",
        lambda d, _: ["status", "--database-url", d.unmigrated],
        "run `episodic migrate`",
        SchemaNotMigratedError,
        lambda d, _: _open_and(d.unmigrated),
    ),
    Mistake(
        "older schema revision",
        lambda d, _: ["show", d.conversation, "--tenant", "acme", "--database-url", d.older],
        f"older than {REVISIONS[-1]}: run `episodic migrate`",
        SchemaNotMigratedError,
        lambda d, _: _open_and(d.older, "show", conversation=d.conversation),
    ),
    Mistake(
        "SQLite path in no directory",
        lambda _, tmp: ["status", "--database-url", _sqlite(tmp / "no-such-dir" / "x.db")],
        "does not exist",
        DatabaseUnavailableError,
        lambda _, tmp: _open_and(_sqlite(tmp / "no-such-dir" / "x.db")),
    ),
    Mistake(
        "SQLite path that is a directory",
        lambda _, tmp: ["status", "--database-url", _sqlite(tmp)],
        "is a directory",
        DatabaseUnavailableError,
        lambda _, tmp: _open_and(_sqlite(tmp)),
    ),
    Mistake(
        "mistyped SQLite path",
        lambda _, tmp: ["status", "--database-url", _sqlite(tmp / "episodc.db")],
        "no such file; is the path right?",
        SchemaNotMigratedError,
        lambda _, tmp: _open_and(_sqlite(tmp / "episodc.db")),
    ),
    Mistake(
        "not a database URL",
        lambda _, __: ["status", "--database-url", f"postgres//u:{SECRET}@h/db"],
        "expected postgresql+asyncpg://",
        ConfigurationError,
        lambda _, __: _open_and(f"postgres//u:{SECRET}@h/db"),
    ),
    Mistake(
        "unknown conversation",
        lambda d, _: ["show", str(uuid.uuid4()), "--database-url", d.migrated],
        "create it with store.create_conversation()",
        NotFoundError,
        lambda d, _: _open_and(d.migrated, "show", conversation=uuid.uuid4()),
    ),
    Mistake(
        "conversation id that is not a UUID",
        lambda d, _: ["show", "conv-17", "--database-url", d.migrated],
        "must be a UUID",
        ValidationError,
        lambda d, _: _open_and(d.migrated, "show", conversation="conv-17"),
    ),
    Mistake(
        "wrong tenant",
        lambda d, _: ["show", d.conversation, "--tenant", "globex", "--database-url", d.migrated],
        "does not exist, or is not visible",
        NotFoundError,
        lambda d, _: _open_scoped(d.migrated, "globex", d.conversation),
    ),
    Mistake(
        "--concurrency 0",
        lambda d, _: ["worker", "--once", "--concurrency", "0", "--database-url", d.migrated],
        "--concurrency (EPISODIC_WORKER_CONCURRENCY): Input should be greater than 0",
        ConfigurationError,
    ),
    Mistake(
        "--metrics-port 99999",
        lambda d, _: ["worker", "--once", "--metrics-port", "99999", "--database-url", d.migrated],
        "--metrics-port (EPISODIC_METRICS_PORT)",
        ConfigurationError,
    ),
    Mistake(
        "--recent -1",
        lambda d, _: ["status", "--recent", "-1", "--database-url", d.migrated],
        "Invalid value for '--recent'",
        ConfigurationError,
    ),
    Mistake(
        "--limit 0",
        lambda d, _: ["show", d.conversation, "--limit", "0", "--database-url", d.migrated],
        "Invalid value for '--limit'",
        ConfigurationError,
    ),
    Mistake(
        "EPISODIC_POOL_MIN_SIZE above the max",
        lambda d, _: ["status", "--database-url", d.migrated],
        "EPISODIC_POOL_MIN_SIZE (20) is above EPISODIC_POOL_MAX_SIZE (10)",
        ConfigurationError,
        env={"EPISODIC_POOL_MIN_SIZE": "20"},
    ),
    Mistake(
        "a setting that is not a number",
        lambda d, _: ["status", "--database-url", d.migrated],
        "EPISODIC_LOCK_TIMEOUT_MS",
        ConfigurationError,
        env={"EPISODIC_LOCK_TIMEOUT_MS": "5s"},
    ),
    Mistake(
        "unknown command",
        lambda _, __: ["stauts"],
        "No such command 'stauts'",
        ConfigurationError,
    ),
]


def _files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def _needs_password_server(mistake: Mistake, databases: Databases) -> None:
    if mistake.name == "wrong password" and databases.wrong_password is None:
        pytest.skip("no private PostgreSQL cluster can run here to check a wrong password")


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.name for m in MISTAKES])
async def test_a_mistake_on_the_command_line_is_one_line(
    mistake: Mistake, databases: Databases, tmp_path: Path
) -> None:
    _needs_password_server(mistake, databases)
    before = await snapshot(databases.migrated)
    work = tmp_path / "cwd"
    work.mkdir()
    args = mistake.args(databases, tmp_path)
    result = await asyncio.to_thread(
        run_cli, *args, cwd=work, env=clean_env(COLUMNS="80", **mistake.env)
    )
    lines = result.stderr.splitlines()
    assert result.code != 0, result.output
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert mistake.says in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert SECRET not in result.output
    assert PASSWORD not in result.output
    assert await snapshot(databases.migrated) == before
    assert _files(tmp_path) == ["cwd"], "no file was created"
    assert _files(work) == []


API_MISTAKES = [m for m in MISTAKES if m.api is not None]


@pytest.mark.parametrize("mistake", API_MISTAKES, ids=[m.name for m in API_MISTAKES])
async def test_a_mistake_through_the_api_is_a_typed_error(
    mistake: Mistake, databases: Databases, tmp_path: Path
) -> None:
    _needs_password_server(mistake, databases)
    assert mistake.api is not None
    before = await snapshot(databases.migrated)
    with pytest.raises(mistake.error) as raised:
        await mistake.api(databases, tmp_path)
    message = str(raised.value)
    assert mistake.says in message
    assert "\n" not in message
    assert SECRET not in message
    assert PASSWORD not in message
    assert await snapshot(databases.migrated) == before
    assert _files(tmp_path) == [], "no file was created"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_cli(
        "--debug", "status", "--database-url", _sqlite(tmp_path / "missing.db"), cwd=tmp_path
    )
    assert result.code == 1
    assert result.stderr.startswith("error: ")
    assert "Traceback" in result.stderr
    assert "SchemaNotMigratedError" in result.stderr
    assert not (tmp_path / "missing.db").exists()


def test_an_unknown_variable_is_named_with_the_closest_setting(tmp_path: Path) -> None:
    env = clean_env(EPISODIC_TRIGER_CONTEXT_TOKENS="120000")
    result = run_cli("migrate", "--database-url", _sqlite(tmp_path / "e.db"), cwd=tmp_path, env=env)
    assert result.code == 0, result.output
    assert result.stderr.splitlines() == [
        "warning: EPISODIC_TRIGER_CONTEXT_TOKENS is not an episodic setting and is ignored; "
        "did you mean EPISODIC_TRIGGER_CONTEXT_TOKENS?"
    ]


def test_help_and_version(tmp_path: Path) -> None:
    from episodic import __version__

    short, long = run_cli("-h", cwd=tmp_path), run_cli("--help", cwd=tmp_path)
    assert short.code == long.code == 0
    assert short.stdout == long.stdout
    assert "migrate" in short.stdout
    assert (
        run_cli("show", "-h", cwd=tmp_path).stdout == run_cli("show", "--help", cwd=tmp_path).stdout
    )
    version = run_cli("--version", cwd=tmp_path)
    assert (version.code, version.stdout.strip()) == (0, f"episodic {__version__}")
