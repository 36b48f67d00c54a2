"""Configuration, from ``EPISODIC_*`` environment variables (or a ``.env`` file)."""

from __future__ import annotations

import difflib
import logging
import os
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from episodic.compaction import CompactionConfig
from episodic.errors import ConfigurationError
from episodic.policy import DEFAULT_TRIGGER_CONTEXT_TOKENS, EpisodicCompactionConfig
from episodic.rendering import DEFAULT_TOOL_RESULT_CHAR_CAP

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///episodic.db"
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
ENV_PREFIX = "EPISODIC_"
#: `episodic serve`'s default in-flight limit per pooled connection (see max_inflight)
MAX_INFLIGHT_PER_CONNECTION = 4
#: Prefixes of variables that are not settings: the test suite's and the benchmarks' own.
RESERVED_PREFIXES = ("EPISODIC_TEST_", "EPISODIC_BENCH_")

logger = logging.getLogger(__name__)


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
        "(needs episodic-store[tiktoken]).",
    )
    pool_min_size: int = Field(default=1, ge=0, description="PostgreSQL pool: idle connections.")
    pool_max_size: int = Field(default=10, gt=0, description="PostgreSQL pool: most connections.")
    append_calls: int = Field(
        default=2,
        ge=0,
        description="PostgreSQL: append calls in flight at once; appends beyond them wait and "
        "go together in one call, transaction and commit (0: every append its own call).",
    )
    citus_shard_count: int = Field(
        default=32,
        ge=1,
        le=64000,
        description="Citus: shards per distributed table when `episodic migrate` distributes "
        "the schema (a database with the citus extension; ignored elsewhere). Several per "
        "node, so the rebalancer can move them as nodes are added.",
    )
    connect_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3_600,
        description="How long opening a database connection may take before it fails with "
        "DatabaseUnavailableError.",
    )
    lock_timeout_ms: int = Field(
        default=5_000,
        ge=0,
        description="PostgreSQL: how long a statement waits for a row lock before it fails "
        "with LockTimeoutError (0 waits forever).",
    )
    idle_in_transaction_timeout_ms: int = Field(
        default=60_000,
        ge=0,
        description="PostgreSQL: the server ends a session left idle inside a transaction "
        "this long, so a stuck client cannot hold locks (0 turns it off).",
    )

    trigger_context_tokens: int | None = Field(
        default=DEFAULT_TRIGGER_CONTEXT_TOKENS,
        ge=0,
        description="Compact when the context's estimated tokens reach this; keep it below "
        "your model's window ('off' turns the rule off).",
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

    compact_request_token_limit: int = Field(
        default=250_000, gt=0, description="Cap on the transcript sent to the summarizer."
    )
    recent_user_token_budget: int = Field(
        default=20_000, ge=0, description="Recent user messages kept verbatim after a boundary."
    )
    instructions_token_budget: int = Field(
        default=2_000,
        ge=0,
        description="The user's standing instructions each handoff carries word for word.",
    )
    detect_instructions: bool = Field(
        default=True,
        description="After the pinned messages, carry the user's sentences that read as "
        "standing rules or reminders ('always ...', 'never ...', 'don't forget ...').",
    )
    notes_token_budget: int = Field(
        default=4_000, ge=0, description="The handoff's notes, kept across compactions."
    )
    worklog_token_budget: int = Field(
        default=4_000,
        ge=0,
        description="The handoff's record of files, commands and errors, read from the log.",
    )
    tool_result_char_cap: int = Field(
        default=DEFAULT_TOOL_RESULT_CHAR_CAP,
        ge=0,
        description="The characters of each tool result the summarizer is shown (its head); "
        "the record reads all of it.",
    )

    summarizer: Literal["extractive", "openai"] = Field(
        default="extractive",
        description="Who writes handoffs: 'openai' (any OpenAI-compatible endpoint) or "
        "'extractive' (offline, deterministic; the default so nothing leaves the machine).",
    )
    summarizer_base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL, e.g. https://api.openai.com/v1."
    )
    summarizer_api_key: SecretStr | None = Field(default=None, description="Its API key.")
    summarizer_model: str | None = Field(default=None, description="The summarizer's model.")
    summarizer_timeout: float = Field(default=120.0, gt=0, description="Seconds per call.")

    worker_concurrency: int = Field(default=4, gt=0, description="Attempts in flight per worker.")
    lease_seconds: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="Compaction lease; default twice the summarizer timeout plus 30 s.",
    )
    max_attempts: int = Field(default=5, gt=0, description="Attempts before the dead state.")
    backoff_base_seconds: float = Field(default=5.0, gt=0, description="First retry delay.")
    backoff_max_seconds: float = Field(default=600.0, gt=0, description="Longest retry delay.")
    fallback_trim: bool = Field(
        default=False,
        description="After the last failed attempt, write an extractive boundary instead of "
        "marking the conversation dead.",
    )
    poll_interval_seconds: float = Field(default=5.0, gt=0, description="Idle poll interval.")
    sweep_interval_seconds: float = Field(default=300.0, gt=0, description="Age-rule sweep.")
    shutdown_grace_seconds: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight attempts may finish."
    )
    metrics_port: int | None = Field(
        default=None, ge=1, le=65_535, description="Serve Prometheus metrics on this TCP port."
    )
    server_host: str = Field(
        default="127.0.0.1", min_length=1, description="`episodic serve`: the address to bind."
    )
    server_port: int = Field(
        default=8080, ge=1, le=65_535, description="`episodic serve`: the TCP port."
    )
    server_max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="`episodic serve`: larger request bodies are refused with 413.",
    )
    server_workers: int = Field(
        default=1,
        ge=1,
        le=512,
        description="`episodic serve`: processes serving the one port, each with its own "
        "connection pool (so up to this many times EPISODIC_POOL_MAX_SIZE connections).",
    )
    server_max_inflight: int | None = Field(
        default=None,
        ge=1,
        description="`episodic serve`: /v1 requests one process works on at once; more wait "
        "(see EPISODIC_SERVER_QUEUE_TIMEOUT) or are refused with 503 and Retry-After.  "
        "[default: 4 x EPISODIC_POOL_MAX_SIZE]",
    )
    server_queue_timeout: float = Field(
        default=0.1,
        ge=0,
        le=60,
        description="`episodic serve`: seconds a /v1 request over the in-flight limit waits "
        "for a slot before its 503 (0: refused at once).",
    )
    server_cors_origins: str = Field(
        default="",
        description="`episodic serve`: the browser origins allowed to call the API "
        "(comma-separated, e.g. https://app.example.com); empty: CORS is off.",
    )

    @field_validator("trigger_context_tokens", mode="before")
    @classmethod
    def _off_is_none(cls, value: Any) -> Any:
        # An explicit word to turn the rule off: an unset variable means the default, and an
        # empty one is a mistake more often than a choice.
        if isinstance(value, str) and value.strip().lower() == "off":
            return None
        return value

    def max_inflight(self) -> int:
        """``server_max_inflight``, or its default: four requests per pooled connection.
        Admitted requests share one event loop, so each one's time grows with their number:
        at about a millisecond of CPU per request, 40 (the default pool's) keep the pool
        busy and cost at most some tens of milliseconds of waiting, where an unbounded
        number would cost seconds."""
        return self.server_max_inflight or MAX_INFLIGHT_PER_CONNECTION * self.pool_max_size

    def cors_origins(self) -> list[str]:
        """``server_cors_origins`` as a list (empty: CORS off)."""
        return [o.strip() for o in self.server_cors_origins.split(",") if o.strip()]

    @model_validator(mode="after")
    def _check_together(self) -> Self:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError(
                f"EPISODIC_POOL_MIN_SIZE ({self.pool_min_size}) is above "
                f"EPISODIC_POOL_MAX_SIZE ({self.pool_max_size})"
            )
        if self.backoff_base_seconds > self.backoff_max_seconds:
            raise ValueError(
                f"EPISODIC_BACKOFF_BASE_SECONDS ({self.backoff_base_seconds}) is above "
                f"EPISODIC_BACKOFF_MAX_SECONDS ({self.backoff_max_seconds})"
            )
        return self

    def compaction_config(self) -> CompactionConfig:
        """The compaction limits these settings describe."""
        return CompactionConfig(detect_instructions=self.detect_instructions).with_limits(
            compact_request_token_limit=self.compact_request_token_limit,
            recent_user_token_budget=self.recent_user_token_budget,
            instructions_token_budget=self.instructions_token_budget,
            notes_token_budget=self.notes_token_budget,
            worklog_token_budget=self.worklog_token_budget,
            tool_result_char_cap=self.tool_result_char_cap,
        )

    def trigger_config(self) -> EpisodicCompactionConfig:
        """The compaction trigger these settings describe."""
        return EpisodicCompactionConfig(
            trigger_context_tokens=self.trigger_context_tokens,
            trigger_unfinished_turns=self.trigger_unfinished_turns,
            trigger_age_days=self.trigger_age_days,
            trigger_age_turn_count=self.trigger_age_turn_count,
        )


