"""Checks of single values the database must be able to store, shared by every entry point:
text a column can hold, integers in a column's range, usage within its bounds. Each returns
the value or raises :class:`ValidationError` naming the field, before any SQL runs."""

from __future__ import annotations

from episodic.errors import ValidationError
from episodic.models import Usage

#: The largest seq, and count, a column holds (PostgreSQL's bigint).
MAX_SEQ = 2**63 - 1


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


__all__ = ["MAX_SEQ", "check_int", "check_text", "checked_usage"]
