"""A session service for Google ADK (``google-adk`` 2.13):
``Runner(agent=..., app_name=..., session_service=EpisodicSessionService(store))``.

A session is a conversation, listed under its app and user, whose id is derived from the
tenant, the app, the user and the session id (so the same session id under two users is two
sessions). Each ADK event is stored verbatim, its JSON kept whole in the log
(:mod:`episodic.formats.adk`: bytes as base64, nothing lost), as the messages episodic
compacts and pairs; its state delta is a :class:`~episodic.models.StateChange` appended in
the same statement: session keys to the conversation's own state, ``app:`` and ``user:``
keys to the tenant's shared scopes, ``temp:`` keys never. ``last_update_time`` is the latest
event's timestamp, exactly as ADK stamped it.

``get_session`` reads the tail, not the history: after the compaction worker's boundary, the
session's events are one ADK compaction event carrying the handoff, then every event after
the boundary, so ADK's request builder sends the handoff and the tail and never the
compacted range. An ADK compaction event (ADK's own ``EventsCompactionConfig``) becomes a
boundary through the last event it covers, carrying the compaction events that then stand
for the cut range (every one no other contains, ADK's rule: a sliding window's summaries all
stand), which ``get_session`` gives back in its place. Two statements on PostgreSQL
whatever the history's length. :meth:`EpisodicSessionService.with_full_history` reads every
event instead (what ``Runner.rewind_async`` needs).

A session object is a revision: appending from one that another append has since superseded
raises ADK's ``StaleSessionError`` and writes nothing (a boundary the worker wrote meanwhile
does not make it stale: a run goes on while its history is compacted); appending to a
deleted session raises
``SessionNotFoundError``. Re-delivering an event (same id, same content) stores it once; two
different events that share an id are both stored. A function response must answer a stored
call, except a long-running tool's later responses (its first closed the call), which are
kept as the event's content. ``delete_session`` appends a tombstone: the session is hidden and
its log kept; creating the same id again makes a new session (the id's next generation, a new
conversation), as ADK's own services allow.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from google.adk.apps.compaction import _get_compaction_ranges as compaction_ranges
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions, EventCompaction
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import JsonValue
from pydantic_core import PydanticSerializationError, to_jsonable_python
from typing_extensions import override

from episodic import BoundaryRequest, Erasure, StateSnapshot
from episodic.context import boundary_messages
from episodic.errors import (
    ConflictError,
    EpisodicError,
    NotFoundError,
    OrphanToolResultError,
    TransientDatabaseError,
    ValidationError,
)
from episodic.formats.adk import ADK_EVENT_PROTOCOL, messages_from_adk_event
from episodic.integrations.search import (
    DEFAULT_TOOL_HITS,
    SEARCH_TOOL_DESCRIPTION,
    ConversationSearch,
)
from episodic.models import (
    BoundaryEvent,
    Conversation,
    Message,
    MessageEvent,
    StateChange,
    StoredEvent,
)
from episodic.search import check_search_limit, render_hits
from episodic.store import DEFAULT_TENANT, EpisodicStore
from episodic.view import in_view

logger = logging.getLogger(__name__)

#: The namespace of the conversation ids sessions map to (uuid5 of tenant, app, user, id).
SESSION_NAMESPACE = uuid.UUID("2b0f7a64-1d55-4c1e-9a6f-8e3c0d7b9f42")
#: The reason of a boundary made from ADK's own compaction event.
ADK_COMPACTION_REASON = "adk_events_compaction"
#: The ``native_handoff`` protocol of such a boundary: the compaction events it stands for.
ADK_COMPACTIONS_PROTOCOL = "google.adk.compactions"
#: ADK's own words for a stale session (its tests match them).
STALE_SESSION_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
#: The id of the compaction event a boundary is shown as, in ``get_session``.
BOUNDARY_EVENT_PREFIX = "episodic-boundary-"
#: A listing's page (an index range each).
LIST_PAGE = 500
#: Boundaries a session may miss and still append (more is another writer, surely).
MAX_BOUNDARIES_BETWEEN = 16
#: Times one session id may be deleted and created again.
MAX_GENERATIONS = 64
#: Reads of the tail and the state that a concurrent write may put at different seqs.
CONSISTENT_READ_TRIES = 5


def session_conversation_id(
    app_name: str,
    user_id: str,
    session_id: str,
    tenant_id: str = DEFAULT_TENANT,
    generation: int = 0,
) -> uuid.UUID:
    """The conversation an ADK session names: the same names, the same conversation, in
    every process. A session id created again after a deletion names the next
    ``generation`` (the deleted one keeps its log)."""
    names: list[str | int] = [tenant_id, app_name, user_id, session_id]
    if generation:
        names.append(generation)
    return uuid.uuid5(SESSION_NAMESPACE, orjson.dumps(names).decode())


def app_scope(app_name: str) -> str:
    """The shared scope of an app's ``app:`` state."""
    return "adk.app:" + orjson.dumps([app_name]).decode()


