"""Errors as RFC 9457 ``application/problem+json``: each ``episodic.errors`` class has one
HTTP status, and the problem's ``type`` names the class, so a client in any language can tell
a stale write from an orphan tool result without parsing the message. A server error says
no more than its class and the request's id (:mod:`episodic.server.disclosure`)."""

from __future__ import annotations

import http
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from episodic import errors
from episodic.server.access_log import REQUEST_ID
from episodic.server.disclosure import UNEXPECTED_DETAIL, public_detail

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "https://episodic.dev/errors/"
#: seconds a client should wait before retrying when the database is away
RETRY_AFTER_SECONDS = 1

#: most specific first: the first class an error is an instance of decides its status
STATUS_OF: tuple[tuple[type[errors.EpisodicError], int], ...] = (
    (errors.AuthenticationError, 401),
    (errors.OperatorRequiredError, 403),
    (errors.MessageTooLargeError, 413),
    (errors.UnsupportedMediaTypeError, 415),
    (errors.IdempotencyMismatchError, 422),
    (errors.ValidationError, 422),
    (errors.TenantDeniedError, 404),  # another tenant's conversation: not there for you
    (errors.NotFoundError, 404),
    (errors.ErasureDeniedError, 403),
    (errors.ConflictError, 409),
    (errors.LeaseLostError, 409),
    (errors.IntegrityViolationError, 409),
    (errors.TransientDatabaseError, 503),
    (errors.OverloadedError, 503),
    (errors.SchemaNotMigratedError, 503),
    (errors.CompactionUnavailableError, 501),
    (errors.ConfigurationError, 501),  # a route whose optional dependency is not installed
)


class Problem(BaseModel):
    """An error, as RFC 9457 describes it. ``type`` ends with the name of the
    ``episodic.errors`` class (``.../errors/ConflictError``); ``errors`` lists a request's
    invalid parts when there are several."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="URI naming the kind of error: ends with the error class")
    title: str = Field(description="the HTTP status phrase")
    status: int = Field(description="the HTTP status code")
    detail: str | None = Field(default=None, description="what went wrong, for a person")
    instance: str | None = Field(default=None, description="the request path")
    request_id: str | None = Field(
        default=None,
        description="a server error's request id (X-Request-ID): the server's log has what "
        "went wrong under it",
    )


class ProblemResponse(JSONResponse):
    """A JSON response of type ``application/problem+json``."""

    media_type = PROBLEM_MEDIA_TYPE


def problem(
    status: int,
    detail: str | None,
    *,
    kind: str = "about:blank",
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> ProblemResponse:
    """A problem answer: ``status`` with its phrase as the title, ``kind`` (an
    ``episodic.errors`` class name) as the type, and any ``extensions`` members."""
    body: dict[str, Any] = {
        "type": kind if kind == "about:blank" else TYPE_PREFIX + kind,
        "title": http.HTTPStatus(status).phrase,
        "status": status,
        **extensions,
    }
    if detail is not None:
        body["detail"] = detail
    if instance is not None:
        body["instance"] = instance
    return ProblemResponse(body, status_code=status, headers=headers)


def status_of(error: errors.EpisodicError) -> int:
    """The HTTP status of ``error``'s class (500 for a class not listed)."""
    for cls, status in STATUS_OF:
        if isinstance(error, cls):
            return status
    return 500


def error_problem(
    error: errors.EpisodicError,
    *,
    instance: str,
    status: int | None = None,
    request_id: str | None = None,
) -> ProblemResponse:
    """The problem for an episodic error (``status`` overrides, e.g. 412 for If-Match). A
    server error, or one the database raised, says its class and a fixed sentence, not its
    message (the log has that, under ``request_id``, which a server error carries)."""
    code = status or status_of(error)
    headers = (
        {"Retry-After": str(RETRY_AFTER_SECONDS)}
        if code == 503
        else {"WWW-Authenticate": 'Bearer realm="episodic"'}
        if code == 401
        else None
    )
    extensions: dict[str, Any] = {}
    if isinstance(error, errors.ValidationError) and error.field is not None:
        extensions["field"] = error.field
    if code >= 500:
        extensions["request_id"] = request_id
    detail = public_detail(error, code, request_id)
    return problem(
        code, detail, kind=type(error).__name__, instance=instance, headers=headers,
        **extensions,
    )  # fmt: skip


def overloaded_problem(
    error: errors.OverloadedError, *, instance: str, request_id: str | None
) -> ProblemResponse:
    """The 503 of a request refused for overload. Built here rather than by
    :func:`error_problem`, which logs each withheld 5xx: under overload a warning per refusal
    would add work at the worst moment, and the message holds nothing internal (the metrics
    count the refusals)."""
    return problem(
        503,
        str(error),
        kind=type(error).__name__,
        instance=instance,
        headers={"Retry-After": str(error.retry_after)},
        request_id=request_id,
    )


def unexpected_problem(*, instance: str, request_id: str) -> ProblemResponse:
    """The 500 for an error that is not episodic's (a bug): nothing of it but the request's
    id, which the server's log has it under."""
    return problem(
        500,
        UNEXPECTED_DETAIL,
        instance=instance,
        headers={REQUEST_ID: request_id},
        request_id=request_id,
    )
