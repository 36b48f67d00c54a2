"""Running the Alembic revisions from code (``store.migrate()``, ``episodic migrate``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from weakref import WeakKeyDictionary

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from episodic.errors import ConfigurationError, SchemaNotMigratedError

#: Every revision of episodic's schema, oldest first; this version of episodic needs the last.
#: (A test checks this is Alembic's history.)
REVISIONS = (
    "0001_event_log",
    "0002_compaction_due",
    "0003_partial_unique_keys",
    "0004_tenant_isolation",
    "0005_protected_heads",
    "0006_named_parameters",
    "0007_lean_append",
    "0008_coalesced_appends",
    "0009_retractions_and_clears",
    "0010_append_sees_a_new_head",
    "0011_state_listings_deletion",
    "0012_erasure",
    "0013_distributable",
    "0014_api_keys",
    "0015_unpin",
)
HEAD_REVISION = REVISIONS[-1]


def migrations_directory() -> Path:
    """Where the revisions are: inside the installed wheel, or at the root of a checkout."""
    installed = Path(str(files("episodic"))) / "_migrations"
    if (installed / "env.py").is_file():
        return installed
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise ConfigurationError(
        "episodic's migrations are missing from this installation; reinstall the package"
    )


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    return config


@dataclass(frozen=True, slots=True)
class SchemaMigration:
    """What ``migrate()`` did: the revision it found (None: no schema) and the one it left."""

    before: str | None
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


def _upgrade(connection: Connection, citus_shard_count: int | None) -> SchemaMigration:
    config = alembic_config()
    config.attributes["connection"] = connection
    config.attributes["citus_shard_count"] = citus_shard_count
    command.upgrade(config, "head")
    # env.py reads the revision it starts from once it holds the migration lock, so of many
    # processes migrating at once exactly one reports the change.
    before = config.attributes.get("revision_before")
    return SchemaMigration(before=before, after=HEAD_REVISION)


# Alembic keeps its migration context in module globals, so two upgrades interleaved on one
# event loop corrupt each other. Across processes the advisory lock in env.py serializes them.
_loop_locks: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = WeakKeyDictionary()


async def upgrade_to_head(
    engine: AsyncEngine, *, citus_shard_count: int | None = None
) -> SchemaMigration:
    """``alembic upgrade head`` on ``engine``, in one transaction (on Citus, distributing
    the schema in it too, into ``citus_shard_count`` shards, by default the setting's:
    store/postgres/citus.py)."""
    lock = _loop_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock, engine.begin() as connection:
        return await connection.run_sync(_upgrade, citus_shard_count)


def _number(revision: str) -> int | None:
    prefix = revision.partition("_")[0]
    return int(prefix) if prefix.isdigit() else None


def runs_on(revision: str | None) -> bool:
    """Whether this release runs on a schema at ``revision``: its own head, or the next
    migration's. A migration never breaks the release before it (expand, deploy, contract
    in a later release: ARCHITECTURE.md; tests/reliability/test_t17_rolling_upgrade.py
    holds every migration to it), so during a rolling upgrade a process of this release
    that starts after ``episodic migrate`` ran still works."""
    if revision == HEAD_REVISION:
        return True
    if revision is None or revision in REVISIONS:
        return False
    ours, theirs = _number(HEAD_REVISION), _number(revision)
    return ours is not None and theirs == ours + 1


def check_revision(revision: str | None, *, where: str) -> None:
    """Raise :class:`SchemaNotMigratedError`, saying what to do, unless this release runs on
    the database at ``where`` (a masked URL): it is at :data:`HEAD_REVISION`, or one
    migration ahead (:func:`runs_on`)."""
    if runs_on(revision):
        return
    if revision is None:
        problem = "has no episodic schema"
        advice = "run `episodic migrate` (or store.migrate()) to create it"
    elif revision in REVISIONS:
        problem = f"has the episodic schema at revision {revision}, older than {HEAD_REVISION}"
        advice = "run `episodic migrate` (or store.migrate()) to upgrade it"
    else:
        problem = (
            f"has the episodic schema at revision {revision}, more than one migration ahead "
            f"of this episodic's {HEAD_REVISION} (or not one of episodic's)"
        )
        advice = "upgrade the episodic package to the version that migrated it"
    raise SchemaNotMigratedError(
        f"the database {where} {problem}: {advice}", revision=revision, expected=HEAD_REVISION
    )


__all__ = [
    "HEAD_REVISION",
    "REVISIONS",
    "SchemaMigration",
    "alembic_config",
    "check_revision",
    "migrations_directory",
    "runs_on",
    "upgrade_to_head",
]
