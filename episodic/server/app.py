"""The ASGI app: episodic's API over HTTP, on one :class:`EpisodicStore`.

Routes mirror the library (create, get, list, append, events, load_context, run completed).
Writes keep the library's guarantees and speak HTTP's own idioms: ``Idempotency-Key`` is the
append's idempotency key (the same key and body replay the first result; another body is a
422), ``If-Match`` carries the head's ETag (the last seq) as the expected seq (stale: 412),
and every error is ``application/problem+json`` naming its ``episodic.errors`` class. An
append takes its messages in any format a context is served in (:mod:`.inbound`).
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations, some of
# them local to the function that makes the routes.
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from episodic import errors
from episodic.integrations.sessions import session_view
from episodic.search import MAX_QUERY_LENGTH, MAX_SEARCH_LIMIT, QUERY_PATTERN
from episodic.server.access_log import REQUEST_ID, ObservedRequests, request_id_of
from episodic.server.admission import Admission
from episodic.server.auth import JsonBody, KeyOf, key_dependency
from episodic.server.claude_sessions import claude_session_routes
from episodic.server.encoding import context_answer, json_answer
from episodic.server.inbound import AppendFormat, document_requests, read_append
from episodic.server.inspector import inspector_routes
from episodic.server.keys import ApiKey, KeyStore
from episodic.server.limits import MAX_PAGE, BodyLimit
from episodic.server.links import add_links
from episodic.server.metrics import instrument
from episodic.server.operations import (
    LivenessProbe,
    ManualCompaction,
    health_routes,
    operator_routes,
)
from episodic.server.problems import (
    PROBLEM_MEDIA_TYPE,
    Problem,
    error_problem,
    problem,
    unexpected_problem,
)
from episodic.server.schemas import (
    Appended,
    Cleared,
    ContextFormat,
    ConversationHead,
    ConversationPage,
    EventPage,
    LoadedContext,
    NewConversation,
    Retracted,
    SearchResults,
    SessionView,
    Unpin,
)
from episodic.store import EpisodicStore

logger = logging.getLogger("episodic.server.errors")
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
NDJSON = "application/x-ndjson"
#: the status a request gets when its client hung up before sending all of it (nginx's)
CLIENT_CLOSED_REQUEST = 499
#: the tenants whose scoped stores are kept (the least recently served beyond them are remade)
TENANT_STORES = 1_024
Page = Annotated[int, Query(ge=1, le=MAX_PAGE, description="at most this many")]


def header(description: str) -> dict[str, Any]:
    """A response header as OpenAPI documents one: a string, and what it says."""
    return {"description": description, "schema": {"type": "string"}}


ETAG = {"ETag": header('the last seq, quoted ("12"): send it back in If-Match')}
#: headers some error responses carry, by status
ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": header('Bearer realm="episodic"')},
    503: {"Retry-After": header("seconds to wait before retrying")},
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": description, "headers": ERROR_HEADERS.get(code, {})}
    for code, description in (
        (401, "no API key, or an unknown or revoked one"),
        (403, "the operation needs an operator key"),
        (404, "no such conversation (or another tenant's)"),
        (409, "the write conflicts with the conversation's state"),
        (413, "the body or a message is too large"),
        (415, "the body is not JSON (send Content-Type: application/json)"),
        (422, "the request is invalid"),
        (503, "the database is unreachable or not migrated; see Retry-After"),
    )
}


def etag(last_seq: int) -> str:
    """A head's ETag: its last seq (what ``If-Match`` sends back as the expected seq)."""
    return f'"{last_seq}"'


def expected_seq(if_match: str | None) -> int | None:
    """The expected seq an ``If-Match`` names (a head's ETag, weak or not); None without one."""
    if if_match is None:
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses
    if not (value.isascii() and value.isdigit()):
        raise errors.ValidationError(
            f'If-Match must be a head\'s ETag such as "12", not {if_match!r}', field="If-Match"
        )
    return int(value)


