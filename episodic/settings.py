"""Configuration, from ``EPISODIC_*`` environment variables (or a ``.env`` file)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from episodic.policy import EpisodicCompactionConfig

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

    trigger_context_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Compact when the context's estimated tokens reach this (off when unset; "
        "set it below your model's window).",
    )
    trigger_unfinished_turns: int = Field(
        default=8, ge=0, description="Compact after this many user messages since a run completed."
    )
    trigger_age_days: int = Field(
        default=30, ge=0, description="With trigger_age_turn_count: compact contexts this old..."
    )
    trigger_age_turn_count: int = Field(
        default=50, ge=0, description="...in conversations with at least this many user messages."
    )

    def trigger_config(self) -> EpisodicCompactionConfig:
        """The compaction trigger these settings describe."""
        return EpisodicCompactionConfig(
            trigger_context_tokens=self.trigger_context_tokens,
            trigger_unfinished_turns=self.trigger_unfinished_turns,
            trigger_age_days=self.trigger_age_days,
            trigger_age_turn_count=self.trigger_age_turn_count,
        )


__all__ = ["DEFAULT_DATABASE_URL", "DEFAULT_MAX_MESSAGE_BYTES", "EpisodicSettings"]