def user_scope(app_name: str, user_id: str) -> str:
    """The shared scope of one user's ``user:`` state in an app."""
    return "adk.user:" + orjson.dumps([app_name, user_id]).decode()


class EpisodicSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on an episodic store (see the module's docstring). A
    tenant-scoped store (``store.for_tenant``) scopes every session."""

    def __init__(self, store: EpisodicStore, *, full_history: bool = False) -> None:
        if not isinstance(store, EpisodicStore):
            raise ValidationError(
                "EpisodicSessionService takes an episodic.EpisodicStore", field="store"
            )
        self.store = store
        #: read every event, not the compacted view (with_full_history)
        self.full_history = full_history
        self._tenant = store.tenant_id or DEFAULT_TENANT

    def with_full_history(self) -> EpisodicSessionService:
        """The same service, whose ``get_session`` returns every event of the log (paged),
        ignoring boundaries: for ``Runner.rewind_async``, which replays deltas from the
        start."""
        return EpisodicSessionService(self.store, full_history=True)

    def search_tool(self, *, limit: int = DEFAULT_TOOL_HITS) -> FunctionTool:
        """A tool that searches the running session's whole log (tool outputs included) for
        a few words: give it to any agent run with this service, and it can recall an exact
        detail a compaction summarized away. It finds the session from ADK's tool context."""
        service = self

        async def search_conversation(query: str, tool_context: ToolContext) -> str:
            session = tool_context.session
            try:
                _, cid = await service._live(session.app_name, session.user_id, session.id)
            except NotFoundError:
                return render_hits([], query)
            return await ConversationSearch(service.store, cid, limit=limit)(query)

        search_conversation.__doc__ = SEARCH_TOOL_DESCRIPTION
        check_search_limit(limit)
        return FunctionTool(search_conversation)

    def _conversation(
        self, app_name: str, user_id: str, session_id: str, generation: int = 0
    ) -> uuid.UUID:
        return session_conversation_id(app_name, user_id, session_id, self._tenant, generation)

    async def _live(self, app_name: str, user_id: str, session_id: str) -> tuple[int, uuid.UUID]:
        """The generation of a session id that is not deleted, and its conversation: the
        first one is read first, so a session never deleted costs one read. NotFoundError
        when there is none (generations are made in order, so the first missing one ends
        the search)."""
        for generation in range(MAX_GENERATIONS):
            cid = self._conversation(app_name, user_id, session_id, generation)
            head = await self.store.get_conversation(cid)  # NotFoundError ends the search
            if head.deleted_at is None:
                return generation, cid
        raise NotFoundError(self._conversation(app_name, user_id, session_id))

    @staticmethod
    def _of(session: Session) -> tuple[int | None, int | None]:
        """A session object's generation and revision (seq), from its marker; None for a
        session ADK did not read from here."""
        marker = session._storage_update_marker
        if marker is None:
            return None, None
        generation, _, seq = marker.rpartition(":")
        return int(generation or 0), int(seq)

    # ---- sessions -----------------------------------------------------------------------

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        # As ADK's own services: a given id is stripped of surrounding whitespace.
        given = session_id.strip() if session_id else None
        sid = given or str(uuid.uuid4())
        _check_names(app_name, user_id)
        change = _state_change(state or {}, app_name, user_id)
        now = time.time()
        for generation in range(MAX_GENERATIONS):
            cid = self._conversation(app_name, user_id, sid, generation)
            try:
                await self.store.create_conversation(
                    conversation_id=cid,
                    metadata={"adk_session_id": sid, "adk_generation": generation},
                    app_name=app_name,
                    user_id=user_id,
                    state=change,
                    touched_at=now,
                    # a session id given again after an erasure is a new session, asked for
                    reuse_erased_id=True,
                )
                break
            except ConflictError:
                # Taken: by a live session (ADK's error), or by a deleted one (the next).
                if (await self.store.get_conversation(cid)).deleted_at is None:
                    raise AlreadyExistsError(f"Session with id {sid} already exists.") from None
        else:
            raise AlreadyExistsError(
                f"Session id {sid} was deleted and created again {MAX_GENERATIONS} times; "
                "erase its old logs or use another id"
            )
        found = await self.store.read_state(
            cid, shared=[app_scope(app_name), user_scope(app_name, user_id)]
        )
        return _revision(sid, app_name, user_id, generation, replace(found, touched_at=now))

    @override
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        sid = session_id.strip() if session_id else session_id
        scopes = [app_scope(app_name), user_scope(app_name, user_id)]
        read = await self._read_generation(app_name, user_id, sid, 0, scopes, config)
        if read is None:
            # Not there, or deleted: a later generation of the id may be live.
            try:
                generation, _ = await self._live(app_name, user_id, sid)
            except NotFoundError:
                return None
            if generation == 0:
                return None  # written after the read above: not there when asked
            read = await self._read_generation(app_name, user_id, sid, generation, scopes, config)
            if read is None:
                return None
        generation, events, found = read
        if config is not None and config.after_timestamp is not None:
            events = [e for e in events if e.timestamp >= config.after_timestamp]
        if config is not None and config.num_recent_events:
            events = events[-config.num_recent_events :]
        return _revision(sid, app_name, user_id, generation, found, events)

    async def _read_generation(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        generation: int,
        scopes: list[str],
        config: GetSessionConfig | None,
    ) -> tuple[int, list[Event], StateSnapshot] | None:
        """One generation's events and state (none of its events for a config asking for
        none); None when it is not there or deleted."""
        cid = self._conversation(app_name, user_id, session_id, generation)
        if config is not None and config.num_recent_events == 0:
            try:
                return generation, [], await self.store.read_state(cid, shared=scopes)
            except NotFoundError:
                return None
        read = await self._read_session(cid, scopes)
        return (generation, *read) if read is not None else None

    async def _read_session(
        self, cid: uuid.UUID, scopes: list[str]
    ) -> tuple[list[Event], StateSnapshot] | None:
        """The session's events and its state, read at the same seq: a write between the
        two reads is seen by one and not the other, and both are read again."""
        for _ in range(CONSISTENT_READ_TRIES):
            try:
                if self.full_history:
                    stored = await self._every_event(cid)
                    boundary, last_seq = None, stored[-1].seq if stored else 0
                else:
                    context, stored = await self.store.load_context_and_tail(cid)
                    boundary, last_seq = context.boundary, context.last_seq
                found = await self.store.read_state(cid, shared=scopes)
            except NotFoundError:
                return None
            if found.last_seq == last_seq:
                return _events_of(stored, boundary), found
        raise TransientDatabaseError(
            f"session {cid} kept changing while it was read ({CONSISTENT_READ_TRIES} tries); retry"
        )

    async def _every_event(self, cid: uuid.UUID) -> list[StoredEvent]:
        stored: list[StoredEvent] = []
        while True:
            page = await self.store.read_events(
                cid, after_seq=stored[-1].seq if stored else 0, limit=1_000
            )
            stored.extend(page)
            if len(page) < 1_000:
                return stored

    @override
    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        listed: list[Conversation] = []
        while True:
            page = await self.store.list_by_user(
                app_name, user_id, limit=LIST_PAGE, after=listed[-1] if listed else None
            )
            listed.extend(page)
            if len(page) < LIST_PAGE:
                break
        users = sorted({c.user_id for c in listed if c.user_id is not None})
        scopes = [app_scope(app_name), *(user_scope(app_name, u) for u in users)]
        shared = (await self.store.read_state(None, shared=scopes)).shared if listed else {}
        sessions = []
        for conversation in listed:
            assert conversation.user_id is not None
            generation = conversation.metadata.get("adk_generation")
            own = StateSnapshot(
                conversation.state, shared, conversation.last_seq, conversation.touched_at
            )
            session = _revision(
                str(conversation.metadata.get("adk_session_id")),
                app_name,
                conversation.user_id,
                generation if isinstance(generation, int) else 0,
                own,
            )
            sessions.append(session)
        # ADK's order: oldest update first (then by user and id, as its database service).
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    @override
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        sid = session_id.strip() if session_id else session_id
        try:
            _, cid = await self._live(app_name, user_id, sid)
            await self.store.delete_conversation(cid)
        except NotFoundError:
            return  # as ADK's services: deleting what is not there is not an error

    async def erase_session(
        self, *, app_name: str, user_id: str, session_id: str, reason: str
    ) -> list[Erasure]:
        """Erase the session completely, every generation of its id (a deleted one too):
        episodic's audited erasure (:meth:`EpisodicStore.erase_conversation`), not ADK's
        deletion, which keeps the log. Returns a tombstone per generation; the store must
        be connected as a member of ``episodic_eraser`` on PostgreSQL. Creating the id again
        afterwards starts a new, empty session."""
        sid = session_id.strip() if session_id else session_id
        erased: list[Erasure] = []
        for generation in range(MAX_GENERATIONS):
            cid = self._conversation(app_name, user_id, sid, generation)
            try:
                erased.append(await self.store.erase_conversation(cid, reason=reason))
            except NotFoundError:
                break  # generations are made in order: the first never seen ends them
        return erased

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        scope = user_scope(app_name, user_id)
        found = await self.store.read_state(None, shared=[scope])
        return dict(found.shared.get(scope, {}))

    # ---- events -------------------------------------------------------------------------

    @override
    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        # What the event itself can be refused for is decided before the session is touched
        # (ADK applies temp: state before its own service's database refusals, too).
        stored_delta = {
            key: value
            for key, value in (event.actions.state_delta or {}).items()
            if not key.startswith(State.TEMP_PREFIX)
        }
        change = _state_change(stored_delta, session.app_name, session.user_id)
        text, data = _event_json(
            event.model_copy(update={"actions": _trimmed(event, stored_delta)})
        )
        messages = messages_from_adk_event(data)
        key = f"adk:{event.id}:{hashlib.sha256(text).hexdigest()[:32]}"
        generation, read_at = self._of(session)
        if generation is None:
            try:
                generation, cid = await self._live(session.app_name, session.user_id, session.id)
            except NotFoundError:
                raise SessionNotFoundError(f"Session {session.id} not found.") from None
        else:
            cid = self._conversation(session.app_name, session.user_id, session.id, generation)

        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        expected = read_at
        while True:
            try:
                stored = await self.store.append(
                    cid,
                    messages,
                    idempotency_key=key,
                    expected_seq=expected,
                    state=change,
                    touched_at=event.timestamp,
                )
                break
            except ConflictError as exc:
                expected = await self._past_boundaries(cid, exc)
            except OrphanToolResultError as exc:
                # A long-running tool answers once for now and again when done: the later
                # responses are kept as the event's content (the first closed the call).
                if exc.tool_call_id not in _long_running_ids(session) or not _pairs(messages):
                    raise
                messages = messages_from_adk_event(data, pair_responses=False)
            except NotFoundError:
                raise SessionNotFoundError(f"Session {session.id} not found.") from None
        last = stored[-1].seq + (1 if change is not None else 0)
        if read_at is not None and last <= read_at:
            return event  # the same event again: stored once, applied once
        session._storage_update_marker = _marker(generation, last)
        session.last_update_time = event.timestamp
        self._commit_event_to_session(session, event)
        if event.actions.compaction is not None:
            await self._write_adk_compaction(cid, event)
        return event

    async def _past_boundaries(self, cid: uuid.UUID, conflict: ConflictError) -> int:
        """Where to expect the log to end now, when all that was written since the session
        was read is boundaries (the worker compacting while a run holds the session: the
        session is not stale for that). Anything else, another writer's event, makes it
        stale: ADK's ``StaleSessionError``."""
        since = conflict.expected_seq
        actual = conflict.actual_seq
        if since is None or actual is None or actual - since > MAX_BOUNDARIES_BETWEEN:
            raise StaleSessionError(STALE_SESSION_MESSAGE) from None
        written = await self.store.read_events(cid, after_seq=since, limit=actual - since)
        if not written or not all(isinstance(e, BoundaryEvent) for e in written):
            raise StaleSessionError(STALE_SESSION_MESSAGE) from None
        return written[-1].seq

    async def _write_adk_compaction(self, cid: uuid.UUID, event: Event) -> None:
        """ADK's own compaction as a boundary through the latest event it covers, carrying
        the compaction events that then stand for everything before the cut (ADK's rule:
        every one no other contains), so the next ``get_session`` reads what follows the cut
        and ADK still sees each summary it would. When no safe cut is there (a call still
        waiting), or the write fails, none is written: the events still stand as they are."""
        compaction = event.actions.compaction
        assert compaction is not None
        end = compaction.end_timestamp
        if end is None or compaction.compacted_content is None:
            return
        try:
            context, tail = await self.store.load_context_and_tail(cid)
            groups = _event_groups(tail)
            covered = [
                group.last_seq
                for group in groups
                if not _is_compaction(group.data) and _timestamp(group.data) <= end
            ]
            if not covered:
                return
            standing = _standing_compactions(context.boundary, groups)
            texts = [_compaction_text(data) for data in standing]
            request = BoundaryRequest(
                summary="\n\n".join(text for text in texts if text),
                covers_through_seq=covered[-1],
                reason=ADK_COMPACTION_REASON,
                expected_boundary_seq=context.boundary_seq,
                native_handoff={"protocol": ADK_COMPACTIONS_PROTOCOL, "events": standing},
            )
            await self.store.write_boundary(cid, request)
        except EpisodicError as exc:
            logger.warning("ADK's compaction of %s is kept as its event only: %s", cid, exc)


# ---- the session's events -----------------------------------------------------------------


def _events_of(stored: Sequence[StoredEvent], boundary: BoundaryEvent | None) -> list[Event]:
    """ADK events from the log's tail, in ADK's order (by timestamp, ties by id), after a
    boundary's stand-in: the compaction events an ADK compaction's boundary carries (those
    in the tail that it folded in, written before it, are then left out), or, for the
    worker's, one compaction event carrying its handoff."""
    carried = _carried(boundary)
    groups = _event_groups(stored)
    if carried is None:
        datas = [group.data for group in groups]
    else:
        assert boundary is not None
        datas = [
            *carried,
            *(
                group.data
                for group in groups
                if not (_is_compaction(group.data) and group.first_seq < boundary.seq)
            ),
        ]
    events = [Event.model_validate_json(orjson.dumps(data)) for data in datas]
    events.sort(key=lambda e: (e.timestamp, e.id))
    if boundary is not None and carried is None:
        events.insert(0, _compaction_event(boundary, events))
    return events


def _carried(boundary: BoundaryEvent | None) -> list[dict[str, Any]] | None:
    """The ADK compaction events a boundary made from ADK's compaction carries."""
    native = boundary.native_handoff if boundary is not None else None
    if not native or native.get("protocol") != ADK_COMPACTIONS_PROTOCOL:
        return None
    events = native.get("events")
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else None


def _standing_compactions(
    boundary: BoundaryEvent | None, groups: Sequence[_Stored]
) -> list[dict[str, Any]]:
    """The compaction events that stand for the log through a new ADK compaction: the
    previous boundary's (its carried events, or the worker's handoff as one), then those in
    the tail, less every one another contains (ADK's own rule)."""
    candidates: list[dict[str, Any]] = []
    if boundary is not None:
        carried = _carried(boundary)
        if carried is not None:
            candidates.extend(carried)
        else:
            first = next((_timestamp(group.data) for group in groups), None)
            stand_in = _compaction_event(boundary, [], first=first)
            candidates.append(orjson.loads(stand_in.model_dump_json()))
    candidates.extend(group.data for group in groups if _is_compaction(group.data))
    events = [Event.model_validate_json(orjson.dumps(data)) for data in candidates]
    surviving = {index for index, _, _ in compaction_ranges(events)}
    return [data for index, data in enumerate(candidates) if index in surviving]


@dataclass(frozen=True, slots=True)
class _Stored:
    """An ADK event in the log: its JSON and the seqs of its first and last messages (an
    event of several function responses is several messages; a cut inside would split
    it)."""

    data: dict[str, Any]
    first_seq: int
    last_seq: int


def _event_groups(stored: Sequence[StoredEvent]) -> list[_Stored]:
    """Each ADK event in view, in log order."""
    groups: list[_Stored] = []
    for event in in_view(list(stored)):
        if not isinstance(event, MessageEvent):
            continue
        data = _native(event)
        if data is not None:
            groups.append(_Stored(data, event.seq, event.seq))
        elif groups:
            groups[-1] = _Stored(groups[-1].data, groups[-1].first_seq, event.seq)
    return groups


def _compaction_event(
    boundary: BoundaryEvent, tail: Sequence[Event], *, first: float | None = None
) -> Event:
    """The boundary as ADK's own compaction event: its handoff (and retained user
    messages) as the compacted content, over a range just before the first event after
    the boundary, so ADK's request builder puts it first and filters nothing it did not
    cover."""
    if first is None:
        first = tail[0].timestamp if tail else boundary.created_at.timestamp()
    at = math.nextafter(first, -math.inf)
    parts = [types.Part(text=m.text) for m in boundary_messages(boundary) if m.text]
    return Event(
        id=f"{BOUNDARY_EVENT_PREFIX}{boundary.seq}",
        invocation_id=f"{BOUNDARY_EVENT_PREFIX}{boundary.seq}",
        author="user",
        timestamp=at,
        actions=EventActions(
            compaction=EventCompaction(
                start_timestamp=at,
                end_timestamp=at,
                compacted_content=types.Content(role="model", parts=parts),
            )
        ),
    )


def _native(event: StoredEvent) -> dict[str, Any] | None:
    if not isinstance(event, MessageEvent):
        return None
    native = event.message.native
    if native is None or native.protocol != ADK_EVENT_PROTOCOL:
        return None
    data = native.data.get("event")
    return data if isinstance(data, dict) else None


def _timestamp(data: dict[str, Any]) -> float:
    stamp = data.get("timestamp")
    return float(stamp) if isinstance(stamp, int | float) else 0.0


def _is_compaction(data: dict[str, Any]) -> bool:
    actions = data.get("actions")
    return isinstance(actions, dict) and actions.get("compaction") is not None


def _compaction_text(data: dict[str, Any]) -> str:
    compaction = (data.get("actions") or {}).get("compaction") or {}
    content = compaction.get("compacted_content") or {}
    parts = content.get("parts") or []
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and p.get("text"))


