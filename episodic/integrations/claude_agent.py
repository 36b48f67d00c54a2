"""A ``SessionStore`` for the Claude Agent SDK (``claude-agent-sdk``, 0.2):
``ClaudeAgentOptions(session_store=EpisodicSessionStore(store))``.

The SDK mirrors every line of Claude Code's session transcript into the store and reads it
back to resume. Claude Code compacts on its own (its ``compact_boundary`` entries), so here
episodic is the durable, tenant-scoped, erasable mirror, not the compactor: ``load`` gives the
entries back as they were appended, deep-equal, each kept whole in one message of the log.

A key ``{project_key, session_id, subpath?}`` names one conversation per tenant (a UUID derived
from the four), created by its first append. The project is a namespace inside the tenant:
a main transcript is listed under the project (:meth:`list_sessions`), a subpath (a
subagent's transcript) under its session (:meth:`list_subkeys`), so neither listing reads
another's rows. An entry's ``uuid`` is the message's client id: the store refuses to keep it
twice in one conversation, so a batch the SDK retries, or sends twice from two processes,
is written once; entries without one (titles, tags) are appended as they come, as the SDK
asks. ``delete`` is the audited erasure (the session, then each of its subpaths), leaving the
tombstone every erasure leaves.

The summary the SDK lists sessions by (``fold_session_summary``) is kept in the main
conversation's state, folded in the same transaction as the entries it folds: an append
reads the summary and the seq it is at, then writes the entries and the new summary only if
the conversation is still at that seq (two concurrent appends retry, never lose a fold).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import cast
from uuid import UUID

from claude_agent_sdk import SessionStore, fold_session_summary
from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)
from pydantic import JsonValue

from episodic.errors import (
    ConflictError,
    ErasedConversationError,
    IdempotencyMismatchError,
    NotFoundError,
    ValidationError,
)
from episodic.formats.claude_code import ENTRY_PROTOCOL
from episodic.integrations.sessions import create_session_conversation
from episodic.models import Conversation, Message, MessageEvent, NativePayload, StateChange
from episodic.store import DEFAULT_TENANT, EpisodicStore
from episodic.store.checks import MAX_LISTING_LENGTH

#: The namespace of the conversation ids keys map to (uuid5 of the tenant and the key).
KEY_NAMESPACE = uuid.UUID("0c8f4a6e-3b5d-4f2a-9e71-2d6c8b9a4f13")
#: The conversation state key the session summary is kept under.
SUMMARY_STATE_KEY = "claude_agent_summary"
#: Where the TypeScript SDK's summary is kept: its fold writes another format (camelCase
#: fields, ``foldSessionSummary``) that only it reads, so each SDK keeps its own.
TS_SUMMARY_STATE_KEY = "claude_agent_summary_ts"
#: The reason recorded on the tombstone of a deleted session.
DELETE_REASON = "claude-agent-sdk SessionStore.delete"
#: How many times an append re-reads the summary after losing a race for the same session.
MAX_FOLD_ATTEMPTS = 50
_PAGE = 500


def key_conversation_id(key: SessionKey, tenant_id: str = DEFAULT_TENANT) -> UUID:
    """The conversation a key names for a tenant: the same key, the same conversation, in
    every process."""
    parts = [tenant_id, key["project_key"], key["session_id"], key.get("subpath") or ""]
    return uuid.uuid5(KEY_NAMESPACE, json.dumps(parts))


def _project_listing(project_key: str) -> str:
    """The app name the project's main transcripts are listed under."""
    return f"claude-agent:{project_key}"


def _session_listing(project_key: str, session_id: str) -> str:
    """The app name a session's subpaths are listed under: the two parts, or past the
    listing's length (JSON escapes can make it six times a key's) their digest."""
    name = f"claude-agent:{json.dumps([project_key, session_id])}"
    if len(name) <= MAX_LISTING_LENGTH:
        return name
    return f"claude-agent:sha256:{hashlib.sha256(name.encode()).hexdigest()}"


