"""The field types of the API's request bodies, shared by every format: ids and names as the
store keeps them, JSON values it can store, and the base of the request models.

They say in the published schema what the store refuses, so that a request the schema
accepts is one the store takes: an id or a name is database text, which cannot hold NUL;
a conversation's metadata is a ``jsonb`` document, which cannot hold NUL anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from episodic.errors import ValidationError

#: text without NUL (a ``text`` column cannot hold it)
NO_NUL = r"^[^\x00]*$"
#: the longest id (a tool call's, a message's client id) and tool name the store keeps
MAX_ID_LENGTH = 512

#: the integers the store's JSON encoder writes (a signed or an unsigned 64-bit integer)
MIN_STORED_INT = -(2**63)
MAX_STORED_INT = 2**64 - 1


def _integral(value: Any) -> Any:
    """JSON Schema's integers: ``2.0`` is the integer 2 (JSON numbers have one type)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: reads an integer as JSON Schema has it: ``2`` or ``2.0``, not ``true`` nor ``"2"`` (with
#: strict validation, which the request bodies get); after any bounds, so that the schema
#: states them: ``Annotated[int, Field(ge=0), INTEGRAL]``
INTEGRAL = BeforeValidator(_integral)
Integer: TypeAlias = Annotated[int, INTEGRAL]


def _storable(value: int) -> int | float:
    if MIN_STORED_INT <= value <= MAX_STORED_INT:
        return value
    try:
        return float(value)
    except OverflowError:
        raise ValidationError(
            "a number beyond the range of a float (1.8e308), which nothing stores"
        ) from None


def storable_number(text: str) -> int | float:
    """A JSON integer's value as the store can keep it: beyond 64 bits, the nearest float
    (what JavaScript reads it as; JSON promises no more of a number that large); beyond a
    float's range, :class:`~episodic.errors.ValidationError`."""
    return _storable(int(text))


def storable_numbers(value: Any) -> Any:
    """``value`` (JSON as Python) with each integer beyond 64 bits made the nearest float
    (see :func:`storable_number`), for JSON another parser read."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return _storable(value)
    if isinstance(value, dict):
        return {key: storable_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [storable_numbers(item) for item in value]
    return value


#: a tool call's id, the id a result answers, a message's client id
Identifier: TypeAlias = Annotated[
    str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_NUL)
]
#: a tool's name
ToolName: TypeAlias = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_NUL)]
#: a name kept as database text (a message's author, a tool result's tool)
Name: TypeAlias = Annotated[str, Field(pattern=NO_NUL)]


#: the name, in /openapi.json, of the schema of a JSON value holding a NUL character
HOLDS_NUL = "HoldsNul"
#: A JSON value with a NUL character in a string or a key, at any depth: what a document
#: cannot hold. (A document is said to be ``not`` this rather than spelled out as a union of
#: its own: a TypeScript generator makes a recursive union an index signature that
#: openapi-fetch's request types cannot take.)
HOLDS_NUL_SCHEMA: dict[str, Any] = {
    "description": "a JSON value holding a NUL character, in a string or a key, at any depth",
    "anyOf": [
        {"type": "string", "pattern": "\\x00"},
        {"type": "array", "contains": {"$ref": f"#/components/schemas/{HOLDS_NUL}"}},
        {"type": "object", "not": {"propertyNames": {"pattern": NO_NUL}}},
        {
            "type": "object",
            "not": {"additionalProperties": {"not": {"$ref": f"#/components/schemas/{HOLDS_NUL}"}}},
        },
    ],
}
#: the schemas /openapi.json needs beside the models' own
EXTRA_COMPONENTS: dict[str, dict[str, Any]] = {HOLDS_NUL: HOLDS_NUL_SCHEMA}
#: Marks the schema of a :data:`DocumentValue`: /openapi.json says ``not`` :data:`HOLDS_NUL`
#: in its place (pydantic refuses a reference to a schema it did not make).
DOCUMENT_VALUE = "x-episodic-document-value"


def refer_to_extra_components(schema: Any) -> None:
    """In an OpenAPI document's schemas (``schema``, walked whole), make each marked
    :data:`DocumentValue` ``not`` :data:`HOLDS_NUL` (which :data:`EXTRA_COMPONENTS` has)."""
    if isinstance(schema, dict):
        if schema.pop(DOCUMENT_VALUE, False):
            schema["not"] = {"$ref": f"#/components/schemas/{HOLDS_NUL}"}
        for value in schema.values():
            refer_to_extra_components(value)
    elif isinstance(schema, list):
        for item in schema:
            refer_to_extra_components(item)


def _nul_at(value: Any, path: str) -> str | None:
    """Where ``value`` holds a NUL character (``[2].key``), None when nowhere."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, list):
        return next(
            (at for i, item in enumerate(value) if (at := _nul_at(item, f"{path}[{i}]"))), None
        )
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                return f"{path}[{key!r}]"
            if (at := _nul_at(item, f"{path}.{key}")) is not None:
                return at
    return None