def _long_running_ids(session: Session) -> set[str]:
    return {i for e in session.events for i in e.long_running_tool_ids or ()}


def _pairs(messages: Sequence[Message]) -> bool:
    return any(m.tool_call_id is not None for m in messages)


# ---- state and JSON -----------------------------------------------------------------------


def _state_change(state: dict[str, Any], app_name: str, user_id: str) -> StateChange | None:
    """ADK's state keys as the log's change: session keys the conversation's own, ``app:``
    and ``user:`` keys (prefix off) the shared scopes, ``temp:`` keys none. A value JSON
    cannot hold is refused (:class:`~episodic.errors.ValidationError`), before anything is
    written."""
    try:
        deltas = _session_util.extract_state_delta(to_jsonable_python(state))
        shared: dict[str, dict[str, JsonValue]] = {}
        if deltas["app"]:
            shared[app_scope(app_name)] = deltas["app"]
        if deltas["user"]:
            shared[user_scope(app_name, user_id)] = deltas["user"]
        if not deltas["session"] and not shared:
            return None
        return StateChange(conversation=deltas["session"], shared=shared)
    except (PydanticSerializationError, TypeError, ValueError) as exc:  # pydantic's is one
        raise ValidationError(
            f"an ADK state delta must hold JSON values only; nothing was written: {exc}",
            field="state_delta",
        ) from None


