"""Configuration, from ``EPISODIC_*`` environment variables (or a ``.env`` file)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///episodic.db"
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class EpisodicSettings(BaseSettings):
    """Every setting episodic reads. Library code takes values from here, never from
    ``os.environ`` directly."""

    model_config = SettingsConfigDict(env_prefix="EPISODIC_", env_file=".env", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="Where the log lives: postgresql+asyncpg://... in production, or a SQLite "
        "file (the default, ./episodic.db) for trying it out and single-process use.",
    )
    max_message_bytes: int = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        gt=0,
        description="Largest encoded message append accepts; larger ones are refused.",
    )
    token_estimator: str = Field(
        default="chars",
        description="'chars' (UTF-8 bytes / 4) or 'tiktoken[:encoding]' "
        "(needs episodic[tiktoken]).",
    )
    pool_min_size: int = Field(default=1, ge=0, description="PostgreSQL pool: idle connections.")
    pool_max_size: int = Field(default=10, gt=0, description="PostgreSQL pool: most connections.")


__all__ = ["DEFAULT_DATABASE_URL", "DEFAULT_MAX_MESSAGE_BYTES", "EpisodicSettings"]
