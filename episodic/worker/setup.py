"""Building a worker and its summarizer from settings (for the CLI and deployments)."""

from __future__ import annotations

from episodic.errors import ConfigurationError
from episodic.settings import EpisodicSettings
from episodic.store import EpisodicStore
from episodic.summarizers import ExtractiveSummarizer, OpenAIChatSummarizer, Summarizer
from episodic.summarizers.openai_chat import OPENAI_BASE_URL, redact_url
from episodic.worker.job import CompactionOptions
from episodic.worker.metrics import WorkerMetrics
from episodic.worker.runner import CompactionWorker


def summarizer_from_settings(settings: EpisodicSettings) -> Summarizer:
    """The summarizer EPISODIC_SUMMARIZER names, configured from its variables."""
    if settings.summarizer == "extractive":
        return ExtractiveSummarizer()
    if not settings.summarizer_model:
        endpoint = (
            f"EPISODIC_SUMMARIZER_BASE_URL is {redact_url(settings.summarizer_base_url)}"
            if settings.summarizer_base_url
            else f"EPISODIC_SUMMARIZER_BASE_URL is unset, so requests would go to "
            f"{OPENAI_BASE_URL} (OpenAI's API; set it for another OpenAI-compatible server)"
        )
        raise ConfigurationError(
            "EPISODIC_SUMMARIZER=openai needs EPISODIC_SUMMARIZER_MODEL, the model to ask "
            f"(and usually EPISODIC_SUMMARIZER_API_KEY); {endpoint}"
        )
    key = settings.summarizer_api_key
    return OpenAIChatSummarizer(
        settings.summarizer_model,
        base_url=settings.summarizer_base_url,
        api_key=key.get_secret_value() if key is not None else None,
        timeout=settings.summarizer_timeout,
    )


def options_from_settings(settings: EpisodicSettings) -> CompactionOptions:
    return CompactionOptions(
        compaction=settings.compaction_config(),
        summarizer_timeout=settings.summarizer_timeout,
        max_attempts=settings.max_attempts,
        backoff_base=settings.backoff_base_seconds,
        backoff_max=settings.backoff_max_seconds,
        fallback=settings.fallback_trim,
    )


def worker_from_settings(
    store: EpisodicStore,
    settings: EpisodicSettings,
    *,
    summarizer: Summarizer | None = None,
    metrics: WorkerMetrics | None = None,
) -> CompactionWorker:
    return CompactionWorker(
        store,
        summarizer or summarizer_from_settings(settings),
        concurrency=settings.worker_concurrency,
        options=options_from_settings(settings),
        lease_seconds=settings.lease_seconds,
        poll_interval=settings.poll_interval_seconds,
        sweep_interval=settings.sweep_interval_seconds,
        shutdown_grace=settings.shutdown_grace_seconds,
        metrics=metrics,
    )


__all__ = ["options_from_settings", "summarizer_from_settings", "worker_from_settings"]
