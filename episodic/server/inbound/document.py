"""The request bodies' part of /openapi.json FastAPI cannot write: the append's body (the
route reads it itself, as the query's ``?format=`` can name its format, which no schema can
tie to it), one named schema per format under ``AppendRequest``; and the schemas the
request models name by hand (:data:`episodic.server.fields.EXTRA_COMPONENTS`)."""

from __future__ import annotations

from typing import Any

from episodic.server.fields import EXTRA_COMPONENTS, refer_to_extra_components
from episodic.server.inbound.append import APPEND_REQUEST

#: where the OpenAPI document keeps its named schemas
REF_TEMPLATE = "#/components/schemas/{model}"
APPEND_OPERATION = "append"
#: the name of the append's body schema, and what it says
APPEND_REQUEST_NAME = "AppendRequest"
APPEND_REQUEST_DESCRIPTION = (
    "Messages to append atomically, in order, in the format their `format` names: "
    "`episodic` (the default: leave it out), `openai` (chat completions), `responses` "
    "(OpenAI Responses items) or `anthropic` (Messages API turns), each what "
    "`GET .../context?format=` gives in that format. The query's `?format=` may name it "
    "instead."
)


def document_requests(schema: dict[str, Any]) -> None:
    """Add the append's request body to ``schema`` (an OpenAPI document FastAPI made), and
    the schemas it and the other request models name to its components. A name FastAPI
    already uses for another schema is an error: two schemas of one name would make one of
    them wrong."""
    generated = APPEND_REQUEST.json_schema(ref_template=REF_TEMPLATE, mode="validation")
    named: dict[str, Any] = {**EXTRA_COMPONENTS, **generated.pop("$defs", {})}
    named[APPEND_REQUEST_NAME] = {
        "title": APPEND_REQUEST_NAME,
        "description": APPEND_REQUEST_DESCRIPTION,
        **generated,
    }
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in named.items():
        if components.setdefault(name, definition) != definition:
            raise RuntimeError(f"two different schemas are named {name} in /openapi.json")
    refer_to_extra_components(components)
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and operation.get("operationId") == APPEND_OPERATION:
                operation["requestBody"] = {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"$ref": REF_TEMPLATE.format(model=APPEND_REQUEST_NAME)}
                        }
                    },
                }


__all__ = ["document_requests"]
