"""The export file: JSON lines, one conversation after another, each a header then its log.

A conversation's block is its header (``"type": "conversation"``: the format and its version,
the schema revision it was written at, the conversation's identity, its head as the log
determines it, the counts of the lines that follow and their SHA-256), then one line per
event in seq order (every kind, with its seq, timestamp, token estimate, payload and the
idempotency columns that make a retry after the move still a retry), then one line per
compaction attempt. A tenant's export ends with its shared state, a line per scope.

Every line is canonical (orjson with sorted keys), so exporting a store, importing the file
elsewhere and exporting again gives the same bytes: ``episodic export`` twice and ``cmp`` is
the check that nothing was lost. This module is pure: reading and writing lines, no database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import orjson

from episodic.errors import ImportFormatError, ValidationError
from episodic.models import EVENT_KINDS, Conversation
from episodic.store.attempts import AttemptRecord
from episodic.store.checks import MAX_LISTING_LENGTH, MAX_SEQ, check_tenant, check_text
from episodic.store.codec import utc
from episodic.store.due import check_overrides
from episodic.store.projection import COUNTER_FIELDS, HeadCounters
from episodic.store.state import check_touched_at

FORMAT = "episodic-export"
#: The version this episodic writes and the only one it reads.
VERSION = 1
#: The largest value of an integer column (token estimates, batch sizes).
MAX_INT32 = 2**31 - 1
#: The longest line an import reads: a message's limit is 1 MiB by default, a boundary holds a
#: summary and handoff items, and JSON escaping can double a text.
MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EventRow:
    """One row of ``episodic_events``, every column but the conversation and tenant."""

    seq: int
    kind: str
    created_at: datetime
    token_estimate: int
    payload: str
    usage: str | None = None
    client_id: str | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    batch_size: int | None = None

    def event_columns(self) -> tuple[int, str, datetime, int, str, str | None]:
        """The row's codec.EVENT_COLUMNS, in their order (what decode_event_row reads)."""
        return (self.seq, self.kind, self.created_at, self.token_estimate, self.payload, self.usage)


@dataclass(frozen=True, slots=True)
class HeadImage:
    """What a head holds that its log determines, as of an export: the counters, the state,
    when the current context began, and when it was deleted."""

    counters: HeadCounters
    state: dict[str, Any]
    boundary_at: datetime | None
    deleted_at: datetime | None


@dataclass(frozen=True, slots=True)
class ConversationHeader:
    """A conversation block's first line."""

    schema_revision: str
    conversation_id: UUID
    tenant_id: str
    created_at: datetime
    metadata: dict[str, Any]
    app_name: str | None
    user_id: str | None
    touched_at: float | None
    head: HeadImage
    events: int
    compaction_attempts: int
    checksum: str

    @classmethod
    def of(
        cls, head: Conversation, *, schema_revision: str, attempts: int, checksum: str
    ) -> ConversationHeader:
        return cls(
            schema_revision=schema_revision,
            conversation_id=head.conversation_id,
            tenant_id=head.tenant_id,
            created_at=head.created_at,
            metadata=dict(head.metadata),
            app_name=head.app_name,
            user_id=head.user_id,
            touched_at=head.touched_at,
            head=HeadImage(
                counters=HeadCounters(**{name: getattr(head, name) for name in COUNTER_FIELDS}),
                state=dict(head.state),
                boundary_at=head.boundary_at,
                deleted_at=head.deleted_at,
            ),
            events=head.last_seq,
            compaction_attempts=attempts,
            checksum=checksum,
        )


@dataclass(frozen=True, slots=True)
class SharedStateRow:
    """One scope of a tenant's shared state."""

    tenant_id: str
    scope: str
    state: dict[str, Any]
    updated_at: datetime


