"""Every exception episodic raises.

One root, :class:`EpisodicError`. Each class says when it is raised and carries the fields a
caller needs to act on it. Database driver errors never reach callers: the store translates
them in one place (``episodic.store.db_errors``) and re-raises one of these ``from`` the
original.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID


class EpisodicError(Exception):
    """Root of every error raised by episodic."""


class ValidationError(EpisodicError, ValueError):
    """Input was refused before anything was written: bad role, malformed content, an empty
    batch, a message over the size limit, an id that is not a UUID, and so on.

    ``field`` names the offending part of the input when there is one. When the refusal came
    from a model's own validation (``Message.user(None)``), :meth:`errors` gives pydantic's
    details, one dict per problem.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        details: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(message)
        self.field = field
        self._details = tuple(dict(detail) for detail in details)

    def errors(self) -> list[dict[str, Any]]:
        """Each problem found, as pydantic reports them (``type``, ``loc``, ``msg``, ...);
        empty when the refusal was episodic's own check."""
        return [dict(detail) for detail in self._details]


class MessageTooLargeError(ValidationError):
    """A message's encoded payload is larger than the store's ``max_message_bytes``."""

    def __init__(self, *, index: int, size: int, limit: int) -> None:
        super().__init__(
            f"message {index} of the batch is {size:,} bytes encoded, over the limit of "
            f"{limit:,} bytes (EPISODIC_MAX_MESSAGE_BYTES); store large tool output elsewhere "
            "and append a reference, or raise the limit",
            field=f"messages[{index}]",
        )
        self.index = index
        self.size = size
        self.limit = limit


class ToolPairingError(ValidationError):
    """A tool call or tool result would break call/result pairing."""

    def __init__(self, message: str, *, conversation_id: UUID, tool_call_id: str) -> None:
        super().__init__(message, field="tool_call_id")
        self.conversation_id = conversation_id
        self.tool_call_id = tool_call_id


class OrphanToolResultError(ToolPairingError):
    """A tool result answers no tool call that is still waiting for its result in this
    conversation: the id was never called, was already answered, or was closed as abandoned
    by ``mark_run_completed`` (then ``abandoned`` is true)."""

    def __init__(self, *, conversation_id: UUID, tool_call_id: str, abandoned: bool) -> None:
        why = (
            "was closed as abandoned when its run completed; a late result cannot be added"
            if abandoned
            else "matches no open tool call (never called, or already answered)"
        )
        super().__init__(
            f"tool result for call {tool_call_id!r} in conversation {conversation_id} {why}",
            conversation_id=conversation_id,
            tool_call_id=tool_call_id,
        )
        self.abandoned = abandoned


class DuplicateToolCallError(ToolPairingError):
    """A tool call id is already used by a call that still waits for its result (or twice in
    one batch), so a result could not tell which call it answers."""

    def __init__(self, *, conversation_id: UUID, tool_call_id: str) -> None:
        super().__init__(
            f"tool call id {tool_call_id!r} is already used by a call in conversation "
            f"{conversation_id} that still waits for its result; tool call ids must be unique "
            "among open calls",
            conversation_id=conversation_id,
            tool_call_id=tool_call_id,
        )


class UnsafeCutError(ValidationError):
    """A boundary would cut between a tool call and its result, or outside the log: the
    summary would orphan a result (providers refuse that history) or cover nothing new."""

    def __init__(self, message: str, *, conversation_id: UUID, covers_through_seq: int) -> None:
        super().__init__(message, field="covers_through_seq")
        self.conversation_id = conversation_id
        self.covers_through_seq = covers_through_seq


class NotPinnedError(ValidationError):
    """An unpin names a seq that is not a pinned user message of the conversation (no event
    there, another kind of event, or a message appended without ``pinned``)."""

    def __init__(self, message: str, *, conversation_id: UUID, seq: int) -> None:
        super().__init__(message, field="seq")
        self.conversation_id = conversation_id
        self.seq = seq


