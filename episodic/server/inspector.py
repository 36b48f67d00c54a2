"""``/ui``: the inspector, a read-only page per tenant and conversation for operators.

Server-rendered (Jinja2, autoescaped, inline CSS, no script): the conversations of a tenant,
and one conversation's head and pressure, what the next request sees (the handoff summary,
the retained user messages, the tail) with its token counts before and after compaction,
the log with its boundaries and retractions marked, and the compaction attempts with their
errors.

Only an operator key may sign in: a browser cannot send ``Authorization: Bearer``, so the
sign-in form keeps the key in an HttpOnly, SameSite=Strict cookie scoped to ``/ui`` (Secure
over https), verified again on every page (a revoked key is out at once). Scripts may send
the header instead. An operator may view any tenant (``?tenant=``; by default the key's), and
every read goes through ``store.for_tenant``, so PostgreSQL's row-level security decides what
is there: another tenant's conversation is a 404 page.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations.
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode, urlsplit
from uuid import UUID

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined

from episodic import errors
from episodic.context import MISSING_RESULT_TEXT, Context
from episodic.display import terminal_safe
from episodic.formats.claude_code import claude_compaction, describe_compaction
from episodic.models import (
    BoundaryEvent,
    ClearEvent,
    Conversation,
    Message,
    MessageEvent,
    RetractionEvent,
    StoredEvent,
)
from episodic.policy import EpisodicCompactionPressure
from episodic.server.access_log import request_id_of
from episodic.server.disclosure import public_detail
from episodic.server.keys import ApiKey, KeyStore
from episodic.server.limits import MAX_PAGE
from episodic.server.problems import status_of
from episodic.store import EpisodicStore

COOKIE = "episodic_ui_key"
COOKIE_PATH = "/ui"
#: how long a browser keeps the sign-in (the key is verified on every page regardless)
COOKIE_SECONDS = 12 * 3600
CONVERSATIONS_PAGE = 50
EVENTS_PAGE = 200
#: the events read to count the whole history in view; a longer log shows no "before" figure
MAX_SCANNED_EVENTS = 100_000
SCAN_PAGE = 1_000
#: characters of a text shown before the rest is folded away
CLIP_LOG = 1_500
CLIP_CONTEXT = 4_000
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}

_templates = Environment(
    loader=PackageLoader("episodic.server", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


class _Refused(Exception):
    """A request the inspector answers with a page of its own (sign-in form, error page)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


# ---- what the pages show ----------------------------------------------------------------

CompactionState = Literal["dead", "compacting", "failing", "due"]


def compaction_state(head: Conversation, now: datetime) -> CompactionState | None:
    """Where the conversation is in the compaction queue (as ``episodic status`` says)."""
    if head.dead_since is not None:
        return "dead"
    if head.lease_expires_at is not None and _aware(head.lease_expires_at) > now:
        return "compacting"
    if head.due_since is not None:
        return "failing" if head.last_error else "due"
    return None


@dataclass(frozen=True, slots=True)
class Scan:
    """What the whole log says beyond one page: which messages were retracted (and by which
    event), where the latest clear is, and the tokens of the history in view, uncompacted."""

    complete: bool
    retracted_by: dict[int, int] = field(default_factory=dict)
    cleared_at: int = 0
    view_tokens: int | None = None
    view_messages: int = 0


async def scan(store: EpisodicStore, conversation_id: UUID, last_seq: int) -> Scan:
    """Read the log through ``last_seq`` (at most :data:`MAX_SCANNED_EVENTS` events)."""
    messages: list[tuple[int, int]] = []
    retracted_by: dict[int, int] = {}
    cleared_at = 0
    after = 0
    while after < last_seq:
        if after >= MAX_SCANNED_EVENTS:
            return Scan(False, retracted_by, cleared_at)
        page = await store.read_events(conversation_id, after_seq=after, limit=SCAN_PAGE)
        for event in page:
            if event.seq > last_seq:
                break
            if isinstance(event, MessageEvent):
                if event.message.role != "system":  # kept in the log, never loaded
                    messages.append((event.seq, event.token_estimate))
            elif isinstance(event, RetractionEvent):
                retracted_by[event.retracted_seq] = event.seq
            elif isinstance(event, ClearEvent):
                cleared_at = event.seq
        if len(page) < SCAN_PAGE:
            break
        after = page[-1].seq
    shown = [tokens for seq, tokens in messages if seq > cleared_at and seq not in retracted_by]
    return Scan(True, retracted_by, cleared_at, sum(shown), len(shown))


