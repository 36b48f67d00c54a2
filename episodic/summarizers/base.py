"""What every summarizer is: the protocol the compaction worker calls, its result, its error.

The worker owns timeouts, retries, backoff and the dead state; a summarizer makes exactly one
attempt per call and says, through :class:`SummarizerError`, whether another attempt could
succeed. A summarizer never turns a failure into text: an error message stored as a handoff
would silently replace the history it was meant to carry.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import ConfigDict

from episodic.compaction import CompactionRequest
from episodic.errors import EpisodicError
from episodic.models import EpisodicModel, Usage

#: HTTP statuses worth another attempt: the server was busy, overloaded or broken for a
#: moment (408 and 409 are retried by the ``openai`` SDK itself for the same reason).
RETRYABLE_STATUSES = frozenset({408, 409, 429})


class SummaryResult(EpisodicModel):
    """One summarizer answer: the handoff ``text`` (possibly empty: the worker decides what an
    empty summary means), the provider-reported ``usage`` for the attempts ledger, and the
    ``model`` that actually answered (which may differ from the one asked for)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    usage: Usage | None = None
    model: str | None = None


class Summarizer(Protocol):
    """Anything that turns a compaction request into a handoff text.

    ``name`` identifies the summarizer in logs, metrics and attempt rows. ``summarize`` makes
    one attempt and raises :class:`SummarizerError` when it fails.
    """

    name: str

    async def summarize(self, request: CompactionRequest) -> SummaryResult: ...


class SummarizerError(EpisodicError):
    """A summarizer call failed; nothing may be written as a summary.

    Raised by the adapters in :mod:`episodic.summarizers` for provider errors, timeouts and
    unusable responses. ``retryable`` says whether the same request may succeed later
    (rate limits, 5xx, timeouts, dropped connections) or will fail the same way (bad request,
    bad key, unknown model). ``status_code`` is the HTTP status when there was one;
    ``retry_after`` is the server's hint in seconds, for the worker's backoff to respect.
    ``endpoint`` says where the failed request went (an HTTP adapter's base URL and model), when
    the summarizer has one; the message names it too.
    """

    def __init__(
        self,
        message: str,
        *,
        summarizer: str,
        retryable: bool,
        status_code: int | None = None,
        retry_after: float | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.summarizer = summarizer
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after = retry_after
        self.endpoint = endpoint


def is_retryable_status(status_code: int) -> bool:
    """Whether an HTTP error status is transient: 408, 409, 429 and every 5xx."""
    return status_code in RETRYABLE_STATUSES or status_code >= 500


__all__ = [
    "RETRYABLE_STATUSES",
    "Summarizer",
    "SummarizerError",
    "SummaryResult",
    "is_retryable_status",
]
