"""The Claude Agent SDK's ``SessionStore`` over HTTP, for the TypeScript SDK's store
(``clients/typescript/src/claude-agent-sdk.ts``): the Python ``EpisodicSessionStore``
behind each route, so both languages share one store (the same key, the same conversation,
entries and listings).

One part is the caller's: the session summary. The two SDKs fold it into different formats
(the TypeScript ``foldSessionSummary`` writes camelCase fields the Python fold does not), and
each reads only its own, so the TypeScript store folds its summary itself, kept apart
(``TS_SUMMARY_STATE_KEY``): it reads the summary and the seq the session is at
(``GET .../summary``), folds, and appends the entries with the new summary and that seq; a
412 ConflictError means another append won, and it folds again. ``delete`` is the audited
erasure, for operator keys as every erasure over HTTP is. Needs the ``claude-agent`` extra
(501 without).

No ``from __future__ import annotations``: FastAPI reads the routes' annotations, which name
this module's local dependency aliases."""

from typing import TYPE_CHECKING, Annotated, Any, cast

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from episodic import errors
from episodic.server.auth import JsonBody, KeyOf, require_operator
from episodic.server.fields import NO_NUL, DocumentValue
from episodic.server.keys import ApiKey
from episodic.server.problems import Problem
from episodic.store import EpisodicStore
from episodic.store.checks import MAX_LISTING_LENGTH

if TYPE_CHECKING:
    from episodic.integrations.claude_agent import EpisodicSessionStore

#: the most entries one append may carry (the SDK sends ~100 ms batches)
MAX_ENTRIES = 1_000
#: the longest part of a key: the project key becomes the listing name
#: ``claude-agent:<project_key>``, and listings are at most MAX_LISTING_LENGTH
KEY_PART_LENGTH = MAX_LISTING_LENGTH - len("claude-agent:")


class SessionKeyBody(BaseModel):
    """A transcript's key: the project, the session, and for a subagent's transcript its
    subpath (omitted for the main transcript)."""

    project_key: str = Field(min_length=1, max_length=KEY_PART_LENGTH, pattern=NO_NUL)
    session_id: str = Field(min_length=1, max_length=KEY_PART_LENGTH, pattern=NO_NUL)
    subpath: str | None = Field(
        default=None, min_length=1, max_length=KEY_PART_LENGTH, pattern=NO_NUL
    )

    def key(self) -> dict[str, str]:
        key = {"project_key": self.project_key, "session_id": self.session_id}
        if self.subpath is not None:
            key["subpath"] = self.subpath
        return key


class SessionEntry(BaseModel):
    """One transcript line, kept verbatim: any JSON object (a document: no NUL character)
    with a string ``type``; its ``uuid``, when it has one, is its idempotency key."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"propertyNames": {"pattern": NO_NUL}}
    )
    __pydantic_extra__: dict[str, DocumentValue] = Field(init=False)

    type: str = Field(pattern=NO_NUL)
    uuid: str | None = Field(default=None, max_length=512, pattern=NO_NUL)

    def line(self) -> dict[str, JsonValue]:
        """The entry as it came (only the fields it had)."""
        return self.model_dump(mode="json", exclude_unset=True)


class EntriesAppend(BaseModel):
    """Entries to append in order (an entry whose ``uuid`` the key holds is not stored
    again), with the caller's summary folded over them at ``at_seq`` (main transcripts)."""

    key: SessionKeyBody
    entries: list[SessionEntry] = Field(max_length=MAX_ENTRIES)
    summary: dict[str, DocumentValue] | None = None
    at_seq: int | None = Field(default=None, ge=0)


class SessionDelete(BaseModel):
    key: SessionKeyBody


class Entries(BaseModel):
    """The key's entries as appended, oldest first; null for a key never written."""

    entries: list[dict[str, JsonValue]] | None


class Summary(BaseModel):
    """The summary kept for the TypeScript SDK and the seq the session is at (both null for
    a session never written)."""

    summary: dict[str, JsonValue] | None
    at_seq: int | None


class ListedSession(BaseModel):
    session_id: str
    mtime: int = Field(description="the last write, in epoch milliseconds")


class Sessions(BaseModel):
    sessions: list[ListedSession]


