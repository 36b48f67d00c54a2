"""Checks of single values the database must be able to store, shared by every entry point:
text a column can hold, integers in a column's range, usage within its bounds. Each returns
the value or raises :class:`ValidationError` naming the field, before any SQL runs."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from episodic.errors import ValidationError
from episodic.models import Usage

#: The largest seq, and count, a column holds (PostgreSQL's bigint).
MAX_SEQ = 2**63 - 1
#: 2**53, the largest integer a JSON number holds exactly everywhere: a bound published in a
#: schema must be it or below (above it a client's float parser rounds 2**62 + 95 down to
#: 2**62 and believes it is within the published maximum)
MAX_EXACT_JSON_INT = 2**53
MAX_READ_LIMIT = 10_000
MAX_TENANT_ID_LENGTH = 256
#: The longest app name or user id a conversation is listed under (and an export may carry).
MAX_LISTING_LENGTH = 512
#: The longest worker name (``owner``) and claim reason the queue records.
MAX_CLAIM_TEXT_LENGTH = 512
#: The longest lease: a crashed worker's claim holds its conversation this long at most.
MAX_LEASE_SECONDS = 7 * 86_400


def check_text(value: object, *, field: str, max_length: int, min_length: int = 1) -> str:
    """``value`` if a text column can hold it: a string of ``min_length`` to ``max_length``
    characters, without NUL (PostgreSQL text cannot hold it) and encodable as UTF-8 (a lone
    surrogate is not, and would reach the driver as an encoding error)."""
    if not isinstance(value, str) or not min_length <= len(value) <= max_length:
        least = "a non-empty string" if min_length else "a string"
        raise ValidationError(
            f"{field} must be {least} of at most {max_length} characters", field=field
        )
    if "\x00" in value:
        raise ValidationError(f"{field} contains a NUL character", field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(
            f"{field} is not valid Unicode: a lone surrogate at index {exc.start}", field=field
        ) from exc
    return value


def check_int(value: object, *, field: str, low: int, high: int) -> int:
    """``value`` if it is an integer (not a bool) from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{field} must be an integer from {low:,} to {high:,}", field=field)
    return value


def checked_usage(usage: object) -> Usage:
    """``usage`` validated again: an instance built with ``model_construct`` skipped the
    bounds that keep its counts storable (see :data:`~episodic.models.MAX_TOKEN_COUNT`)."""
    if not isinstance(usage, Usage):
        raise ValidationError("usage must be an episodic.Usage", field="usage")
    try:
        return Usage.model_validate(usage.model_dump(warnings=False), strict=True)
    except ValueError as exc:  # pydantic's ValidationError
        raise ValidationError(f"usage is not a valid Usage: {exc}", field="usage") from exc


def parse_conversation_id(value: UUID | str) -> UUID:
    """A conversation id as a UUID; anything else is a :class:`ValidationError`."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise ValidationError(
        f"conversation id must be a UUID, got {value!r:.80}", field="conversation_id"
    )


def check_seq(value: Any, name: str) -> None:
    """A seq, or a count of events, a bigint column can hold."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        raise ValidationError(f"{name} must be an integer from 0 to 2**63-1", field=name)


def check_limit(limit: Any) -> None:
    """How many rows one read may ask for."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_READ_LIMIT:
        raise ValidationError(f"limit must be between 1 and {MAX_READ_LIMIT}", field="limit")


def check_tenant(tenant_id: Any) -> None:
    """A tenant id: non-empty text of at most :data:`MAX_TENANT_ID_LENGTH` characters."""
    check_text(tenant_id, field="tenant_id", max_length=MAX_TENANT_ID_LENGTH)


def check_lease(owner: Any, lease_seconds: Any) -> None:
    """What both ways of claiming take: the worker's name, and a lease that ends after it
    is granted but within :data:`MAX_LEASE_SECONDS` (NaN and infinity fail the comparison)."""
    check_text(owner, field="owner", max_length=MAX_CLAIM_TEXT_LENGTH)
    if (
        isinstance(lease_seconds, bool)
        or not isinstance(lease_seconds, int | float)
        or not 0 < lease_seconds <= MAX_LEASE_SECONDS
    ):
        raise ValidationError(
            f"lease_seconds must be a number of seconds above 0 and at most {MAX_LEASE_SECONDS:,}",
            field="lease_seconds",
        )


__all__ = [
    "MAX_CLAIM_TEXT_LENGTH",
    "MAX_LEASE_SECONDS",
    "MAX_LISTING_LENGTH",
    "MAX_READ_LIMIT",
    "MAX_SEQ",
    "MAX_TENANT_ID_LENGTH",
    "check_int",
    "check_lease",
    "check_limit",
    "check_seq",
    "check_tenant",
    "check_text",
    "checked_usage",
    "parse_conversation_id",
]
