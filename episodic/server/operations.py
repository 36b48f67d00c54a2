"""The operator's routes (every tenant's compaction status, compacting one conversation
now, erasing one) and the probes a deployment checks (``/healthz``, ``/readyz``)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations, some of
# them local to the function that makes the routes.
import logging
from dataclasses import dataclass
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from episodic import CompactionStatus, Erasure, errors
from episodic.server.auth import JsonBody, KeyOf, require_operator
from episodic.server.keys import ApiKey
from episodic.server.problems import Problem
from episodic.server.schemas import CompactionRun, ErasureRequest, Health
from episodic.settings import EpisodicSettings
from episodic.store import EpisodicStore
from episodic.summarizers import Summarizer
from episodic.worker import CompactionOptions, compact_claimed
from episodic.worker.setup import options_from_settings, summarizer_from_settings

logger = logging.getLogger("episodic.server")
#: the largest ``limit`` or ``recent`` the compaction status takes
MAX_STATUS_PAGE = 1_000
#: who the attempts of "compact now" are recorded as
OWNER = "api:compact-now"
#: /healthz's answer, encoded once: a probe does no work
HEALTHY = Health(status="ok").model_dump_json().encode()
_HEALTHY_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(HEALTHY))],
}


@dataclass(frozen=True, slots=True)
class ManualCompaction:
    """What "compact now" compacts with: the worker's summarizer and options."""

    summarizer: Summarizer
    options: CompactionOptions
    lease_seconds: float

    @classmethod
    def from_settings(cls, settings: EpisodicSettings) -> "ManualCompaction | None":
        """The worker's summarizer and options from ``settings``; None (and a warning) when
        the summarizer settings make none, so the API serves without "compact now"."""
        try:
            summarizer = summarizer_from_settings(settings)
        except errors.ConfigurationError as exc:
            logger.warning("compact now is off: %s", exc)
            return None
        options = options_from_settings(settings)
        return cls(summarizer, options, settings.lease_seconds or options.default_lease_seconds())


def operator_routes(
    root: EpisodicStore, key_of: KeyOf, compaction: ManualCompaction | None
) -> APIRouter:
    Key = Annotated[ApiKey, Depends(key_of)]
    router = APIRouter(prefix="/v1", tags=["operations"])

    @router.get("/compaction", response_model=CompactionStatus)
    async def compaction_status(
        key: Key,
        recent: Annotated[int, Query(ge=0, le=MAX_STATUS_PAGE)] = 10,
        limit: Annotated[int, Query(ge=1, le=MAX_STATUS_PAGE)] = 50,
    ) -> CompactionStatus:
        """Every tenant's compaction queue: due, leased, failing and dead conversations and
        the latest attempts (operator keys only)."""
        require_operator(key, "compaction status")
        return await root.compaction_status(recent=recent, limit=limit)

    @router.post(
        "/conversations/{conversation_id}/compact",
        response_model=CompactionRun,
        responses={
            409: {"model": Problem, "description": "a worker holds the conversation's lease"},
            501: {"model": Problem, "description": "this server has no summarizer"},
        },
    )
    async def compact_now(key: Key, conversation_id: UUID) -> CompactionRun:
        """Compact the conversation now, due or not, as the worker would (operator keys, in
        their tenant): the attempt is recorded with reason manual_recovery. 409 while a
        worker holds its lease."""
        require_operator(key, "compacting now")
        if compaction is None:
            raise errors.CompactionUnavailableError(
                "this server has no summarizer (see its log: EPISODIC_SUMMARIZER* settings); "
                "the worker still compacts due conversations"
            )
        store = root.for_tenant(key.tenant_id)
        claim = await store.claim_conversation(
            conversation_id, OWNER, lease_seconds=compaction.lease_seconds
        )
        if claim is None:
            raise errors.ConflictError(
                "a worker is compacting this conversation right now; try again later",
                conversation_id=conversation_id,
            )
        result = await compact_claimed(
            store, compaction.summarizer, claim, worker=OWNER, options=compaction.options
        )
        return CompactionRun(
            outcome=result.outcome,
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            error=result.error,
            seconds=result.seconds,
        )

    @router.post(
        "/conversations/{conversation_id}/erase", response_model=Erasure, dependencies=[JsonBody]
    )
    async def erase_conversation(key: Key, conversation_id: UUID, body: ErasureRequest) -> Erasure:
        """Remove the conversation and leave a tombstone (operator keys, in their tenant;
        the server's database role must be a member of episodic_eraser)."""
        require_operator(key, "erasing a conversation")
        return await root.for_tenant(key.tenant_id).erase_conversation(
            conversation_id, reason=body.reason
        )

    return router


class LivenessProbe:
    """Answers ``GET /healthz`` before the router: a liveness probe asks whether the process
    answers, so it costs no more than answering (the route stays, for the OpenAPI document
    and its schema). A probe every few seconds is neither logged nor counted."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/healthz" and scope["method"] == "GET":
            await send(dict(_HEALTHY_START))  # a copy: a layer may edit what it is sent
            await send({"type": "http.response.body", "body": HEALTHY})
            return
        await self.app(scope, receive, send)


def health_routes(store: EpisodicStore) -> APIRouter:
    router = APIRouter(tags=["operations"])

    @router.get("/healthz", response_model=Health)
    async def healthz() -> Response:
        """The process is up."""
        return Response(HEALTHY, media_type="application/json")

    @router.get("/readyz", response_model=Health)
    async def readyz() -> Health:
        """The database is reachable and migrated (else 503)."""
        await store.list_conversations(limit=1)
        return Health(status="ok")

    return router