class Summaries(BaseModel):
    summaries: list[dict[str, JsonValue]]


class Subkeys(BaseModel):
    subkeys: list[str]


#: a key's part, as a query parameter
KeyPart = Annotated[str, Query(min_length=1, max_length=KEY_PART_LENGTH, pattern=NO_NUL)]


def _key(
    project_key: KeyPart, session_id: KeyPart, subpath: KeyPart | None = None
) -> SessionKeyBody:
    return SessionKeyBody(project_key=project_key, session_id=session_id, subpath=subpath)


def claude_session_routes(root: EpisodicStore, key_of: KeyOf) -> APIRouter:
    Key = Annotated[ApiKey, Depends(key_of)]
    QueryKey = Annotated[SessionKeyBody, Depends(_key)]
    router = APIRouter(prefix="/v1/claude-agent", tags=["claude-agent"])

    def sessions_of(key: ApiKey) -> "EpisodicSessionStore":
        try:
            from episodic.integrations.claude_agent import EpisodicSessionStore
        except ImportError as exc:  # the extra is not installed
            raise errors.ConfigurationError(
                "the Claude Agent SDK routes need the claude-agent extra: "
                "pip install 'episodic-store[claude-agent]'"
            ) from exc
        return EpisodicSessionStore(root.for_tenant(key.tenant_id))

    @router.post(
        "/entries",
        status_code=204,
        dependencies=[JsonBody],
        responses={
            412: {
                "model": Problem,
                "description": "at_seq is not the session's seq: another append won; fold again",
            }
        },
    )
    async def claude_append_entries(key: Key, body: EntriesAppend) -> None:
        """Append a transcript's entries (``SessionStore.append``)."""
        entries: list[Any] = [entry.line() for entry in body.entries]
        await sessions_of(key).append_folded_by_caller(
            cast(Any, body.key.key()), entries, summary=body.summary, at_seq=body.at_seq
        )

    @router.get("/entries", response_model=Entries)
    async def claude_load_entries(key: Key, session: QueryKey) -> Entries:
        """The key's entries as appended (``SessionStore.load``)."""
        loaded = await sessions_of(key).load(cast(Any, session.key()))
        return Entries(entries=cast(Any, loaded))

    @router.get("/summary", response_model=Summary)
    async def claude_session_summary(key: Key, session: QueryKey) -> Summary:
        """The TypeScript SDK's summary of a main transcript and the seq it was folded at."""
        found, at_seq = await sessions_of(key).read_summary(cast(Any, session.key()))
        return Summary(summary=found, at_seq=at_seq)

    @router.get("/sessions", response_model=Sessions)
    async def claude_list_sessions(key: Key, project_key: KeyPart) -> Sessions:
        """The project's main transcripts and their last write (``listSessions``)."""
        listed = await sessions_of(key).list_sessions(project_key)
        return Sessions(sessions=[ListedSession(**cast(Any, entry)) for entry in listed])

    @router.get("/summaries", response_model=Summaries)
    async def claude_list_summaries(key: Key, project_key: KeyPart) -> Summaries:
        """The TypeScript SDK's summaries of the project's sessions
        (``listSessionSummaries``)."""
        from episodic.integrations.claude_agent import TS_SUMMARY_STATE_KEY

        found = await sessions_of(key).summaries(project_key, TS_SUMMARY_STATE_KEY)
        return Summaries(summaries=found)

    @router.get("/subkeys", response_model=Subkeys)
    async def claude_list_subkeys(
        key: Key,
        project_key: KeyPart,
        session_id: KeyPart,
    ) -> Subkeys:
        """The subpaths written under a session (``listSubkeys``)."""
        listing = {"project_key": project_key, "session_id": session_id}
        return Subkeys(subkeys=await sessions_of(key).list_subkeys(cast(Any, listing)))

    @router.post("/delete", status_code=204, dependencies=[JsonBody])
    async def claude_delete_session(key: Key, body: SessionDelete) -> None:
        """Erase the key's transcript, a main key's subagent transcripts too, each leaving
        a tombstone (``SessionStore.delete``; operator keys, as every erasure)."""
        require_operator(key, "deleting a session (an erasure)")
        await sessions_of(key).delete(cast(Any, body.key.key()))

    return router


__all__ = ["claude_session_routes"]
