"""Provider exceptions translated into :class:`SummarizerError`, in one place.

Duck-typed so that no SDK has to be imported to classify its errors: an HTTP status comes from
a ``status_code`` attribute (``openai``, ``anthropic`` and other generated SDKs have one), and
transport failures are recognised by class name along the MRO (the SDKs' ``APIConnectionError``
and ``APITimeoutError``, httpx's ``TransportError`` and ``TimeoutException``) or as an
``OSError`` (which includes ``TimeoutError`` and ``ConnectionError``). Anything else is taken
as permanent: retrying a bug only delays the dead state.
"""

from __future__ import annotations

from collections.abc import Mapping

from episodic.summarizers.base import SummarizerError, is_retryable_status

#: Exception class names that mean the request may not have reached the server, or its answer
#: did not arrive: worth another attempt.
TRANSIENT_ERROR_NAMES = frozenset(
    {"APIConnectionError", "APITimeoutError", "TransportError", "TimeoutException"}
)
_DETAIL_CHARS = 300


def summarizer_error(exc: BaseException, *, summarizer: str) -> SummarizerError:
    """``exc`` as a :class:`SummarizerError` naming ``summarizer``, with ``retryable``, the
    HTTP status and the server's retry hint filled in where they can be read. Raise the result
    ``from exc`` so the original stays in the traceback."""
    if isinstance(exc, SummarizerError):
        return exc
    detail = _detail(exc)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 400:
        return SummarizerError(
            f"{summarizer}: HTTP {status} from the model endpoint: {detail}",
            summarizer=summarizer,
            retryable=is_retryable_status(status),
            status_code=status,
            retry_after=retry_after_seconds(getattr(exc, "response", None)),
        )
    if isinstance(exc, OSError) or _has_transient_name(exc):
        return SummarizerError(
            f"{summarizer}: the model endpoint could not be reached or did not answer in time: "
            f"{detail}",
            summarizer=summarizer,
            retryable=True,
        )
    return SummarizerError(f"{summarizer}: {detail}", summarizer=summarizer, retryable=False)


def retry_after_seconds(response: object) -> float | None:
    """The server's ``retry-after-ms`` or ``retry-after`` header in seconds, when it is a
    non-negative number (an HTTP-date is ignored: reading it would need the clock)."""
    headers = getattr(response, "headers", None)
    if not isinstance(headers, Mapping):
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except (TypeError, ValueError):
            continue
        if seconds >= 0:
            return seconds
    return None


def _has_transient_name(exc: BaseException) -> bool:
    return any(cls.__name__ in TRANSIENT_ERROR_NAMES for cls in type(exc).__mro__)


def _detail(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    if len(text) > _DETAIL_CHARS:
        text = text[: _DETAIL_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {text}"


__all__ = ["TRANSIENT_ERROR_NAMES", "retry_after_seconds", "summarizer_error"]