class EpisodicSessionStore(SessionStore):
    """The SDK's ``SessionStore`` on an episodic store (see the module's docstring). A
    tenant-scoped store (``store.for_tenant``) scopes every key."""

    def __init__(self, store: EpisodicStore) -> None:
        self.store = store
        self.tenant_id = store.tenant_id or DEFAULT_TENANT

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Append ``entries`` in order; an entry whose ``uuid`` the key already holds is not
        stored again."""
        _check_key(key)
        cid = key_conversation_id(key, self.tenant_id)
        for _ in range(MAX_FOLD_ATTEMPTS):
            try:
                if key.get("subpath"):
                    write = self._writing(cid, key)
                else:
                    write = await self._folded_here(cid, key)
                await _each_once(_unique_by_uuid(entries), write)
                return
            except ErasedConversationError:
                raise  # deleted: a late write does not bring it back
            except ConflictError:
                continue  # another append to the session won: fold on top of it
        raise ConflictError(
            f"appends to session {key['session_id']!r} kept racing this one; nothing was "
            f"written after {MAX_FOLD_ATTEMPTS} attempts. Retry the batch.",
            conversation_id=cid,
        )

    async def append_folded_by_caller(
        self,
        key: SessionKey,
        entries: list[SessionStoreEntry],
        *,
        summary: dict[str, JsonValue] | None,
        at_seq: int | None,
        state_key: str = TS_SUMMARY_STATE_KEY,
    ) -> None:
        """``append`` for an SDK that folds its summary itself (the TypeScript SDK, over
        HTTP): ``summary`` is its fold over the summary :meth:`read_summary` gave at
        ``at_seq`` (None for a subpath, which has none). :class:`ConflictError` when the
        session moved on since: read again, fold again."""
        _check_key(key)
        cid = key_conversation_id(key, self.tenant_id)
        if summary is None or key.get("subpath"):
            write = self._writing(cid, key)
        else:
            write = self._writing(cid, key, summary=summary, at_seq=at_seq, state_key=state_key)
        await _each_once(_unique_by_uuid(entries), write)

    async def read_summary(
        self, key: SessionKey, state_key: str = TS_SUMMARY_STATE_KEY
    ) -> tuple[dict[str, JsonValue] | None, int | None]:
        """The summary kept under ``state_key`` and the seq the session is at (None, None
        for a session never written): what a caller's fold starts from."""
        _check_key(key)
        try:
            snapshot = await self.store.read_state(key_conversation_id(key, self.tenant_id))
        except NotFoundError:
            return None, None
        previous = snapshot.conversation.get(state_key)
        return (previous if isinstance(previous, dict) else None), snapshot.last_seq

    def _writing(
        self,
        cid: UUID,
        key: SessionKey,
        *,
        summary: dict[str, JsonValue] | None = None,
        at_seq: int | None = None,
        state_key: str = SUMMARY_STATE_KEY,
    ) -> _Write:
        """A write of entries, with ``summary`` (already folded) when there is one."""

        async def write(entries: list[SessionStoreEntry]) -> None:
            await self._append(
                cid, key, entries, summary=summary, at_seq=at_seq, state_key=state_key
            )

        return write

    async def _folded_here(self, cid: UUID, key: SessionKey) -> _Write:
        """A write of entries with the Python SDK's summary folded over them, made only if
        the session is still at the seq the summary was read at."""
        previous, at_seq = await self.read_summary(key, SUMMARY_STATE_KEY)

        async def write(entries: list[SessionStoreEntry]) -> None:
            summary = fold_session_summary(
                cast(SessionSummaryEntry, previous) if previous is not None else None,
                key,
                entries,
            )
            await self._append(
                cid, key, entries, summary=cast(dict[str, JsonValue], summary), at_seq=at_seq
            )

        return write

    async def _append(
        self,
        cid: UUID,
        key: SessionKey,
        entries: list[SessionStoreEntry],
        *,
        summary: dict[str, JsonValue] | None,
        at_seq: int | None,
        state_key: str = SUMMARY_STATE_KEY,
    ) -> None:
        now_ms = int(time.time() * 1000)
        state = None
        if summary is not None:
            # the summary's mtime is the session's listed mtime: the same clock, one write
            stamped: dict[str, JsonValue] = {**summary, "mtime": now_ms}
            state = StateChange(conversation={state_key: stamped})
        messages = [_entry_message(entry) for entry in entries]
        touched_at = now_ms / 1000
        # a summary read from a session never written folds onto nothing: it may be written
        # only while the session is still empty (a concurrent first write folds first)
        expected = 0 if summary is not None and at_seq is None else at_seq
        try:
            await self.store.append(
                cid, messages, expected_seq=expected, state=state, touched_at=touched_at
            )
        except NotFoundError:
            await self._create(cid, key)
            # a first write's summary folds onto nothing: it is written only while the
            # session is still empty; entries without a summary (a subpath) go in as they come
            await self.store.append(
                cid,
                messages,
                expected_seq=0 if summary is not None else None,
                state=state,
                touched_at=touched_at,
            )

    async def _create(self, cid: UUID, key: SessionKey) -> None:
        subpath = key.get("subpath")
        app_name, user_id = (
            (_session_listing(key["project_key"], key["session_id"]), subpath)
            if subpath
            else (_project_listing(key["project_key"]), key["session_id"])
        )
        named: dict[str, JsonValue] = {
            "project_key": key["project_key"],
            "session_id": key["session_id"],
        }
        if subpath:
            named["subpath"] = subpath
        await create_session_conversation(
            self.store, cid, metadata={"claude_agent": named}, app_name=app_name, user_id=user_id
        )

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """The key's entries as appended, oldest first; None for a key never written (or
        deleted)."""
        _check_key(key)
        cid = key_conversation_id(key, self.tenant_id)
        entries: list[SessionStoreEntry] = []
        after = 0
        while True:
            try:
                events = await self.store.read_events(cid, after_seq=after, limit=_PAGE)
            except NotFoundError:
                return None
            for event in events:
                if isinstance(event, MessageEvent) and event.message.native is not None:
                    native = event.message.native
                    if native.protocol == ENTRY_PROTOCOL:
                        entries.append(cast(SessionStoreEntry, native.data))
            if len(events) < _PAGE:
                return entries
            after = events[-1].seq

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        """The project's sessions (main transcripts only), with their last write's time in
        epoch milliseconds."""
        return [
            {"session_id": c.user_id or "", "mtime": _mtime_ms(c.touched_at)}
            for c in await self._listed(_project_listing(_text(project_key, "project_key")))
        ]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        """The summaries the SDK folded for the project's sessions."""
        return cast(list[SessionSummaryEntry], await self.summaries(project_key))

    async def summaries(
        self, project_key: str, state_key: str = SUMMARY_STATE_KEY
    ) -> list[dict[str, JsonValue]]:
        """The summaries kept under ``state_key`` for the project's sessions."""
        found = await self._listed(_project_listing(_text(project_key, "project_key")))
        return [
            cast(dict[str, JsonValue], c.state[state_key])
            for c in found
            if isinstance(c.state.get(state_key), dict)
        ]

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        """The subpaths written under the session (not the main transcript)."""
        listing = _session_listing(
            _text(key["project_key"], "project_key"), _text(key["session_id"], "session_id")
        )
        return [c.user_id or "" for c in await self._listed(listing)]

    async def delete(self, key: SessionKey) -> None:
        """Erase the key's conversation (a main key's subpaths too), each leaving a tombstone;
        a key never written is nothing to delete."""
        _check_key(key)
        doomed = [key_conversation_id(key, self.tenant_id)]
        if not key.get("subpath"):
            listing = _session_listing(key["project_key"], key["session_id"])
            doomed += [c.conversation_id for c in await self._listed(listing)]
        for cid in doomed:
            with suppress(NotFoundError):  # a key never written: nothing to delete
                await self.store.erase_conversation(cid, reason=DELETE_REASON)

    async def _listed(self, app_name: str) -> list[Conversation]:
        """Every conversation listed under ``app_name``, page by page."""
        found: list[Conversation] = []
        page = await self.store.list_by_user(app_name, limit=_PAGE)
        while page:
            found += page
            if len(page) < _PAGE:
                break
            page = await self.store.list_by_user(app_name, limit=_PAGE, after=page[-1])
        return found


