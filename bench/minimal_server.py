"""``python -m bench.minimal_server``: the limit ``episodic serve`` is measured against.

The least a server on the same stack can do for the same requests: a Starlette app under
uvicorn (the loop and HTTP parser picked as ``episodic serve`` picks them: uvicorn's
"auto", so uvloop and httptools when they are importable), one asyncpg pool of at most 10
connections per process (episodic's default pool size), and three routes on the paths
episodic serves, so one client and one wrk script drive both:

- ``POST /v1/conversations/{id}/messages`` takes ``{"messages": [one message]}`` and runs one
  INSERT of that message's JSON with the next per-conversation seq (``max(seq) + 1`` in the
  same statement; a concurrent append that took the same seq loses on the primary key and
  is retried) and the ``Idempotency-Key`` stored beside it (not enforced: the minimum);
  it answers 201 with the seq and the message.
- ``GET /v1/conversations/{id}/context`` selects the conversation's last 200 rows and
  answers them as a JSON list of messages (the stored JSON text joined, never decoded).
- ``GET /v1/conversations/{id}`` answers the conversation's last seq (one SELECT of one
  value): the least an authenticated read of one row costs, beside episodic's head.
- ``GET /healthz``: no database.

A bearer token, when ``BENCH_MINIMAL_TOKEN`` is set, is compared in memory (no key read:
the minimum again). ``BENCH_MINIMAL_DATABASE_URL`` is the database (plain ``postgresql://``);
its table is made by :data:`CREATE` (``bench/http.py`` makes it in the throwaway database).
"""

from __future__ import annotations

import argparse
import hmac
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

DATABASE_URL_ENV = "BENCH_MINIMAL_DATABASE_URL"
TOKEN_ENV = "BENCH_MINIMAL_TOKEN"
#: the pool's application_name, which tells its connections apart in pg_stat_activity
APPLICATION_NAME = "bench-minimal"
POOL_MAX_SIZE = 10
#: rows a context load selects
CONTEXT_ROWS = 200
#: a lost race for a seq is retried this many times before answering 503
SEQ_RETRIES = 50

CREATE = """
CREATE TABLE IF NOT EXISTS bench_minimal (
    conversation_id uuid NOT NULL,
    seq bigint NOT NULL,
    payload text NOT NULL,
    idempotency_key text,
    PRIMARY KEY (conversation_id, seq)
)
"""
INSERT = """
INSERT INTO bench_minimal (conversation_id, seq, payload, idempotency_key)
SELECT $1::uuid, coalesce(max(seq), 0) + 1, $2, $3
FROM bench_minimal WHERE conversation_id = $1::uuid
RETURNING seq
"""
TAIL = """
SELECT payload FROM (
    SELECT seq, payload FROM bench_minimal WHERE conversation_id = $1 ORDER BY seq DESC LIMIT $2
) AS tail ORDER BY seq
"""
LAST_SEQ = "SELECT coalesce(max(seq), 0) FROM bench_minimal WHERE conversation_id = $1"
JSON = "application/json"


def _problem(status: int, detail: str) -> Response:
    return Response(orjson.dumps({"detail": detail}), status, media_type=JSON)


def _authorized(request: Request) -> bool:
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


async def healthz(request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type=JSON)


async def append(request: Request) -> Response:
    if not _authorized(request):
        return _problem(401, "a valid bearer token is needed")
    try:
        body: Any = orjson.loads(await request.body())
        messages = body["messages"]
        if not isinstance(messages, list) or len(messages) != 1:
            return _problem(422, "exactly one message")
        payload = orjson.dumps(messages[0])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return _problem(400, 'the body is not {"messages": [...]}')
    pool: asyncpg.Pool = request.app.state.pool
    key = request.headers.get("idempotency-key")
    conversation = request.path_params["conversation_id"]
    for _ in range(SEQ_RETRIES):
        try:
            seq = await pool.fetchval(INSERT, conversation, payload.decode(), key)
            break
        except asyncpg.UniqueViolationError:
            continue  # another append took this seq first: the next one
    else:
        return _problem(503, "too many lost races for a seq")
    return Response(b'{"seq":%d,"message":%s}' % (seq, payload), 201, media_type=JSON)


async def context(request: Request) -> Response:
    if not _authorized(request):
        return _problem(401, "a valid bearer token is needed")
    pool: asyncpg.Pool = request.app.state.pool
    rows = await pool.fetch(TAIL, request.path_params["conversation_id"], CONTEXT_ROWS)
    body = "[" + ",".join(row[0] for row in rows) + "]"
    return Response(body.encode(), media_type=JSON)


async def head(request: Request) -> Response:
    if not _authorized(request):
        return _problem(401, "a valid bearer token is needed")
    pool: asyncpg.Pool = request.app.state.pool
    conversation = request.path_params["conversation_id"]
    last = await pool.fetchval(LAST_SEQ, conversation)
    return Response(
        b'{"conversation_id":"%s","last_seq":%d}' % (str(conversation).encode(), last),
        media_type=JSON,
    )


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    pool = await asyncpg.create_pool(
        os.environ[DATABASE_URL_ENV],
        min_size=1,
        max_size=POOL_MAX_SIZE,
        server_settings={"application_name": APPLICATION_NAME},
    )
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


app = Starlette(
    routes=[
        Route("/healthz", healthz, methods=["GET"]),
        Route("/v1/conversations/{conversation_id:uuid}/messages", append, methods=["POST"]),
        Route("/v1/conversations/{conversation_id:uuid}/context", context, methods=["GET"]),
        Route("/v1/conversations/{conversation_id:uuid}", head, methods=["GET"]),
    ],
    lifespan=lifespan,
)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m bench.minimal_server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    args = p.parse_args(argv)
    if DATABASE_URL_ENV not in os.environ:
        p.error(f"set {DATABASE_URL_ENV} to a postgresql:// URL")
    # uvicorn raises the signal again once it has shut down: exit 0 after a SIGTERM
    signal.signal(signal.SIGTERM, lambda *_: None)
    # As `episodic serve`: uvicorn's "auto" loop and parser, no uvicorn access log.
    uvicorn.run(
        "bench.minimal_server:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="auto",
        http="auto",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
