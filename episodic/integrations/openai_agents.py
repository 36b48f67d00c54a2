"""A session for the OpenAI Agents SDK (``openai-agents``, 0.24): ``Runner.run(agent, input,
session=EpisodicSession(session_id, store))``.

Each item the SDK adds is one message of the log, its Responses item kept whole in
``native`` (:meth:`Message.from_responses_item`), so ``get_items`` gives back exactly what
was added; a ``function_call_output`` must answer a waiting ``function_call`` by ``call_id``,
as any tool result. ``get_items`` returns the compacted view: after a worker's boundary, the
handoff (a user message item), the retained user messages, then the items after its cut, as
they came; after the SDK's own compaction (below), the items it kept and its output.
``pop_item`` is a retraction and ``clear_session`` a clear (``EpisodicStore.retract_last`` and
``clear``): the log keeps everything, the view changes. ``get_full_history`` pages the
whole log. ``run_compaction``, which the Runner awaits after each saved turn, records the
turn's usage for the pressure signal and leaves the summary to the worker. Wrapped in the
SDK's ``OpenAIResponsesCompactionSession``, the session gives it the suffix-snapshot hook its
own stores have, and the SDK's compaction is appended as a boundary, never a deletion (the
wrapper's ``run_compaction`` then runs instead of this one, so no usage is recorded: run one
compactor per session, the worker or the SDK's).

Any string is a session id: it names one conversation per tenant (a UUID derived from the
tenant and the id), created by the first write; reading a session never written returns
``[]``. A tenant-scoped store (``store.for_tenant``) scopes the session.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from agents import FunctionTool, function_tool
from agents.items import TResponseInputItem
from agents.memory.session import (
    OpenAIResponsesCompactionArgs,
    SessionABC,
    _CompactionSnapshot,
)
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from agents.run_context import RunContextWrapper

from episodic import BoundaryRequest
from episodic.errors import (
    ConflictError,
    NotFoundError,
    UnsafeCutError,
    ValidationError,
)
from episodic.integrations.search import DEFAULT_TOOL_HITS, ConversationSearch
from episodic.integrations.sessions import (
    create_session_conversation,
    named_conversation_id,
    session_view,
)
from episodic.models import Message, MessageEvent, Usage
from episodic.store import DEFAULT_TENANT, EpisodicStore

logger = logging.getLogger(__name__)

#: The reason of the boundaries ``OpenAIResponsesCompactionSession`` writes through the hook.
SDK_COMPACTION_REASON = "openai_responses_compaction"

#: The namespace of the conversation ids sessions map to (uuid5 of tenant and session id).
SESSION_NAMESPACE = uuid.UUID("6f3a1c52-9a43-4f0e-8d7e-5b3f4f0a2e61")


def session_conversation_id(session_id: str, tenant_id: str = DEFAULT_TENANT) -> UUID:
    """The conversation a session id names for a tenant: the same id, the same conversation,
    in every process."""
    return named_conversation_id(SESSION_NAMESPACE, session_id, tenant_id)


def session_settings_of(value: SessionSettings | dict[str, Any] | None) -> SessionSettings:
    """The settings as the SDK's own sessions take them: a dict is coerced (an unknown key is
    a ``TypeError`` naming it), nothing means the defaults."""
    return coerce_session_settings(value) if value is not None else SessionSettings()


class EpisodicSession(SessionABC):
    """The SDK's ``Session`` on an episodic conversation (see the module's docstring)."""

    def __init__(
        self,
        session_id: str,
        store: EpisodicStore,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a string, not {type(session_id).__name__}")
        self.session_id = session_id
        self.session_settings = session_settings_of(session_settings)
        self.store = store
        self.conversation_id = session_conversation_id(
            session_id, store.tenant_id or DEFAULT_TENANT
        )

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The compacted view (all of it, or its latest ``limit`` items), oldest first. A
        window holds no call's output whose call it leaves out (so it may hold fewer than
        ``limit`` items)."""
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and wanted <= 0:
            return []
        view = await self._read_view()
        items = view.items if view is not None else []
        if wanted is not None and len(items) > wanted:
            items = _without_orphan_outputs(items[-wanted:])
        return _as_items(items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items, in order, in one append (the conversation is created by the
        first)."""
        if not items:
            return
        messages = [Message.from_responses_item(dict(item)) for item in items]
        try:
            await self.store.append(self.conversation_id, messages)
        except NotFoundError:
            await self._create()
            await self.store.append(self.conversation_id, messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Take back the newest item in view and return it (None when there is none): a
        retraction, so the log keeps it. Concurrent pops return each item once. What a
        boundary's handoff holds is not an item of the log and is never taken back."""
        try:
            retracted = await self.store.retract_last(self.conversation_id)
        except NotFoundError:
            return None
        if retracted is None:
            return None
        return _as_items(retracted.message.to_responses())[0]

    def search_tool(self, *, limit: int = DEFAULT_TOOL_HITS) -> FunctionTool:
        """A function tool that searches this session's whole log (tool outputs included)
        for a few words: give it to the agent that runs with this session, and it can
        recall an exact detail a compaction summarized away."""
        search = ConversationSearch(self.store, self.conversation_id, limit=limit)

        async def search_conversation(query: str) -> str:
            return await search(query)

        return function_tool(
            search_conversation,
            name_override=search.name,
            description_override=search.description,
            use_docstring_info=False,
        )

    async def clear_session(self) -> None:
        """Empty the view: a clear, so the log keeps everything."""
        try:
            await self.store.clear(self.conversation_id)
        except NotFoundError:
            return

    async def run_compaction(
        self,
        args: OpenAIResponsesCompactionArgs | None = None,
        *,
        wrapper: RunContextWrapper[Any] | None = None,
    ) -> None:
        """The Runner awaits this after each saved turn. Compaction is the worker's, off the
        request path: here the turn's provider-reported usage (its last model call's input
        tokens) is recorded, so the context-pressure rule sees it, and when the trigger fires
        the conversation is marked due and the worker woken. Nothing is summarized here."""
        entries = wrapper.usage.request_usage_entries if wrapper is not None else []
        if not entries:
            return
        last = entries[-1]
        usage = Usage(
            input_tokens=last.input_tokens,
            output_tokens=last.output_tokens,
            cache_read_tokens=last.input_tokens_details.cached_tokens or 0,
            reasoning_tokens=last.output_tokens_details.reasoning_tokens or 0,
        )
        with suppress(NotFoundError):  # nothing saved yet: nothing to measure
            await self.store.report_usage(self.conversation_id, usage)

    async def get_full_history(
        self, *, page_size: int = 1_000
    ) -> AsyncIterator[TResponseInputItem]:
        """Every item ever added, retracted and cleared ones included, oldest first, read a
        page at a time (boundaries, retractions and clears are not items and are skipped)."""
        after = 0
        while True:
            try:
                events = await self.store.read_events(
                    self.conversation_id, after_seq=after, limit=page_size
                )
            except NotFoundError:
                return
            for event in events:
                if isinstance(event, MessageEvent):
                    for item in _as_items(event.message.to_responses()):
                        yield item
            if len(events) < page_size:
                return
            after = events[-1].seq

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The SDK's hook for ``OpenAIResponsesCompactionSession``: the latest ``limit``
        items of the view, and a ``replace_suffix(start, output)`` that, instead of deleting
        the items from ``start`` on, appends a boundary through the newest of them whose
        handoff is the items before ``start`` (less the leading ones ``prune_prefix``
        expires) followed by ``output``, as given. So the view becomes what the SDK's own
        stores make it, and the log keeps everything. The boundary is written only if the
        log has not moved since this read (False otherwise: the SDK then keeps the history
        as it is), nor when it would cover a call still waiting for its output."""
        view = await self._read_view()
        if view is None or view.covers_through_seq < 1:
            return None
        window = view.items[-limit:] if limit > 0 else []
        offset = len(view.items) - len(window)

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            if not 0 <= start < len(window):
                return False
            kept = view.items[: offset + start]
            while kept and prune_prefix is not None and prune_prefix(cast(Any, kept[0])):
                kept = kept[1:]
            return await self._write_compaction(view, [*kept, *(dict(i) for i in output)])

        return _CompactionSnapshot(cast(Any, window), offset == 0, replace_suffix)

    async def _write_compaction(self, view: _View, handoff: list[dict[str, Any]]) -> bool:
        """The boundary ``replace_suffix`` appends: through the newest message of ``view``,
        starting the view with ``handoff``; False when the log moved since ``view`` was
        read, or the cut would leave a call waiting."""
        try:
            request = BoundaryRequest(
                summary="",
                handoff_items=handoff,
                covers_through_seq=view.covers_through_seq,
                reason=SDK_COMPACTION_REASON,
                expected_boundary_seq=view.boundary_seq,
                expected_last_seq=view.last_seq,
            )
            await self.store.write_boundary(self.conversation_id, request)
        except (ConflictError, UnsafeCutError, NotFoundError, ValidationError) as exc:
            # The turn is saved; a compaction that cannot be recorded keeps the history as
            # it is (and the SDK says so), it never fails the run.
            logger.warning("the SDK's compaction of %s was not recorded: %s", self.session_id, exc)
            return False
        return True

    async def _read_view(self) -> _View | None:
        """The session's view as items, with where the log stood when it was read; None for
        a session never written."""
        view = await session_view(self.store, self.conversation_id)
        if view is None:
            return None
        return _View(
            items=[item for message in view.messages for item in message.to_responses()],
            covers_through_seq=view.covers_through_seq,
            boundary_seq=view.boundary_seq,
            last_seq=view.last_seq,
        )

    async def _create(self) -> None:
        await create_session_conversation(
            self.store, self.conversation_id, metadata={"session_id": self.session_id}
        )


@dataclass(frozen=True, slots=True)
class _View:
    """The session's view as items, and where the log stood when it was read."""

    items: list[dict[str, Any]]
    #: the seq of the newest message in view (the boundary's cut when there is none after it)
    covers_through_seq: int
    boundary_seq: int | None
    last_seq: int


def _as_items(items: list[dict[str, Any]]) -> list[TResponseInputItem]:
    """Stored items as the SDK's type: ``Message.to_responses`` gives back an item the SDK
    added whole, and writes any other message as Responses input items (the shapes
    ``TResponseInputItem`` unites), so the cast states what the formats guarantee; a
    TypedDict union cannot be checked at run time item by item."""
    return cast(list[TResponseInputItem], items)


def _without_orphan_outputs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` less the call outputs whose call is not before them in ``items`` (it fell
    outside the window). Not only at the start: with parallel calls a window can begin
    between two calls and hold both outputs, and the Responses API refuses an output
    without its call anywhere in the input."""
    called: set[object] = set()
    kept: list[dict[str, Any]] = []
    for item in items:
        call_id = item.get("call_id")
        if str(item.get("type", "")).endswith("_call_output"):
            if call_id not in called:
                continue
        elif call_id is not None:
            called.add(call_id)
        kept.append(item)
    return kept


__all__ = [
    "SDK_COMPACTION_REASON",
    "SESSION_NAMESPACE",
    "EpisodicSession",
    "session_conversation_id",
    "session_settings_of",
]