def load_settings(
    overrides: dict[str, Any] | None = None, *, flags: dict[str, str] | None = None
) -> EpisodicSettings:
    """The settings from the environment (and ``.env``), with ``overrides`` (setting name to
    value, e.g. from command-line options) on top. A bad value is a
    :class:`ConfigurationError` naming the variable (or the option, from ``flags``: setting
    name to option name), not a pydantic traceback. An ``EPISODIC_*`` variable that is no
    setting (a typo, usually) is logged as a warning naming the closest one."""
    warn_unknown_variables()
    given = {name: value for name, value in (overrides or {}).items() if value is not None}
    try:
        return EpisodicSettings(**given)
    except PydanticValidationError as exc:
        problems = "; ".join(_problem(error, given, flags or {}) for error in exc.errors())
        raise ConfigurationError(f"invalid configuration: {problems}") from exc


def environment_of(settings: EpisodicSettings) -> dict[str, str]:
    """``settings`` as the ``EPISODIC_*`` variables that give them back (secrets in clear,
    unset ones left out): how a process hands its resolved settings, command-line options
    included, to the processes it starts."""
    variables: dict[str, str] = {}
    for name, value in settings:
        if value is None:
            if EpisodicSettings.model_fields[name].default is None:
                continue
            value = "off"  # a rule turned off (trigger_context_tokens): its one spelling
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, bool):
            value = "true" if value else "false"
        variables[ENV_PREFIX + name.upper()] = str(value)
    return variables