def _nul_free(value: JsonValue) -> JsonValue:
    at = _nul_at(value, "")
    if at is not None:
        raise ValueError(
            f"a NUL character at {at.lstrip('.') or 'the value'}, which no document stores"
        )
    return value


#: Any JSON value a ``jsonb`` document holds: no NUL character in a string or a key.
DocumentValue: TypeAlias = Annotated[
    JsonValue,
    AfterValidator(_nul_free),
    WithJsonSchema({"description": "any JSON value without a NUL character", DOCUMENT_VALUE: True}),
]


def without_defaults(schema: dict[str, Any]) -> None:
    """Leave the defaults out of a request model's schema: a client generator
    (openapi-typescript) makes a property with a default required, and a field left out of
    a request means what its description says."""
    for field in schema.get("properties", {}).values():
        field.pop("default", None)


class RequestModel(BaseModel):
    """The base of the request models: unknown fields refused, no defaults in the schema."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=without_defaults)


class OpenModel(BaseModel):
    """The base of a provider's objects: fields it adds that episodic has no field for are
    any JSON (the conversion keeps them in the message's ``native``, or leaves them)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=without_defaults)
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)


@dataclass(frozen=True, slots=True)
class NoneOf:
    """Annotates a string that is none of ``known``: the ``type`` of an object of a kind
    without a schema of its own. The schema says ``not`` one of them, so that exactly one
    member of a union takes each object, as ``oneOf`` means."""

    known: frozenset[str]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        """The string's schema, then a refusal of the known values."""
        return core_schema.no_info_after_validator_function(self._unknown, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The string's schema, ``not`` any of the known values."""
        return {**handler(schema), "not": {"enum": sorted(self.known)}}

    def _unknown(self, value: str) -> str:
        if value in self.known:
            raise ValueError(f"{value!r} is a type with a schema of its own")
        return value


def other_type(known: frozenset[str]) -> NoneOf:
    """The annotation of an other kind's ``type``: ``Annotated[str, other_type(KNOWN)]``."""
    return NoneOf(known)


def type_tag(known: frozenset[str], other: str = "other") -> Any:
    """A union's discriminator by ``type``: a known type is its own tag, any other string
    ``other``; an object without a string type has no tag (refused)."""

    def tag(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if not isinstance(kind, str):
            return None
        return kind if kind in known else other

    return tag


__all__ = [
    "EXTRA_COMPONENTS",
    "HOLDS_NUL",
    "INTEGRAL",
    "MAX_ID_LENGTH",
    "MAX_STORED_INT",
    "MIN_STORED_INT",
    "NO_NUL",
    "DocumentValue",
    "Identifier",
    "Integer",
    "Name",
    "NoneOf",
    "OpenModel",
    "RequestModel",
    "ToolName",
    "other_type",
    "refer_to_extra_components",
    "storable_number",
    "storable_numbers",
    "type_tag",
    "without_defaults",
]
