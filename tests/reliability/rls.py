"""A database migrated by a non-superuser owner, and login roles for the runtime roles.

Superusers bypass row-level security even with FORCE, so the tenant tests need what a
production deployment has: tables owned by an ordinary role, and applications that log in as
members of ``episodic_app``, ``episodic_worker``, ``episodic_all_tenants`` or
``episodic_eraser``. Roles belong to the cluster; they are created once (IF NOT EXISTS) and
shared by every run.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
from sqlalchemy.engine import make_url

from episodic import EpisodicStore
from episodic.settings import EpisodicSettings
from tests.conftest import create_database, drop_database
from tests.support import asyncpg_dsn

OWNER = "episodic_test_owner"
APP = "episodic_test_app"
WORKER = "episodic_test_worker"
ALL_TENANTS = "episodic_test_all_tenants"
ERASER = "episodic_test_eraser"
LOGINS = {
    OWNER: None,
    APP: "episodic_app",
    WORKER: "episodic_worker",
    ALL_TENANTS: "episodic_all_tenants",
    ERASER: "episodic_eraser",
}
#: Ignored under trust authentication (this machine); needed where the server asks for one
#: (a testcontainers PostgreSQL).
PASSWORD = "episodic-test"


@dataclass(frozen=True)
class RlsDatabase:
    """URLs of one database, one per login role."""

    server: str
    name: str

    def url(self, role: str) -> str:
        return (
            make_url(self.server)
            .set(
                database=self.name,
                username=role,
                password=PASSWORD,
            )
            .render_as_string(hide_password=False)
        )

    def admin_dsn(self) -> str:
        """As the server's own (super)user, whom row-level security does not restrict."""
        return asyncpg_dsn(make_url(self.server).set(database=self.name).render_as_string(False))

    def dsn(self, role: str) -> str:
        return (
            make_url(self.url(role))
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )


async def _ensure_roles(admin: asyncpg.Connection) -> None:
    for login, group in LOGINS.items():
        grant = f" IN ROLE {group}" if group else ""
        await admin.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{login}') THEN "
            f"CREATE ROLE {login} LOGIN PASSWORD '{PASSWORD}' NOSUPERUSER NOBYPASSRLS{grant}; "
            "END IF; "
            "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )
        await admin.execute(f"ALTER ROLE {login} PASSWORD '{PASSWORD}'")


@asynccontextmanager
async def rls_database(server: str) -> AsyncIterator[RlsDatabase]:
    """A fresh database owned by ``episodic_test_owner`` and migrated by it. The runtime
    group roles must exist already (the session's template migration, run as a superuser,
    created them)."""
    name = f"episodic_rls_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(asyncpg_dsn(server))
    try:
        await _ensure_roles(admin)
    finally:
        await admin.close()
    await create_database(server, name, owner=OWNER)
    database = RlsDatabase(server, name)
    try:
        store = await EpisodicStore.open(database.url(OWNER), settings=settings())
        try:
            await store.migrate()
        finally:
            await store.close()
        yield database
    finally:
        await drop_database(server, name)


def settings(**overrides: object) -> EpisodicSettings:
    return EpisodicSettings(_env_file=None, **overrides)  # type: ignore[arg-type]
