"""Answers encoded once, straight to bytes, on the routes every agent turn calls.

A route that returns a model has FastAPI validate it against its ``response_model`` again
and then serialize it; a route that returns a :class:`Response` is sent as it is. The hot
routes keep ``response_model=`` (it writes their part of the OpenAPI document) and return
what pydantic-core's serializer makes of the same model: the bytes FastAPI would send. A
200-message context takes about 220 µs so, where dumping each message to a dict took 360 µs
before FastAPI validated and encoded the lot (cProfile on a live server, issue 35)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response
from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_json

from episodic import Context, Message
from episodic.server.schemas import ContextFormat
from episodic.store.stored_context import StoredContext

JSON = "application/json"
#: a context's messages in episodic's own format: each message's fields, no nulls
_MESSAGES = TypeAdapter(list[Message])


def json_answer(
    model: BaseModel, *, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``model`` as its JSON, as FastAPI would serialize it for a ``response_model``."""
    return Response(
        model.__pydantic_serializer__.to_json(model),
        status_code=status_code,
        headers=headers,
        media_type=JSON,
    )


def _plain_json(value: list[dict[str, Any]]) -> bytes:
    """A format's plain JSON values: orjson, five times quicker than pydantic-core here, which
    writes what orjson will not (an integer past 64 bits)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return to_json(value)


def context_answer(
    context: Context | StoredContext, format: ContextFormat, *, headers: dict[str, str]
) -> Response:
    """A loaded context as the route's ``LoadedContext`` in ``format``, encoded in one pass:
    the messages are serialized from the models, never made into dicts first; a context
    loaded as stored (episodic's format only) splices the log's own JSON
    (:meth:`StoredContext.messages_json`), which parses to the models' dump."""
    messages: bytes
    if isinstance(context, StoredContext):
        if format != "episodic":
            raise ValueError(
                f"a context loaded as stored is answered in episodic's format, not {format}"
            )
        messages = context.messages_json()
    elif format == "openai":
        messages = _plain_json(context.to_openai())
    elif format == "responses":
        messages = _plain_json(context.to_responses())
    elif format == "anthropic":
        messages = _plain_json(context.to_anthropic())
    else:
        messages = _MESSAGES.dump_json(list(context.messages), exclude_none=True)
    # LoadedContext's fields, in its order, around the messages already encoded
    head: dict[str, Any] = {
        "conversation_id": str(context.conversation_id),
        "format": format,
    }
    tail: dict[str, Any] = {
        "estimated_tokens": context.estimated_tokens,
        "last_seq": context.last_seq,
        "boundary_seq": context.boundary_seq,
    }
    body = b"".join((to_json(head)[:-1], b',"messages":', messages, b",", to_json(tail)[1:]))
    return Response(body, headers=headers, media_type=JSON)