class NotFoundError(EpisodicError, LookupError):
    """The conversation does not exist (or is not visible to this tenant)."""

    def __init__(self, conversation_id: UUID) -> None:
        super().__init__(
            f"conversation {conversation_id} does not exist, or is not visible to this store "
            "(another tenant's, or a database role held to one tenant used without "
            "store.for_tenant()); create it with store.create_conversation() first"
        )
        self.conversation_id = conversation_id


class ConversationDeletedError(NotFoundError):
    """The conversation was deleted (:meth:`EpisodicStore.delete_conversation`): it takes no
    more writes and loads as not found; its log is kept for an audit or an erasure."""

    def __init__(self, conversation_id: UUID) -> None:
        EpisodicError.__init__(
            self,
            f"conversation {conversation_id} was deleted: it takes no more writes and cannot "
            "be loaded (store.read_events still reads its log); start a new conversation",
        )
        self.conversation_id = conversation_id


class ConflictError(EpisodicError):
    """Lost an optimistic-concurrency race: the conversation moved on since the caller looked.

    Raised by ``append(expected_seq=...)`` when the last seq differs, by ``write_boundary``
    when a newer boundary exists, and by ``create_conversation`` when the id is taken. Nothing
    was written; re-read and decide again. The store never retries a conflict itself.
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: UUID,
        expected_seq: int | None = None,
        actual_seq: int | None = None,
    ) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq


class ErasedConversationError(ConflictError):
    """The id belongs to a conversation that was erased (:meth:`EpisodicStore.erase_conversation`):
    it is not re-created by accident. Pass ``reuse_erased_id=True`` to start a new, empty
    conversation under it."""

    def __init__(self, conversation_id: UUID) -> None:
        super().__init__(
            f"conversation {conversation_id} was erased; an erased id is not re-created "
            "unless you say so: pass reuse_erased_id=True (reuse_erased_ids=True to an import) "
            "to start a new conversation under it",
            conversation_id=conversation_id,
        )


class IdempotencyMismatchError(EpisodicError):
    """An idempotency key (or a client message id) was reused for a different payload.

    Re-sending the exact same batch with the same key returns the first result; this error
    means the retry is not the same request, which is almost always a client bug.
    """

    def __init__(self, message: str, *, conversation_id: UUID, key: str) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.key = key


class TenantDeniedError(EpisodicError, PermissionError):
    """The conversation belongs to another tenant than the one the store is scoped to."""

    def __init__(self, message: str, *, tenant_id: str | None = None) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id


class ErasureDeniedError(EpisodicError, PermissionError):
    """The database role may not erase: only members of ``episodic_eraser`` (and the tables'
    owner) may. Nothing was erased."""


class AuthenticationError(EpisodicError):
    """The HTTP request carried no API key, or one that is unknown or revoked. Nothing was
    read or written."""


class OperatorRequiredError(EpisodicError, PermissionError):
    """The API key is a tenant's, and the operation is an operator's (every tenant's
    compaction status, compacting now): use a key made with ``episodic keys create
    --operator``."""


class UnsupportedMediaTypeError(ValidationError):
    """The HTTP request's body is not JSON (its ``Content-Type`` is another type): send
    ``Content-Type: application/json``. Nothing was written."""


class ApiKeyNotFoundError(EpisodicError, LookupError):
    """No API key has this id (``episodic keys list`` shows them)."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"no API key has the id {key_id!r} (episodic keys list shows them)")
        self.key_id = key_id


class ImportFormatError(ValidationError):
    """An export file that cannot be imported as it is: not an episodic export, an unknown
    format version, truncated, reordered or duplicated lines, a checksum or a head that does
    not match its log. ``line`` is the 1-based line of the file where it was found; nothing
    was written for the conversation being imported."""

    def __init__(self, message: str, *, line: int) -> None:
        super().__init__(f"line {line}: {message}", field="lines")
        self.line = line


class LeaseLostError(EpisodicError):
    """A compaction worker's lease expired or was taken over before it wrote its boundary;
    the write was refused so a boundary is never written twice."""

    def __init__(self, message: str, *, conversation_id: UUID) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id


