"""Running the Alembic revisions from code (``store.migrate()``, ``episodic migrate``)."""

from __future__ import annotations

import asyncio
from importlib.resources import files
from pathlib import Path
from weakref import WeakKeyDictionary

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from episodic.errors import ConfigurationError


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


def _upgrade(connection: Connection) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


# Alembic keeps its migration context in module globals, so two upgrades interleaved on one
# event loop corrupt each other. Across processes the advisory lock in env.py serializes them.
_loop_locks: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = WeakKeyDictionary()


async def upgrade_to_head(engine: AsyncEngine) -> None:
    """``alembic upgrade head`` on ``engine``, in one transaction."""
    lock = _loop_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock, engine.begin() as connection:
        await connection.run_sync(_upgrade)


__all__ = ["alembic_config", "migrations_directory", "upgrade_to_head"]
