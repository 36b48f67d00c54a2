"""Who is asking and what they sent: the API key in ``Authorization: Bearer``, verified
against the key store (and left on the request for the access log), and a JSON body."""

# No `from __future__ import annotations`: FastAPI reads these dependencies' annotations.
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from episodic import errors
from episodic.server.keys import ApiKey, KeyStore

KeyOf = Callable[[Request, HTTPAuthorizationCredentials | None], Awaitable[ApiKey]]


def key_dependency(keys: KeyStore) -> KeyOf:
    """A dependency answering the request's verified key (else AuthenticationError: 401)."""
    bearer = HTTPBearer(auto_error=False, description="an API key from `episodic keys create`")

    async def key_of(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> ApiKey:
        if credentials is None:
            raise errors.AuthenticationError(
                "no API key: send Authorization: Bearer <key> (episodic keys create makes one)"
            )
        key = await keys.verify(credentials.credentials)
        request.state.api_key = key
        return key

    return key_of


async def json_body(request: Request) -> None:
    """Refuse a body that is not JSON with 415, before it is parsed (FastAPI would try)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json" and not kind.endswith("+json"):
        raise errors.UnsupportedMediaTypeError(
            f"the body must be JSON: send Content-Type: application/json, not {kind or 'none'}"
        )


#: the dependency of each route that reads a JSON body
JsonBody = Depends(json_body)


def require_operator(key: ApiKey, what: str) -> None:
    """Refuse a tenant's key for an operator's operation (OperatorRequiredError: 403)."""
    if not key.operator:
        raise errors.OperatorRequiredError(
            f"the key {key.key_id} is tenant {key.tenant_id!r}'s; {what} needs an operator "
            "key (episodic keys create --operator)"
        )