def _revision(
    session_id: str,
    app_name: str,
    user_id: str,
    generation: int,
    found: StateSnapshot,
    events: Sequence[Event] = (),
) -> Session:
    """The session as ``found`` (its state, where its log ended, when it was last written):
    ADK's revision marker is that last seq (and the generation, past the first)."""
    session = Session(
        id=session_id,
        app_name=app_name,
        user_id=user_id,
        state=_merged(found.conversation, found.shared, app_name, user_id),
        events=list(events),
        last_update_time=found.touched_at if found.touched_at is not None else 0.0,
    )
    session._storage_update_marker = _marker(generation, found.last_seq or 0)
    return session


def _marker(generation: int, seq: int) -> str:
    return f"{generation}:{seq}" if generation else str(seq)


def _merged(
    own: dict[str, Any], shared: dict[str, dict[str, Any]], app_name: str, user_id: str
) -> dict[str, Any]:
    """The state a session shows: its own keys, then the app's and the user's, prefixed
    (ADK's merge)."""
    merged = dict(own)
    for key, value in shared.get(app_scope(app_name), {}).items():
        merged[State.APP_PREFIX + key] = value
    for key, value in shared.get(user_scope(app_name, user_id), {}).items():
        merged[State.USER_PREFIX + key] = value
    return merged


def _trimmed(event: Event, stored_delta: dict[str, Any]) -> EventActions:
    return event.actions.model_copy(update={"state_delta": stored_delta})


def _event_json(event: Event) -> tuple[bytes, dict[str, Any]]:
    """The event's JSON, as ADK's own database service stores it (bytes as base64): the
    text (equal events, equal text) and its value."""
    try:
        text = event.model_dump_json().encode()
        data: dict[str, Any] = orjson.loads(text)
    except (PydanticSerializationError, ValueError) as exc:
        raise ValidationError(
            f"the ADK event cannot be stored as JSON; nothing was written: {exc}",
            field="event",
        ) from None
    return text, data


def _check_names(app_name: str, user_id: str) -> None:
    if not isinstance(app_name, str) or not app_name:
        raise ValidationError("app_name must be a non-empty string", field="app_name")
    if not isinstance(user_id, str):
        raise ValidationError("user_id must be a string", field="user_id")


__all__ = [
    "ADK_COMPACTION_REASON",
    "SESSION_NAMESPACE",
    "EpisodicSessionService",
    "app_scope",
    "session_conversation_id",
    "user_scope",
]