ContextPart = Literal["handoff", "retained", "handoff_item", "synthetic", "tail"]


@dataclass(frozen=True, slots=True)
class ContextItem:
    message: Message
    part: ContextPart


def context_items(context: Context) -> list[ContextItem]:
    """The context's messages, each said to be the handoff summary, a retained user message,
    one of a framework's handoff items, a synthetic tool result, or a message of the tail."""
    boundary = context.boundary
    items: list[ContextItem] = []
    for index, message in enumerate(context.messages):
        part: ContextPart = "tail"
        if message.seq is None and message.role == "tool" and message.text == MISSING_RESULT_TEXT:
            part = "synthetic"
        elif boundary is not None and boundary.handoff_items is not None:
            part = "handoff_item" if message.seq is None else "tail"
        elif boundary is not None and index == 0 and message.seq == boundary.seq:
            part = "handoff"
        elif boundary is not None and message.seq is None and index <= len(boundary.retained):
            part = "retained"
        items.append(ContextItem(message, part))
    return items


LogStatus = Literal["in context", "summarized", "retracted", "cleared", "not loaded"]


@dataclass(frozen=True, slots=True)
class LogRow:
    event: StoredEvent
    status: LogStatus | None = None
    retracted_by: int | None = None
    #: a boundary: whether it is the one the context starts from
    current: bool = False
    #: a message recording a framework's own compaction (Claude Code's): what it says
    compaction: str | None = None


def log_rows(events: list[StoredEvent], context: Context | None, found: Scan) -> list[LogRow]:
    in_context = {m.seq for m in context.messages if m.seq is not None} if context else set()
    current = context.boundary.seq if context is not None and context.boundary else None
    rows: list[LogRow] = []
    for event in events:
        status: LogStatus | None = None
        by = found.retracted_by.get(event.seq)
        if isinstance(event, MessageEvent):
            if by is not None:
                status = "retracted"
            elif event.seq <= found.cleared_at:
                status = "cleared"
            elif event.message.role == "system":
                status = "not loaded"
            elif event.seq in in_context:
                status = "in context"
            elif context is not None:
                status = "summarized"
        elif isinstance(event, BoundaryEvent) and event.seq <= found.cleared_at:
            status = "cleared"
        compaction = claude_compaction(event.message) if isinstance(event, MessageEvent) else None
        described = describe_compaction(compaction) if compaction is not None else None
        rows.append(LogRow(event, status, by, event.seq == current, described))
    return rows