@dataclass(slots=True)
class Checksum:
    """The SHA-256 of a block: its header's fields but the checksum (canonical JSON, as
    :func:`header_fields` gives them), then its lines as written, each with its newline. So
    neither the header nor any line can change unnoticed."""

    _hash: Any = field(default_factory=hashlib.sha256)

    @classmethod
    def of_header(cls, fields: Mapping[str, Any]) -> Checksum:
        checksum = cls()
        checksum.add(_dump({k: v for k, v in fields.items() if k != "checksum"}))
        return checksum

    def add(self, line: str) -> None:
        self._hash.update(line.encode())

    def hexdigest(self) -> str:
        return "sha256:" + str(self._hash.hexdigest())


def _dump(value: Mapping[str, Any]) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() + "\n"


def _instant(value: datetime | None) -> str | None:
    return utc(value).isoformat(timespec="microseconds") if value is not None else None


def _json_text(text: str | None) -> Any:
    return orjson.loads(text) if text is not None else None


def header_fields(header: ConversationHeader) -> dict[str, Any]:
    """The header line's fields, as JSON values (its ``checksum`` is the one given)."""
    head = header.head
    counters = {name: getattr(head.counters, name) for name in COUNTER_FIELDS}
    counters["open_tool_calls"] = dict(head.counters.open_tool_calls)
    return dict(
        {
            "type": "conversation",
            "format": FORMAT,
            "version": VERSION,
            "schema_revision": header.schema_revision,
            "conversation_id": str(header.conversation_id),
            "tenant_id": header.tenant_id,
            "created_at": _instant(header.created_at),
            "metadata": header.metadata,
            "app_name": header.app_name,
            "user_id": header.user_id,
            "touched_at": header.touched_at,
            "head": {
                **counters,
                "state": head.state,
                "boundary_at": _instant(head.boundary_at),
                "deleted_at": _instant(head.deleted_at),
            },
            "events": header.events,
            "compaction_attempts": header.compaction_attempts,
            "checksum": header.checksum,
        }
    )


def header_line(header: ConversationHeader) -> str:
    return _dump(header_fields(header))


def event_line(row: EventRow) -> str:
    return _dump(
        {
            "type": "event",
            "seq": row.seq,
            "kind": row.kind,
            "created_at": _instant(row.created_at),
            "token_estimate": row.token_estimate,
            "payload": orjson.loads(row.payload),
            "usage": _json_text(row.usage),
            "client_id": row.client_id,
            "idempotency_key": row.idempotency_key,
            "request_hash": row.request_hash,
            "batch_size": row.batch_size,
        }
    )


def attempt_line(record: AttemptRecord) -> str:
    return _dump(
        {
            "type": "attempt",
            "attempt_id": str(record.attempt_id),
            "worker": record.worker,
            "reason": record.reason,
            "outcome": record.outcome,
            "error": record.error,
            "started_at": _instant(record.started_at),
            "finished_at": _instant(record.finished_at),
            "usage": record.usage,
            "model": record.model,
            "tokens_before": record.tokens_before,
            "tokens_after": record.tokens_after,
            "boundary_seq": record.boundary_seq,
        }
    )


def shared_state_line(row: SharedStateRow) -> str:
    return _dump(
        {
            "type": "shared_state",
            "tenant_id": row.tenant_id,
            "scope": row.scope,
            "state": row.state,
            "updated_at": _instant(row.updated_at),
        }
    )


# ---- reading -------------------------------------------------------------------------------


