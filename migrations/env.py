"""Alembic environment for episodic, sync or async.

``EpisodicStore.migrate()`` hands in an open connection through
``config.attributes["connection"]``; the ``alembic`` command line builds an async engine from
``sqlalchemy.url`` or ``EPISODIC_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from episodic.settings import EpisodicSettings
from episodic.store.engine import sqlalchemy_url
from episodic.store.postgres import citus
from episodic.store.schema import metadata

config = context.config

# Any number of processes may call migrate() at once (every worker replica on start-up); the
# first takes this lock and the others wait, then find the schema already at head.
MIGRATION_LOCK_KEY = 0x657069736F646963  # "episodic"


def run_with_connection(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        version_table="episodic_alembic_version",
    )
    distributed = connection.dialect.name == "postgresql" and citus.citus_installed(connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
        if distributed:
            citus.prepare_migration(connection)
        # Read under the lock: what this run starts from, for `episodic migrate` to report.
        config.attributes["revision_before"] = context.get_context().get_current_revision()
        context.run_migrations()
        if distributed:
            # In the same transaction: a revision that re-created a function lost its
            # delegation, and gets it back before anyone can call it undelegated.
            # store.migrate() hands in its settings' count; the alembic command line reads
            # EPISODIC_CITUS_SHARD_COUNT like every other setting.
            shards = (
                config.attributes.get("citus_shard_count") or EpisodicSettings().citus_shard_count
            )
            citus.distribute(connection, shard_count=shards)


async def run_async(url: str) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(run_with_connection)
    finally:
        await engine.dispose()


def main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_with_connection(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("EPISODIC_DATABASE_URL")
    if not url:
        raise SystemExit("set EPISODIC_DATABASE_URL (or sqlalchemy.url) to migrate")
    if context.is_offline_mode():
        context.configure(
            url=sqlalchemy_url(url),
            target_metadata=metadata,
            literal_binds=True,
            version_table="episodic_alembic_version",
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(run_async(sqlalchemy_url(url)))


main()