# ---- rendering --------------------------------------------------------------------------


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return _aware(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _number(value: int | float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,}"


def _visible(text: str | None) -> str:
    """Stored text with its control and reordering characters shown as escapes."""
    return terminal_safe(text or "", one_line=False)


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


_templates.filters.update(when=_when, number=_number, visible=_visible, json=_json)
_templates.globals.update(
    CLIP_LOG=CLIP_LOG, CLIP_CONTEXT=CLIP_CONTEXT, MAX_SCANNED_EVENTS=MAX_SCANNED_EVENTS
)


def _page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
    html = _templates.get_template(name).render(
        {"key": None, "tenant": None, "tenants": []} | values
    )
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def _sign_in_page(
    request: Request, *, status: int = 401, message: str | None = None, forget: bool = False
) -> HTMLResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    response = _page("sign_in.html", status, message=message, next=safe_next(target), key=None)
    if forget:
        _forget(response, request)
    return response


def _forget(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE,
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of the inspector, else its first page."""
    if (
        not target
        or not target.startswith("/ui")
        or target[3:4] not in ("", "/", "?")
        or "\\" in target
        or "//" in target
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target)
    ):
        return "/ui"
    return target


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or not low <= int(raw) <= high:
        raise errors.ValidationError(
            f"{name} must be a whole number from {low:,} to {high:,}, not {raw[:40]!r}",
            field=name,
        )
    return int(raw)


def _link(path: str, **params: object) -> str:
    query = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return path + (f"?{urlencode(query)}" if query else "")


_templates.globals.update(link=_link)


# ---- the routes -------------------------------------------------------------------------


def _said(error: errors.EpisodicError, status: int, request: Request) -> str:
    """What a page says of ``error``: what the API's problem would (a server error names
    the request's id, under which the server's log has the rest)."""
    request_id = request_id_of(request)
    said = public_detail(error, status, request_id)
    return f"{said} (request {request_id})" if status >= 500 and request_id else said


def inspector_routes(root: EpisodicStore, keys: KeyStore) -> APIRouter:
    """The ``/ui`` pages of ``root``, for the operators among ``keys``."""
    router = APIRouter(prefix="/ui", include_in_schema=False)

    async def operator_of(request: Request) -> ApiKey:
        # a Bearer key for scripts; any other Authorization (a proxy's Basic) leaves the
        # cookie to decide
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        from_cookie = scheme.lower() != "bearer"
        if not from_cookie:
            secret = bearer.strip()
            if not secret:
                raise _Refused(
                    _sign_in_page(request, message="Authorization must be Bearer <key>.")
                )
        else:
            secret = request.cookies.get(COOKIE, "")
            if not secret:
                raise _Refused(_sign_in_page(request))
        try:
            key = await keys.verify(secret)
        except errors.AuthenticationError as exc:
            raise _Refused(
                _sign_in_page(request, message=f"Signed out: {exc}.", forget=from_cookie)
            ) from exc
        request.state.api_key = key
        if not key.operator:
            raise _Refused(
                _sign_in_page(
                    request, status=403, message=_tenant_key_refusal(key), forget=from_cookie
                )
            )
        return key

    async def tenants_to_pick(current: str, key: ApiKey) -> list[str]:
        listed = await keys.list()
        found = {k.tenant_id for k in listed if k.revoked_at is None}
        return sorted(found | {current, key.tenant_id})

    async def tenant_page(name: str, key: ApiKey, tenant: str, **values: Any) -> HTMLResponse:
        """A page of ``tenant``'s, with the tenant picker."""
        picker = await tenants_to_pick(tenant, key)
        return _page(name, key=key, tenant=tenant, tenants=picker, **values)

    async def answer(
        request: Request, work: Callable[[ApiKey, str, EpisodicStore], Awaitable[Response]]
    ) -> Response:
        """Sign-in and tenant first, then ``work``; an error is an HTML page, never JSON."""
        key: ApiKey | None = None
        tenant: str | None = None
        try:
            key = await operator_of(request)
            tenant = request.query_params.get("tenant") or key.tenant_id
            return await work(key, tenant, root.for_tenant(tenant))
        except _Refused as refused:
            return refused.response
        except errors.EpisodicError as exc:
            status = status_of(exc)
            message = _said(exc, status, request)
            if isinstance(exc, errors.NotFoundError) and tenant is not None:
                message = (
                    f"No conversation {exc.conversation_id} is visible in tenant {tenant!r}: "
                    "there is none, or it is another tenant's."
                )
            return await error_page(key, tenant, status, type(exc).__name__, message)

    async def error_page(
        key: ApiKey | None, tenant: str | None, status: int, kind: str, message: str
    ) -> Response:
        picker: list[str] = []
        if key is not None and tenant is not None:
            try:
                picker = await tenants_to_pick(tenant, key)
            except errors.EpisodicError:
                picker = [tenant]
        response = _page(
            "error.html",
            status,
            key=key,
            tenant=tenant,
            tenants=picker,
            title="Not found" if status == 404 else "Something went wrong",
            message=message,
            kind=kind,
            code=status,
        )
        if status == 503:
            response.headers["Retry-After"] = "1"
        return response

    @router.get("", response_class=HTMLResponse)
    async def ui_conversations(request: Request) -> Response:
        async def work(key: ApiKey, tenant: str, store: EpisodicStore) -> Response:
            limit = _int_param(request, "limit", CONVERSATIONS_PAGE, 1, MAX_PAGE)
            before = _uuid_param(request.query_params.get("before"), "before")
            heads = await store.list_conversations(limit=limit, before=before)
            queue = await store.compaction_status(recent=0, limit=0)
            now = datetime.now(UTC)
            rows = [
                {
                    "head": head,
                    "pressure": store.pressure_of(head, now=now),
                    "state": compaction_state(head, now),
                }
                for head in heads
            ]
            return await tenant_page(
                "conversations.html",
                key,
                tenant,
                rows=rows,
                queue=queue,
                limit=limit,
                before=before,
                next_before=heads[-1].conversation_id if len(heads) == limit else None,
            )

        return await answer(request, work)

    @router.get("/conversations/{conversation_id}", response_class=HTMLResponse)
    async def ui_conversation(request: Request, conversation_id: str) -> Response:
        async def work(key: ApiKey, tenant: str, store: EpisodicStore) -> Response:
            try:
                cid = UUID(conversation_id)
            except ValueError:
                message = f"{conversation_id[:80]!r} is not a conversation id (a UUID)."
                return await error_page(key, tenant, 404, "NotFoundError", message)
            after_seq = _int_param(request, "after_seq", 0, 0, 2**62)
            limit = _int_param(request, "limit", EVENTS_PAGE, 1, MAX_PAGE)
            head = await store.get_conversation(cid)
            now = datetime.now(UTC)
            pressure: EpisodicCompactionPressure = store.pressure_of(head, now=now)
            context: Context | None = None
            if head.deleted_at is None:
                context = await store.load_context(cid)
            last_seq = context.last_seq if context is not None else head.last_seq
            found = await scan(store, cid, last_seq)
            events = await store.read_events(cid, after_seq=after_seq, limit=limit)
            attempts = list(reversed(await store.read_attempts(cid)))
            shown_through = events[-1].seq if events else after_seq
            return await tenant_page(
                "conversation.html",
                key,
                tenant,
                head=head,
                pressure=pressure,
                state=compaction_state(head, now),
                context=context,
                items=context_items(context) if context is not None else [],
                scan=found,
                rows=log_rows(events, context, found),
                after_seq=after_seq,
                limit=limit,
                shown_through=shown_through,
                previous_after=max(after_seq - limit, 0) if after_seq > 0 else None,
                next_after=shown_through if shown_through < head.last_seq else None,
                attempts=attempts,
            )

        return await answer(request, work)

    @router.post("/sign-in", response_class=HTMLResponse)
    async def ui_sign_in(request: Request) -> Response:
        if (refused := _cross_site(request)) is not None:
            return refused
        form = _form(await request.body())
        target = safe_next(form.get("next"))
        secret = (form.get("key") or "").strip()
        if not secret:
            return _page("sign_in.html", 401, message="Paste an API key.", next=target, key=None)
        try:
            key = await keys.verify(secret)
        except errors.AuthenticationError as exc:
            return _page("sign_in.html", 401, message=f"{exc}.", next=target, key=None)
        except errors.EpisodicError as exc:
            status = status_of(exc)
            message = _said(exc, status, request)
            return _page("sign_in.html", status, message=message, next=target, key=None)
        if not key.operator:
            return _page(
                "sign_in.html", 403, message=_tenant_key_refusal(key), next=target, key=None
            )
        response = RedirectResponse(target, status_code=303, headers=HEADERS)
        response.set_cookie(
            COOKIE,
            secret,
            max_age=COOKIE_SECONDS,
            path=COOKIE_PATH,
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return response

    @router.post("/sign-out", response_class=HTMLResponse)
    async def ui_sign_out(request: Request) -> Response:
        if (refused := _cross_site(request)) is not None:
            return refused
        response = RedirectResponse("/ui", status_code=303, headers=HEADERS)
        _forget(response, request)
        return response

    return router


def _cross_site(request: Request) -> Response | None:
    """A 403 for a sign-in or sign-out posted from another site (login CSRF: SameSite keeps
    the cookie from being read cross-site, not from being set or cleared)."""
    site = request.headers.get("sec-fetch-site")  # every current browser sends it
    origin = request.headers.get("origin")
    if site is not None:
        foreign = site not in ("same-origin", "none")
    else:  # an older browser: the Origin's host (not its scheme: TLS may end at a proxy)
        foreign = origin is not None and urlsplit(origin).netloc != request.headers.get("host")
    if foreign:
        return _page(
            "sign_in.html",
            403,
            message="Sign in from this page: a form on another site may not sign you in or out.",
            next="/ui",
            key=None,
        )
    return None


def _tenant_key_refusal(key: ApiKey) -> str:
    return (
        f"The key {key.key_id} is tenant {key.tenant_id!r}'s: the inspector needs an operator "
        "key (episodic keys create --tenant T --operator)."
    )


def _uuid_param(raw: str | None, name: str) -> UUID | None:
    if not raw:
        return None
    try:
        return UUID(raw)
    except ValueError:
        raise errors.ValidationError(
            f"{name} must be a conversation id (a UUID), not {raw[:80]!r}", field=name
        ) from None


def _form(body: bytes) -> Mapping[str, str]:
    """An ``application/x-www-form-urlencoded`` body's fields (the first of each name)."""
    try:
        fields = parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=20)
    except ValueError:  # more fields than a sign-in form has
        return {}
    return {name: values[0] for name, values in fields.items() if values}


__all__ = ["compaction_state", "context_items", "inspector_routes", "safe_next", "scan"]
