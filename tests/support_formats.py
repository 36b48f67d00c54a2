"""The providers' own SDK types, as validators of what episodic's formats produce.

``openai.types.responses.ResponseInputParam`` and ``anthropic.types.MessageParam`` are
TypedDicts; pydantic validates them through a ``TypeAdapter``. Their ``Iterable[...]`` fields
(a message's content blocks, a tool result's content) validate lazily, one element at a
time as they are iterated, so a check that only calls ``validate_python`` would accept any
blocks at all: :func:`check_responses` and :func:`check_anthropic` iterate everything.

A missing SDK skips the calling test (or fails the run where CI requires every extra), the
way :func:`tests.support.require_extra` does for any extra.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from pydantic import TypeAdapter

from tests.support import require_extra

__all__ = ["anthropic_adapter", "check_anthropic", "check_responses", "responses_adapter"]


@functools.cache
def responses_adapter() -> TypeAdapter[Any]:
    """``responses.create(input=...)``'s type, from the installed openai SDK."""
    types = require_extra("openai.types.responses", "openai")
    return TypeAdapter(types.ResponseInputParam)


@functools.cache
def anthropic_adapter() -> TypeAdapter[Any]:
    """``messages.create(messages=...)``'s type, from the installed anthropic SDK."""
    types = require_extra("anthropic.types", "anthropic")
    return TypeAdapter(list[types.MessageParam])


def check_responses(items: list[dict[str, Any]]) -> None:
    """Raise pydantic's ``ValidationError`` unless ``items`` is valid Responses input."""
    _check(responses_adapter(), items, _VALID_ITEMS)


def check_anthropic(turns: list[dict[str, Any]]) -> None:
    """Raise pydantic's ``ValidationError`` unless ``turns`` is a valid Messages list."""
    _check(anthropic_adapter(), turns, _VALID_TURNS)


#: The elements already found valid, by their JSON. Both types are lists whose elements are
#: validated independently, so a list is valid when each of its elements is; the property
#: tests check tens of thousands of contexts made of the same few turns, and validating the
#: unions of every content block again dominates their run time without this.
_VALID_ITEMS: set[bytes] = set()
_VALID_TURNS: set[bytes] = set()
_VALID_MAX = 100_000


def _check(adapter: TypeAdapter[Any], elements: list[dict[str, Any]], valid: set[bytes]) -> None:
    if not isinstance(elements, list):
        adapter.validate_python(elements)  # refused with pydantic's own message
    for element in elements:
        key = orjson.dumps(element)
        if key in valid:
            continue
        _drain(adapter.validate_python([element]))
        if len(valid) < _VALID_MAX:
            valid.add(key)


def _drain(value: Any) -> None:
    """Iterate every lazily validated iterable inside ``value``: its elements are validated
    (and refused) only then."""
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return
    if isinstance(value, Mapping):
        for item in value.values():
            _drain(item)
    elif isinstance(value, Iterable):
        for item in value:
            _drain(item)