def _problem(error: Any, given: dict[str, Any], flags: dict[str, str]) -> str:
    field = "_".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if not field:  # a rule over several settings
        return message
    variable = ENV_PREFIX + field.upper()
    if field in given and field in flags:
        return f"{flags[field]} ({variable}): {message}"
    return f"{variable}: {message}"


def known_variables() -> list[str]:
    """The environment variable of every setting."""
    return [ENV_PREFIX + name.upper() for name in EpisodicSettings.model_fields]


def warn_unknown_variables() -> list[str]:
    """Warn about each ``EPISODIC_*`` variable (in the environment or ``./.env``) that names
    no setting, with the closest setting's name; returns the warnings."""
    known = known_variables()
    names = {name for name in os.environ if name.upper().startswith(ENV_PREFIX)}
    names.update(name for name in _dotenv_names() if name.upper().startswith(ENV_PREFIX))
    warnings: list[str] = []
    for name in sorted(names):
        upper = name.upper()
        if upper in known or upper.startswith(RESERVED_PREFIXES):
            continue
        closest = difflib.get_close_matches(upper, known, n=1, cutoff=0.6)
        hint = f"; did you mean {closest[0]}?" if closest else ""
        warnings.append(f"{name} is not an episodic setting and is ignored{hint}")
    for warning in warnings:
        logger.warning(warning)
    return warnings


def _dotenv_names() -> list[str]:
    env_file = EpisodicSettings.model_config.get("env_file")
    if not isinstance(env_file, str) or not os.path.isfile(env_file):
        return []
    from dotenv import dotenv_values  # pydantic-settings' own dependency

    return [name for name in dotenv_values(env_file) if name]


__all__ = [
    "DEFAULT_DATABASE_URL",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "EpisodicSettings",
    "environment_of",
    "known_variables",
    "load_settings",
    "warn_unknown_variables",
]