class _Fields:
    """A line's fields, each taken with its type checked; a bad one is an ImportFormatError
    naming the line and the field."""

    def __init__(self, data: dict[str, Any], line: int, what: str) -> None:
        self._data = data
        self.line = line
        self._what = what

    def fail(self, message: str) -> ImportFormatError:
        return ImportFormatError(f"{self._what}: {message}", line=self.line)

    def get(self, name: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if name not in self._data:
            raise self.fail(f"{name!r} is missing")
        value = self._data[name]
        if value is None and optional:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(f"{name!r} must be {_kind_name(kinds)}")
        if not isinstance(value, kinds):
            raise self.fail(f"{name!r} must be {_kind_name(kinds)}")
        return value

    def count(self, name: str, *, optional: bool = False, high: int = MAX_SEQ) -> Any:
        value = self.get(name, int, optional=optional)
        if value is not None and not 0 <= value <= high:
            raise self.fail(f"{name!r} must be an integer from 0 to {high:,}")
        return value

    def instant(self, name: str, *, optional: bool = False) -> datetime | None:
        text = self.get(name, str, optional=optional)
        if text is None:
            return None
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise self.fail(f"{name!r} is not an ISO 8601 timestamp") from None
        if value.tzinfo is None:
            raise self.fail(f"{name!r} has no UTC offset")
        return value.astimezone(UTC)

    def uuid(self, name: str) -> UUID:
        text = self.get(name, str)
        try:
            return UUID(text)
        except ValueError:
            raise self.fail(f"{name!r} is not a UUID") from None


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", dict: "an object", float: "a number"}
    return " or ".join(names.get(kind, kind.__name__) for kind in kinds)


def parse_line(text: str, line: int) -> dict[str, Any]:
    """One line as a JSON object with a ``type``."""
    if len(text) > MAX_LINE_BYTES:
        raise ImportFormatError(f"longer than {MAX_LINE_BYTES:,} characters", line=line)
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ImportFormatError(
            f"not JSON ({exc}); the file is truncated or not an episodic export", line=line
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ImportFormatError("not a line of an episodic export (no 'type')", line=line)
    return data


def read_header(data: dict[str, Any], line: int) -> ConversationHeader:
    """A conversation line, its format and version checked first."""
    if data.get("format") != FORMAT:
        raise ImportFormatError(f"not an {FORMAT} file (format {data.get('format')!r})", line=line)
    if data.get("version") != VERSION:
        raise ImportFormatError(
            f"format version {data.get('version')!r} is not one this episodic reads ({VERSION}); "
            "import it with the episodic that exported it, or a newer one",
            line=line,
        )
    f = _Fields(data, line, "conversation header")
    head = data.get("head")
    if not isinstance(head, dict):
        raise f.fail("'head' must be an object")
    h = _Fields(head, line, "conversation header's head")
    open_calls = h.get("open_tool_calls", dict)
    if not all(isinstance(k, str) and type(v) is int for k, v in open_calls.items()):
        raise h.fail("'open_tool_calls' must map call ids to seqs")
    counters = HeadCounters(
        **{
            name: h.count(name, optional=name in ("boundary_seq", "usage_input_tokens"))
            for name in COUNTER_FIELDS
            if name != "open_tool_calls"
        },
        open_tool_calls=open_calls,
    )
    touched = f.get("touched_at", (int, float), optional=True)
    metadata = f.get("metadata", dict)
    app_name = f.get("app_name", str, optional=True)
    user_id = f.get("user_id", str, optional=True)
    try:
        # what create_conversation would refuse (a checksum is no signature)
        tenant = f.get("tenant_id", str)
        check_tenant(tenant)
        check_overrides(metadata)
        if (app_name is None) != (user_id is None):
            raise ValidationError("app_name and user_id are given both or neither")
        if app_name is not None:
            check_text(app_name, field="app_name", max_length=MAX_LISTING_LENGTH)
            check_text(user_id, field="user_id", max_length=MAX_LISTING_LENGTH, min_length=0)
        touched_at = check_touched_at(touched)
    except ImportFormatError:
        raise
    except ValidationError as exc:
        raise f.fail(str(exc)) from None
    return ConversationHeader(
        schema_revision=f.get("schema_revision", str),
        conversation_id=f.uuid("conversation_id"),
        tenant_id=tenant,
        created_at=_required(f.instant("created_at")),
        metadata=metadata,
        app_name=app_name,
        user_id=user_id,
        touched_at=touched_at,
        head=HeadImage(
            counters=counters,
            state=h.get("state", dict),
            boundary_at=h.instant("boundary_at", optional=True),
            deleted_at=h.instant("deleted_at", optional=True),
        ),
        events=f.count("events"),
        compaction_attempts=f.count("compaction_attempts"),
        checksum=f.get("checksum", str),
    )


def _required(value: datetime | None) -> datetime:
    assert value is not None
    return value


def read_event(data: dict[str, Any], line: int) -> EventRow:
    f = _Fields(data, line, "event")
    kind = f.get("kind", str)
    if kind not in EVENT_KINDS:
        raise f.fail(f"unknown kind {kind!r}")
    payload = f.get("payload", dict)
    usage = f.get("usage", dict, optional=True)
    return EventRow(
        seq=f.count("seq"),
        kind=kind,
        created_at=_required(f.instant("created_at")),
        token_estimate=f.count("token_estimate", high=MAX_INT32),
        payload=orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode(),
        usage=(
            orjson.dumps(usage, option=orjson.OPT_SORT_KEYS).decode() if usage is not None else None
        ),
        client_id=f.get("client_id", str, optional=True),
        idempotency_key=f.get("idempotency_key", str, optional=True),
        request_hash=f.get("request_hash", str, optional=True),
        batch_size=f.count("batch_size", optional=True, high=MAX_INT32),
    )


def read_attempt(
    data: dict[str, Any], line: int, *, conversation_id: UUID, tenant_id: str
) -> AttemptRecord:
    f = _Fields(data, line, "compaction attempt")
    return AttemptRecord(
        conversation_id=conversation_id,
        attempt_id=f.uuid("attempt_id"),
        tenant_id=tenant_id,
        worker=f.get("worker", str),
        reason=f.get("reason", str),
        outcome=f.get("outcome", str),
        started_at=_required(f.instant("started_at")),
        finished_at=_required(f.instant("finished_at")),
        error=f.get("error", str, optional=True),
        usage=f.get("usage", dict, optional=True),
        model=f.get("model", str, optional=True),
        tokens_before=f.count("tokens_before", optional=True),
        tokens_after=f.count("tokens_after", optional=True),
        boundary_seq=f.count("boundary_seq", optional=True),
    )


def read_shared_state(data: dict[str, Any], line: int, *, tenant_id: str | None) -> SharedStateRow:
    f = _Fields(data, line, "shared state")
    return SharedStateRow(
        tenant_id=tenant_id if tenant_id is not None else f.get("tenant_id", str),
        scope=f.get("scope", str),
        state=f.get("state", dict),
        updated_at=_required(f.instant("updated_at")),
    )


def head_difference(expected: HeadImage, rebuilt: HeadImage) -> str | None:
    """How the head rebuilt from a block's log differs from its header's; None when equal."""
    for item in fields(HeadCounters):
        want = getattr(expected.counters, item.name)
        got = getattr(rebuilt.counters, item.name)
        if item.name == "open_tool_calls":
            want, got = dict(want), dict(got)
        if want != got:
            return f"{item.name} is {got!r} rebuilt from the log, {want!r} in the header"
    for name in ("state", "boundary_at", "deleted_at"):
        if name == "boundary_at" and expected.boundary_at is None:
            continue  # a head compacted before the column existed (revision 0002) has none
        if getattr(expected, name) != getattr(rebuilt, name):
            return (
                f"{name} is {getattr(rebuilt, name)!r} rebuilt from the log, "
                f"{getattr(expected, name)!r} in the header"
            )
    return None


__all__ = [
    "FORMAT",
    "VERSION",
    "Checksum",
    "ConversationHeader",
    "EventRow",
    "HeadImage",
    "SharedStateRow",
    "attempt_line",
    "event_line",
    "head_difference",
    "header_fields",
    "header_line",
    "parse_line",
    "read_attempt",
    "read_event",
    "read_header",
    "read_shared_state",
    "shared_state_line",
]