def with_etag(description: str, **more: dict[str, Any]) -> dict[str, Any]:
    """A success response documented with its ETag (and ``more`` headers)."""
    return {"description": description, "headers": {**ETAG, **more}}


NOT_MODIFIED = {"description": "If-None-Match named the current ETag", "headers": ETAG}


def not_modified(request: Request, tag: str) -> Response | None:
    """304 when the client's ``If-None-Match`` already names ``tag``."""
    wanted = request.headers.get("if-none-match")
    if wanted is None:
        return None
    tags = {t.strip().removeprefix("W/") for t in wanted.split(",")}
    return Response(status_code=304, headers={"ETag": tag}) if tag in tags or "*" in tags else None


class EpisodicApp(FastAPI):
    """FastAPI, with its error responses documented as application/problem+json."""

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, with problem+json errors, no null parameters, the request
        bodies FastAPI does not write (the append's, in every format) and the links."""
        schema = super().openapi()
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                for code, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if code[0] in "45" and "application/json" in content:
                        content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
        _without_null_parameters(schema)
        document_requests(schema)
        add_links(schema)
        return schema


def _without_null_parameters(schema: dict[str, Any]) -> None:
    """An optional header or query parameter left out is None, but null has no spelling on
    the wire (a client would send the text "null"): document only the value's own type."""
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                declared = parameter.get("schema", {})
                options = declared.get("anyOf", [])
                kept = [option for option in options if option != {"type": "null"}]
                if parameter.get("in") != "path" and len(kept) == 1 < len(options):
                    rest = {key: value for key, value in declared.items() if key != "anyOf"}
                    parameter["schema"] = {**kept[0], **rest}


def create_app(
    store: EpisodicStore,
    keys: KeyStore,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    compaction: ManualCompaction | None = None,
    cors_origins: Sequence[str] = (),
    max_inflight: int | None = None,
    queue_timeout: float = 0.1,
    close_on_shutdown: bool = False,
) -> FastAPI:
    """The app serving ``store`` to the holders of ``keys``: each request is scoped to its
    key's tenant (``store.for_tenant``), so PostgreSQL's row-level security applies to it.
    ``compaction``: what "compact now" compacts with (None: that route answers 501);
    ``cors_origins``: browser origins allowed to call the API (none: CORS off);
    ``max_inflight``: /v1 requests in the app at once, more waiting up to ``queue_timeout``
    seconds for a slot, else refused with 503 (None: no limit; see :mod:`.admission`);
    ``close_on_shutdown``: close the store and the keys when the app shuts down."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close_on_shutdown:
                await store.close()
                await keys.close()

    app = EpisodicApp(
        title="episodic",
        summary="A durable, append-only history for AI-agent conversations.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        separate_input_output_schemas=False,
        generate_unique_id_function=lambda route: route.name,
    )
    meters = instrument(app)
    # added innermost first: the access log sees every answer (a refusal too), and CORS
    # headers go on a refusal as on any answer
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if max_inflight is not None:
        app.add_middleware(
            Admission,
            limit=max_inflight,
            queue_timeout=queue_timeout,
            on_refused=meters.refused,
        )
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "If-Match",
                           "If-None-Match", REQUEST_ID],
            expose_headers=["ETag", "Location", "Retry-After", REQUEST_ID],
        )  # fmt: skip
    app.add_middleware(ObservedRequests, observe=meters.observe)
    app.add_middleware(LivenessProbe)
    _handle_errors(app)
    key_of = key_dependency(keys)
    app.include_router(_routes(store, key_of))
    app.include_router(operator_routes(store, key_of, compaction))
    app.include_router(claude_session_routes(store, key_of))
    app.include_router(health_routes(store))
    app.include_router(inspector_routes(store, keys))
    return app


def _handle_errors(app: FastAPI) -> None:
    async def episodic_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.EpisodicError)
        # only a seq other than If-Match's is a failed precondition; other conflicts are 409
        stale = isinstance(exc, errors.ConflictError) and exc.expected_seq is not None
        return error_problem(
            exc,
            instance=request.url.path,
            status=412 if stale else None,
            request_id=request_id_of(request),
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc.__cause__, ClientDisconnect):
            return await client_gone(request, exc.__cause__)
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI could not read the body (not UTF-8, say): as invalid as malformed JSON
            return error_problem(
                errors.ValidationError(f"the body is not JSON: {exc.__cause__}", field="body"),
                instance=request.url.path,
            )
        return problem(
            exc.status_code,
            exc.detail if isinstance(exc.detail, str) else None,
            instance=request.url.path,
            headers=dict(exc.headers or {}),
        )

    async def invalid_request(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        found = [
            {
                "pointer": "/" + "/".join(str(part) for part in error["loc"]),
                "detail": error["msg"],
            }
            for error in exc.errors()
        ]
        return problem(
            422,
            "; ".join(f"{e['pointer']}: {e['detail']}" for e in found) or "invalid request",
            kind="ValidationError",
            instance=request.url.path,
            errors=found,
        )

    async def unexpected(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this response, so the traceback reaches the log too; this
        # line ties it to the request id the answer carries (the access log's line does not
        # run: this handler is outside its middleware)
        request_id = request_id_of(request) or uuid.uuid4().hex
        logger.error("request %s failed: %s: %s", request_id, type(exc).__name__, exc)
        return unexpected_problem(instance=request.url.path, request_id=request_id)

    async def client_gone(request: Request, exc: Exception) -> Response:
        # The client hung up before its body arrived (a timeout, a load generator stopping):
        # nothing was read, so nothing was written, and no one reads this answer. Not a
        # server error: 499, nginx's "client closed request", in the access log and the
        # metrics, and no traceback.
        logger.info("request %s: the client disconnected", request_id_of(request))
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    app.add_exception_handler(Exception, unexpected)
    app.add_exception_handler(ClientDisconnect, client_gone)
    app.add_exception_handler(errors.EpisodicError, episodic_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_request)


def _routes(root: EpisodicStore, key_of: KeyOf) -> APIRouter:
    # A tenant's store is a facade on the root's pool: made once per tenant, not per request
    # (making one prices a synthetic message, a tenth of a /v1 request's framework time).
    @functools.lru_cache(maxsize=TENANT_STORES)
    def scoped(tenant_id: str) -> EpisodicStore:
        return root.for_tenant(tenant_id)

    async def tenant_store(key: Annotated[ApiKey, Depends(key_of)]) -> EpisodicStore:
        return scoped(key.tenant_id)

    Store = Annotated[EpisodicStore, Depends(tenant_store)]
    router = APIRouter(prefix="/v1", tags=["conversations"])

    @router.post(
        "/conversations",
        status_code=201,
        response_model=ConversationHead,
        dependencies=[JsonBody],
        responses={
            201: with_etag("created", Location=header("the conversation's URL")),
            409: {"model": Problem, "description": "the conversation id is taken"},
        },
    )
    async def create_conversation(
        store: Store, body: NewConversation, response: Response
    ) -> ConversationHead:
        """Start a conversation."""
        cid = await store.create_conversation(
            conversation_id=body.conversation_id, metadata=body.metadata_document()
        )
        response.headers["Location"] = f"/v1/conversations/{cid}"
        return await _head(store, cid, response)

    @router.get("/conversations", response_model=ConversationPage)
    async def list_conversations(
        store: Store, limit: Page = 100, before: Annotated[UUID | None, Query()] = None
    ) -> ConversationPage:
        """Conversations, newest first, a page at a time."""
        items = await store.list_conversations(limit=limit, before=before)
        cursor = items[-1].conversation_id if len(items) == limit else None
        return ConversationPage(items=items, next_before=cursor)

    @router.get(
        "/conversations/{conversation_id}",
        response_model=ConversationHead,
        responses={200: with_etag("the head")},
    )
    async def get_conversation(
        store: Store, conversation_id: UUID, response: Response
    ) -> ConversationHead:
        """The head (counters, compaction state) and the compaction pressure. Its ETag is
        the last seq, for If-Match; no 304 here, as the compaction state and the pressure
        change without a new seq."""
        return await _head(store, conversation_id, response)

    @router.post(
        "/conversations/{conversation_id}/messages",
        status_code=201,
        response_model=Appended,
        dependencies=[JsonBody],
        responses={
            201: with_etag("appended (or, for a repeated Idempotency-Key, replayed)"),
            412: {"model": Problem, "description": "If-Match is not the head's ETag"},
        },
    )
    async def append(
        store: Store,
        conversation_id: UUID,
        request: Request,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                min_length=1,
                max_length=200,
                description="the same key and body: the first response, nothing appended",
            ),
        ] = None,
        if_match: Annotated[
            str | None,
            Header(
                alias="If-Match",
                # a seq: at most 18 digits after any zeros, below 2**63 (a log never gets
                # that long); the spaces and tabs HTTP allows around a value
                pattern=r'^[ \t]*(W/)?"?0*[0-9]{1,18}"?[ \t]*$',
                description="the head's ETag: refuse a stale append",
            ),
        ] = None,
        format: Annotated[AppendFormat | None, Query(include_in_schema=False)] = None,
    ) -> Response:
        """Append a batch of messages atomically, in the format the body's `format` names
        (`episodic`, the default, `openai`, `responses` or `anthropic`: what
        `GET .../context?format=` gives in each). `?format=` may name the format instead
        (it is not in this schema, which cannot tie it to the body's). The same
        `Idempotency-Key` replays the first result for the same messages in any format."""
        body = read_append(await request.body(), format, conversation_id)
        events = await store.append(
            conversation_id,
            body.messages,
            idempotency_key=idempotency_key,
            expected_seq=expected_seq(if_match),
            usage=body.usage,
        )
        last = events[-1].seq
        appended = Appended.model_construct(events=list(events), last_seq=last)
        return json_answer(appended, status_code=201, headers={"ETag": etag(last)})

    @router.post(
        "/conversations/{conversation_id}/unpin",
        status_code=201,
        response_model=Appended,
        dependencies=[JsonBody],
        responses={201: with_etag("recorded")},
    )
    async def unpin(
        store: Store, conversation_id: UUID, body: Unpin, response: Response
    ) -> Appended:
        """Stop carrying a pinned user message as a standing instruction: handoffs written
        from now on leave it out. The message stays in the log; the unpin is an event."""
        event = await store.unpin(conversation_id, body.seq)
        response.headers["ETag"] = etag(event.seq)
        return Appended(events=[event], last_seq=event.seq)

    @router.get("/conversations/{conversation_id}/events", response_model=EventPage)
    async def read_events(
        store: Store,
        conversation_id: UUID,
        after_seq: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
        limit: Page = 100,
    ) -> EventPage:
        """The log itself, oldest first, a page at a time (audits and exports)."""
        events = await store.read_events(conversation_id, after_seq=after_seq, limit=limit)
        cursor = events[-1].seq if len(events) == limit else None
        return EventPage(events=list(events), next_after_seq=cursor)

    @router.get("/conversations/{conversation_id}/search", response_model=SearchResults)
    async def search(
        store: Store,
        conversation_id: UUID,
        q: Annotated[
            str,
            Query(
                min_length=1,
                max_length=MAX_QUERY_LENGTH,
                pattern=QUERY_PATTERN,
                description="a few words: an error code, a file name, what was decided",
            ),
        ],
        limit: Annotated[int, Query(ge=1, le=MAX_SEARCH_LIMIT)] = 10,
    ) -> SearchResults:
        """The conversation's messages (tool outputs included) holding the words of ``q``:
        recall of what a compaction summarized away, since the log keeps it all."""
        found = await store.search(conversation_id, q, limit=limit)
        return SearchResults(conversation_id=conversation_id, query=q, events=found)

    @router.get(
        "/conversations/{conversation_id}/context",
        response_model=LoadedContext,
        responses={200: with_etag("the context"), 304: NOT_MODIFIED},
    )
    async def load_context(
        store: Store,
        conversation_id: UUID,
        request: Request,
        format: ContextFormat = "episodic",
    ) -> Response:
        """What the next model call should see; 304 when ``If-None-Match`` names its ETag
        (the conversation's last seq: nothing appended or compacted since)."""
        # episodic's format is the log's own JSON: no model is made of a stored message
        context = await (
            store.load_stored_context(conversation_id)
            if format == "episodic"
            else store.load_context(conversation_id)
        )
        tag = etag(context.last_seq)
        if (unchanged := not_modified(request, tag)) is not None:
            return unchanged
        return context_answer(context, format, headers={"ETag": tag})

    @router.post(
        "/conversations/{conversation_id}/run-completed",
        status_code=201,
        response_model=Appended,
        responses={201: with_etag("recorded")},
    )
    async def mark_run_completed(
        store: Store, conversation_id: UUID, response: Response
    ) -> Appended:
        """Record that an agent run ended cleanly (its open tool calls are abandoned)."""
        event = await store.mark_run_completed(conversation_id)
        response.headers["ETag"] = etag(event.seq)
        return Appended(events=[event], last_seq=event.seq)

    @router.post("/conversations/{conversation_id}/retract-last", response_model=Retracted)
    async def retract_last(store: Store, conversation_id: UUID) -> Retracted:
        """Take back the newest message in view (a framework session's pop): a retraction
        is appended and the message leaves the context; the log keeps it. Null when none
        is in view. Not idempotent: each call takes back one more."""
        return Retracted(retracted=await store.retract_last(conversation_id))

    @router.post("/conversations/{conversation_id}/clear", response_model=Cleared)
    async def clear(store: Store, conversation_id: UUID) -> Cleared:
        """Empty the view (a framework session's clear): the context then holds only what
        is appended after it, no handoff either. The log keeps every event."""
        return Cleared(cleared=await store.clear(conversation_id))

    @router.get(
        "/conversations/{conversation_id}/view",
        response_model=SessionView,
        responses={200: with_etag("the view")},
    )
    async def view(store: Store, conversation_id: UUID, response: Response) -> SessionView:
        """What a framework's session holds (the TypeScript sessions read it): the latest
        boundary's messages, then the messages in view as they were appended, for a session
        to give back its items as it stored them."""
        seen = await session_view(store, conversation_id)
        if seen is None:
            raise errors.NotFoundError(conversation_id)
        response.headers["ETag"] = etag(seen.last_seq)
        return SessionView(
            conversation_id=conversation_id,
            messages=seen.messages,
            covers_through_seq=seen.covers_through_seq,
            boundary_seq=seen.boundary_seq,
            last_seq=seen.last_seq,
        )

    @router.get(
        "/conversations/{conversation_id}/export",
        response_class=StreamingResponse,
        responses={200: {"content": {NDJSON: {}}, "description": "the log as JSON lines"}},
    )
    async def export_conversation(store: Store, conversation_id: UUID) -> StreamingResponse:
        """The whole log as JSON lines (episodic's export format, `episodic import` reads
        it), streamed: a header line, every event, then the compaction attempts."""
        lines = store.export_conversation(conversation_id)
        first = await anext(lines)  # an unknown conversation is a 404, before any byte

        async def body() -> AsyncIterator[str]:
            yield first
            async for line in lines:
                yield line

        return StreamingResponse(body(), media_type=NDJSON)

    return router


async def _head(
    store: EpisodicStore, conversation_id: UUID, response: Response
) -> ConversationHead:
    """The head and its pressure, its last seq the answer's ETag."""
    conversation = await store.get_conversation(conversation_id)
    response.headers["ETag"] = etag(conversation.last_seq)
    # one read: the pressure of the head just read, not of a second read of it
    return ConversationHead(conversation=conversation, pressure=store.pressure_of(conversation))
