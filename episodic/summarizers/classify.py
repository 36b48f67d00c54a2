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
from http import HTTPStatus

from episodic.summarizers.base import SummarizerError, is_retryable_status

#: Exception class names that mean the request may not have reached the server, or its answer
#: did not arrive: worth another attempt.
TRANSIENT_ERROR_NAMES = frozenset(
    {"APIConnectionError", "APITimeoutError", "TransportError", "TimeoutException"}
)
_DETAIL_CHARS = 300


def summarizer_error(
    exc: BaseException, *, summarizer: str, endpoint: str | None = None
) -> SummarizerError:
    """``exc`` as a :class:`SummarizerError` naming ``summarizer``, with ``retryable``, the
    HTTP status and the server's retry hint filled in where they can be read. Raise the result
    ``from exc`` so the original stays in the traceback.

    ``endpoint`` says where the request went (e.g. ``https://api.openai.com/v1 (model m)``);
    given, the message starts ``<summarizer> at <endpoint>: `` so an operator reading the
    attempts ledger or the log knows which endpoint failed."""
    if isinstance(exc, SummarizerError):
        return exc
    where = summarizer if endpoint is None else f"{summarizer} at {endpoint}"
    target = "the model endpoint" if endpoint is None else "the endpoint"
    origin = " from the model endpoint" if endpoint is None else ""
    detail = _detail(exc)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 400:
        return SummarizerError(
            f"{where}: HTTP {_status_text(status)}{origin}: {detail}",
            summarizer=summarizer,
            retryable=is_retryable_status(status),
            status_code=status,
            retry_after=retry_after_seconds(getattr(exc, "response", None)),
            endpoint=endpoint,
        )
    if isinstance(exc, OSError) or _has_transient_name(exc):
        return SummarizerError(
            f"{where}: {target} could not be reached or did not answer in time: {detail}",
            summarizer=summarizer,
            retryable=True,
            endpoint=endpoint,
        )
    return SummarizerError(
        f"{where}: {detail}", summarizer=summarizer, retryable=False, endpoint=endpoint
    )


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


def _status_text(status: int) -> str:
    """``401 Unauthorized``; just the number for a status HTTP does not name."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def _detail(exc: BaseException) -> str:
    text = _one_line(exc)
    # SDK transport errors say little ("Connection error."): the cause says what happened.
    cause = exc.__cause__
    if cause is not None:
        reason = _one_line(cause)
        if reason not in text:
            text = f"{text} ({reason})"
    if len(text) > _DETAIL_CHARS:
        text = text[: _DETAIL_CHARS - 1] + "…"
    return text


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split()) or '(no message)'}"


__all__ = ["TRANSIENT_ERROR_NAMES", "retry_after_seconds", "summarizer_error"]