class TransientDatabaseError(EpisodicError):
    """The database connection dropped or the server refused service for a moment. The
    outcome of a write may be unknown: retry it with the same idempotency key."""


class LockTimeoutError(TransientDatabaseError):
    """A statement waited longer than ``lock_timeout_ms`` for a row another session held (a
    long transaction outside episodic, usually). Nothing was written; retry later."""


class DatabaseUnavailableError(TransientDatabaseError):
    """The store could not connect to its database: a wrong host or port, a server that is
    down or refuses connections, a database that does not exist, an unknown role or a wrong
    password, a SQLite file that cannot be opened. The message says what to check; ``url``
    is the database URL with its password masked. Retrying helps only when the server was
    merely down."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class StorageFullError(TransientDatabaseError):
    """The database server ran out of disk space for episodic's tables (PostgreSQL's
    SQLSTATE 53100 ``disk_full``, SQLite's "database or disk is full"). The write was
    rolled back, so nothing of it was stored. Appends resume by themselves once space is
    freed on the server's data volume: retry later (with the same idempotency key), not in
    a tight loop. The compaction worker treats it as transient: it backs off and never
    marks a conversation dead for it."""


class OverloadedError(EpisodicError):
    """``episodic serve`` already had ``limit`` requests in flight (its
    ``EPISODIC_SERVER_MAX_INFLIGHT``) and none ended within its queue timeout: the request
    was refused before it began, so nothing was written. Retry after ``retry_after``
    seconds; a client that keeps being refused needs a server with more workers or a larger
    pool."""

    def __init__(self, *, limit: int, retry_after: int) -> None:
        super().__init__(
            f"the server is at its limit of {limit} requests in flight; nothing was done: "
            f"retry in {retry_after} s (the answer's Retry-After)"
        )
        self.limit = limit
        self.retry_after = retry_after


class ConfigurationError(EpisodicError):
    """The store or an optional component is not set up right: an unsupported database URL,
    a bad setting, a missing optional dependency."""


class CompactionUnavailableError(ConfigurationError):
    """A "compact now" was asked of a server that has no summarizer (its
    ``EPISODIC_SUMMARIZER*`` settings did not make one); the worker compacts as usual.
    Nothing was written."""


class SchemaNotMigratedError(ConfigurationError):
    """The database has no episodic schema, or an older (or newer) revision than this
    version of episodic needs: run ``episodic migrate`` (or upgrade episodic). ``revision``
    is the database's revision (None when there is no schema), ``expected`` the one needed."""

    def __init__(self, message: str, *, revision: str | None, expected: str | None) -> None:
        super().__init__(message)
        self.revision = revision
        self.expected = expected


class IntegrityViolationError(EpisodicError):
    """The database refused a write with a constraint episodic's own checks did not expect
    (a row changed outside episodic, usually). Nothing was written; ``constraint`` names the
    constraint when the database said which."""

    def __init__(self, message: str, *, constraint: str | None = None) -> None:
        super().__init__(message)
        self.constraint = constraint


__all__ = [
    "ApiKeyNotFoundError",
    "AuthenticationError",
    "CompactionUnavailableError",
    "ConfigurationError",
    "ConflictError",
    "ConversationDeletedError",
    "DatabaseUnavailableError",
    "DuplicateToolCallError",
    "EpisodicError",
    "ErasedConversationError",
    "ErasureDeniedError",
    "IdempotencyMismatchError",
    "ImportFormatError",
    "IntegrityViolationError",
    "LeaseLostError",
    "LockTimeoutError",
    "MessageTooLargeError",
    "NotFoundError",
    "NotPinnedError",
    "OperatorRequiredError",
    "OrphanToolResultError",
    "OverloadedError",
    "SchemaNotMigratedError",
    "StorageFullError",
    "TenantDeniedError",
    "ToolPairingError",
    "TransientDatabaseError",
    "UnsafeCutError",
    "UnsupportedMediaTypeError",
    "ValidationError",
]
