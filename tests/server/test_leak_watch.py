"""The watch on the server tests' answers (tests/server/conftest.py) sees them, and knows the
internals' text when it is there: a check that could not fail would prove nothing. And what
decides that an error's message is withheld (episodic.server.disclosure)."""

from __future__ import annotations

import io
import uuid
from typing import Any

import asyncpg
import httpx
import pytest
import requests
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from episodic import errors
from episodic.server.disclosure import FALLBACK_DETAIL, PUBLIC_DETAILS, public_detail
from episodic.server.problems import error_problem
from tests.server.conftest import AnswerWatch
from tests.server.leaks import leaks_in

#: what the issue's server answered
LEAKED = (
    "the episodic schema is missing or out of date: run `episodic migrate` ((sqlalchemy."
    "dialects.postgresql.asyncpg.ProgrammingError) <class 'asyncpg.exceptions."
    'UndefinedTableError\'>: relation "episodic_api_keys" does not exist [SQL: SELECT '
    "episodic_api_keys.key_id, episodic_api_keys.secret_sha256 FROM episodic_api_keys])"
)


def test_the_markers_find_the_leak_and_not_an_answer() -> None:
    found = leaks_in(LEAKED)
    assert {"[SQL:", "SELECT ", 'relation "', "episodic_api_keys", "asyncpg."} <= set(found)
    said = dict(PUBLIC_DETAILS)[errors.SchemaNotMigratedError]
    assert leaks_in(said) == []
    assert leaks_in('{"role": "user", "content": "what is the capital of France?"}') == []


async def test_the_watch_reads_every_answer(answers_hold_no_internals: AnswerWatch) -> None:
    async def leaky(_: Request) -> JSONResponse:
        return JSONResponse({"detail": LEAKED}, status_code=503)

    app = Starlette(routes=[Route("/leak", leaky)])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        await http.get("/leak")
    assert answers_hold_no_internals.answers == 1
    assert len(answers_hold_no_internals.leaks) == 1
    answers_hold_no_internals.leaks.clear()  # seen: this test's own leak fails nothing


class LeakyAdapter(requests.adapters.BaseAdapter):
    """A transport for requests that answers every request with the issue's leak."""

    def send(  # type: ignore[override]  # requests' own adapters take these as keywords
        self, request: requests.PreparedRequest, **_: Any
    ) -> requests.Response:
        response = requests.Response()
        response.status_code = 503
        response.raw = io.BytesIO(LEAKED.encode())
        response.headers["content-type"] = "application/problem+json"
        response.url = str(request.url)
        response.request = request
        return response

    def close(self) -> None:
        """Nothing to close."""


def test_the_watch_reads_what_schemathesis_reads(
    answers_hold_no_internals: AnswerWatch,
) -> None:
    session = requests.Session()
    session.mount("http://", LeakyAdapter())
    session.get("http://leak.test/v1/conversations", stream=True)  # as schemathesis asks
    assert len(answers_hold_no_internals.leaks) == 1
    answers_hold_no_internals.leaks.clear()


def _raised_from(driver_error: BaseException, error: errors.EpisodicError) -> errors.EpisodicError:
    try:
        raise error from driver_error
    except errors.EpisodicError as raised:
        return raised


@pytest.mark.parametrize(
    ("error", "status", "withheld"),
    [
        (errors.ValidationError("content must be a string"), 422, False),
        (errors.SchemaNotMigratedError("relation x", revision=None, expected=None), 503, True),
        (
            _raised_from(
                asyncpg.exceptions.UntranslatableCharacterError("\\u0000 cannot be converted"),
                errors.ValidationError("the database cannot store this input: DETAIL: ..."),
            ),
            422,
            True,
        ),
        (errors.ConflictError("the id is taken", conversation_id=uuid.uuid4()), 409, False),
    ],
)
def test_a_message_is_withheld_for_a_server_error_or_the_database(
    error: errors.EpisodicError, status: int, withheld: bool
) -> None:
    said = public_detail(error, status, "req-1")
    assert (said != str(error)) is withheld
    if withheld:
        assert said in dict(PUBLIC_DETAILS).values() or said == FALLBACK_DETAIL
    answer = error_problem(error, instance="/x", status=status, request_id="req-1")
    assert leaks_in(bytes(answer.body).decode()) == []
    assert (b'"request_id":"req-1"' in answer.body) is (status >= 500)


async def test_the_watch_forgives_only_what_the_client_sent(
    answers_hold_no_internals: AnswerWatch,
) -> None:
    """A message the client wrote that names a table comes back in the context: that is an
    echo, not a leak. A marker the client never sent still counts."""

    async def echo(request: Request) -> JSONResponse:
        said = (await request.body()).decode()
        return JSONResponse({"content": said, "detail": "asyncpg." if "leak" in said else ""})

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        await http.post("/echo", content=b"see episodic_events")
        assert answers_hold_no_internals.leaks == []
        await http.post("/echo", content=b"leak episodic_events")
    assert len(answers_hold_no_internals.leaks) == 1
    assert "['asyncpg.']" in answers_hold_no_internals.leaks[0]
    answers_hold_no_internals.leaks.clear()  # seen: this test's own leak fails nothing