_Write = Callable[[list[SessionStoreEntry]], Awaitable[None]]


async def _each_once(pending: list[SessionStoreEntry], write: _Write) -> None:
    """``write`` the entries, leaving out each one the session already holds: the store
    refuses a batch whose entry's ``uuid`` it has (a retried batch, or a concurrent writer's),
    naming it, and nothing of that batch is written."""
    while pending:
        try:
            await write(pending)
            return
        except IdempotencyMismatchError as exc:
            stored = exc.key or pending[0].get("uuid")
            pending = [entry for entry in pending if entry.get("uuid") != stored]


def _entry_message(entry: SessionStoreEntry) -> Message:
    """One entry as a message holding it whole: a user or assistant line by its role (its
    text is what search finds), any other line (system, progress, titles) as a system
    message, which the log keeps and a context never loads."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ValidationError("a session entry must be a JSON object with a string 'type'")
    data = cast(dict[str, JsonValue], entry)
    kind = entry["type"]
    role = kind if kind in ("user", "assistant") else "system"
    client_id = entry.get("uuid")
    return Message(
        role=role,
        content=_text_of(entry) or f"[{kind}]",
        native=NativePayload(protocol=ENTRY_PROTOCOL, data=data),
        client_id=client_id if isinstance(client_id, str) and client_id else None,
    )


def _text_of(entry: SessionStoreEntry) -> str:
    """The readable text of a transcript line: its message's text blocks (tool results'
    text included), else its own ``content``."""
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else entry.get("content")
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            inner = block.get("text", block.get("content"))
            if isinstance(inner, str):
                texts.append(inner)
            elif isinstance(inner, list):
                texts += [b["text"] for b in inner if isinstance(b, dict) and "text" in b]
    return "\n".join(str(text) for text in texts)


def _unique_by_uuid(entries: Sequence[SessionStoreEntry]) -> list[SessionStoreEntry]:
    """``entries`` with each ``uuid`` once (the first); entries without one all kept."""
    if not isinstance(entries, list):
        raise ValidationError("entries must be a list of session entries", field="entries")
    seen: set[str] = set()
    unique: list[SessionStoreEntry] = []
    for entry in entries:
        uid = entry.get("uuid") if isinstance(entry, dict) else None
        if isinstance(uid, str) and uid:
            if uid in seen:
                continue
            seen.add(uid)
        unique.append(entry)
    return unique


def _check_key(key: SessionKey) -> None:
    if not isinstance(key, dict):
        raise ValidationError("a session key must be a dict with project_key and session_id")
    _text(key.get("project_key"), "project_key")
    _text(key.get("session_id"), "session_id")
    subpath = key.get("subpath")
    if subpath is not None and (not isinstance(subpath, str) or not subpath):
        raise ValidationError("a key's subpath must be a non-empty string", field="subpath")


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(f"a session key's {field} must be a non-empty string", field=field)
    return value


def _mtime_ms(touched_at: float | None) -> int:
    return round(touched_at * 1000) if touched_at is not None else 0


__all__ = [
    "DELETE_REASON",
    "ENTRY_PROTOCOL",
    "KEY_NAMESPACE",
    "SUMMARY_STATE_KEY",
    "TS_SUMMARY_STATE_KEY",
    "EpisodicSessionStore",
    "key_conversation_id",
]
