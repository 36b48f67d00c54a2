"""Export and import: a store's log as JSON lines (store/export_format.py), and back.

Export reads a conversation's head once, then pages through its events up to the head's last
seq (immutable rows, so a second pass reads the same bytes): the first pass hashes, the
second writes, and memory stays flat however long the log. Import streams a file the same
way, one conversation at a time, each inside one transaction that creates its head, writes
its events in pages, folds them into a head as it goes (projection.HeadFold) and, at the end,
keeps it only if the lines, the checksum and the rebuilt head all match the header.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from episodic.errors import ConflictError, EpisodicError, ImportFormatError, NotFoundError
from episodic.models import BoundaryEvent, ClearEvent, DeletionEvent, StateEvent, StoredEvent
from episodic.store.attempts import AttemptRecord
from episodic.store.backend import Backend, ImportSink
from episodic.store.codec import decode_event_row
from episodic.store.export_format import (
    Checksum,
    ConversationHeader,
    EventRow,
    HeadImage,
    attempt_line,
    event_line,
    head_difference,
    header_fields,
    header_line,
    parse_line,
    read_attempt,
    read_event,
    read_header,
    read_shared_state,
    shared_state_line,
)
from episodic.store.projection import HeadFold
from episodic.store.state import apply_change

#: Events per read while exporting, and per insert while importing.
PAGE = 1_000

Lines = Iterable[str] | AsyncIterable[str]


@dataclass(frozen=True, slots=True)
class ImportedConversation:
    """One conversation an import recreated (or, checking only, would recreate)."""

    conversation_id: UUID
    tenant_id: str
    events: int
    compaction_attempts: int


@dataclass(slots=True)
class ImportSummary:
    """What an import of a file did: the conversations, in file order, and the shared-state
    scopes it set."""

    conversations: list[ImportedConversation] = field(default_factory=list)
    shared_states: int = 0


# ---- export ------------------------------------------------------------------------------


async def export_conversation(
    backend: Backend, conversation_id: UUID, *, schema_revision: str
) -> AsyncIterator[str]:
    """The conversation's block, line by line (each ending in a newline)."""
    head = await backend.head(conversation_id)
    if head is None:
        raise NotFoundError(conversation_id)
    last = head.last_seq
    # Attempts written after the head was read may name a boundary past its last seq.
    attempts = [
        record
        for record in await backend.read_attempts(conversation_id)
        if record.boundary_seq is None or record.boundary_seq <= last
    ]
    header = ConversationHeader.of(
        head, schema_revision=schema_revision, attempts=len(attempts), checksum=""
    )
    fields = header_fields(header)
    checksum = Checksum.of_header(fields)
    async for line in _log_lines(backend, conversation_id, last, attempts):
        checksum.add(line)
    digest = checksum.hexdigest()
    yield header_line(replace(header, checksum=digest))
    # The rows through the head's last seq never change, unless the conversation is erased
    # (or erased and created again) between the passes: then the lines written are not the
    # ones hashed, and the export must fail rather than end in a block that cannot import.
    again = Checksum.of_header(fields)
    try:
        async for line in _log_lines(backend, conversation_id, last, attempts):
            again.add(line)
            yield line
    except NotFoundError:
        again = Checksum()
    if again.hexdigest() != digest:
        raise ConflictError(
            f"conversation {conversation_id} was erased while it was exported; what was "
            "written of it is incomplete: export again",
            conversation_id=conversation_id,
        )


async def _log_lines(
    backend: Backend, conversation_id: UUID, last_seq: int, attempts: list[AttemptRecord]
) -> AsyncIterator[str]:
    seq = 0
    while seq < last_seq:
        rows = await backend.read_event_rows(conversation_id, seq, last_seq, PAGE)
        for row in rows:
            if row.seq != seq + 1:
                raise NotFoundError(conversation_id)  # erased while it was being exported
            seq = row.seq
            yield event_line(row)
        if not rows:
            raise NotFoundError(conversation_id)
    for record in attempts:
        yield attempt_line(record)


async def export_tenant(
    backend: Backend,
    tenant_id: str,
    *,
    schema_revision: str,
    progress: Callable[[int], None] | None = None,
) -> AsyncIterator[str]:
    """Every conversation of the tenant (deleted ones too: their log is kept), then its
    shared state. ``progress`` is called with the number of conversations written so far."""
    after: UUID | None = None
    done = 0
    while True:
        page = await backend.conversation_ids(tenant_id, after, PAGE)
        for conversation_id in page:
            try:
                async for line in export_conversation(
                    backend, conversation_id, schema_revision=schema_revision
                ):
                    yield line
            except NotFoundError:
                continue  # erased since it was listed: there is nothing left to export
            done += 1
            if progress is not None:
                progress(done)
        if len(page) < PAGE:
            break
        after = page[-1]
    for row in await backend.read_shared_states(tenant_id):
        yield shared_state_line(row)


# ---- import ------------------------------------------------------------------------------


class _Reader:
    """The file's lines, numbered from 1, with one line of lookahead."""

    def __init__(self, lines: Lines) -> None:
        self._lines = _asynchronous(lines)
        self.number = 0
        self._held: tuple[str, dict[str, Any]] | None = None

    async def next(self) -> tuple[str, dict[str, Any]] | None:
        """(the line as written, its JSON); None at the end of the file. Blank lines (a
        trailing newline) are skipped."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        async for text in self._lines:
            self.number += 1
            raw = text.rstrip("\r\n")
            if raw.strip():
                return raw, parse_line(raw, self.number)
        return None

    def hold(self, item: tuple[str, dict[str, Any]]) -> None:
        self._held = item


async def _asynchronous(lines: Lines) -> AsyncIterator[str]:
    if isinstance(lines, AsyncIterable):
        async for line in lines:
            yield line
    else:
        for line in lines:
            yield line


class _Checking:
    """An import that writes nothing: the file is only read and checked."""

    async def add_events(self, rows: Any) -> None:
        return None

    async def add_attempts(self, records: Any) -> None:
        return None

    async def finish(self, head: HeadImage, touched_at: float | None) -> None:
        return None


@asynccontextmanager
async def _checking() -> AsyncIterator[ImportSink]:
    yield _Checking()


async def import_lines(
    backend: Backend,
    lines: Lines,
    *,
    tenant_id: str | None,
    reuse_erased: bool,
    check_only: bool = False,
    single: bool = False,
) -> ImportSummary:
    """Import every block of the file, each all or nothing, in order, and its shared state.
    ``tenant_id``: the tenant to import into (default: each block's own). ``single``: the
    file must hold exactly one conversation."""
    reader = _Reader(lines)
    summary = ImportSummary()
    seen: set[UUID] = set()
    while (item := await reader.next()) is not None:
        _, data = item
        line = reader.number
        kind = data["type"]
        if kind == "shared_state":
            row = read_shared_state(data, line, tenant_id=tenant_id)
            if not check_only:
                await backend.write_shared_states([row])
            summary.shared_states += 1
            continue
        if kind != "conversation":
            raise ImportFormatError(
                f"a {kind!r} line outside a conversation: lines are missing before it, "
                "duplicated or out of order, or the header before it counts fewer",
                line=line,
            )
        header = read_header(data, line)
        cid = header.conversation_id
        if cid in seen:
            raise ImportFormatError(f"conversation {cid} is in the file twice", line=line)
        seen.add(cid)
        tenant = tenant_id if tenant_id is not None else header.tenant_id
        if check_only and await backend.for_tenant(tenant).head(cid) is not None:
            raise ConflictError(f"conversation {cid} already exists", conversation_id=cid)
        sink: AbstractAsyncContextManager[ImportSink] = (
            _checking()
            if check_only
            else backend.importing(header, tenant, reuse_erased=reuse_erased)
        )
        async with sink as writer:
            await _import_block(reader, header, data, line, writer)
            if single and await reader.next() is not None:
                # one conversation, all or nothing: what follows is refused before it commits
                raise ImportFormatError(
                    "more after the conversation: import_conversation takes a file of one; "
                    "use import_conversations for a file of many",
                    line=reader.number,
                )
        summary.conversations.append(
            ImportedConversation(
                header.conversation_id, tenant, header.events, header.compaction_attempts
            )
        )
    if not summary.conversations and not summary.shared_states:
        raise ImportFormatError(
            "the file is empty: no conversation to import", line=max(reader.number, 1)
        )
    return summary


async def _import_block(
    reader: _Reader,
    header: ConversationHeader,
    header_data: dict[str, Any],
    header_line_number: int,
    sink: ImportSink,
) -> None:
    cid = header.conversation_id
    checksum = Checksum.of_header(header_data)
    fold = HeadFold()
    state: dict[str, Any] = {}
    boundary_at: datetime | None = None
    deleted_at: datetime | None = None
    page: list[EventRow] = []

    async def line_of(what: str, count: int, total: int) -> tuple[str, dict[str, Any]]:
        item = await reader.next()
        if item is None or item[1]["type"] != what:
            if item is not None:
                reader.hold(item)
            raise ImportFormatError(
                f"conversation {cid} ends after {count} of its {total} {what} lines: the "
                "file is truncated, or lines are missing or out of order",
                line=reader.number + (0 if item is not None else 1),
            )
        return item

    for seq in range(1, header.events + 1):
        raw, data = await line_of("event", seq - 1, header.events)
        row = read_event(data, reader.number)
        if row.seq != seq:
            raise ImportFormatError(
                f"event seq {row.seq} where seq {seq} was expected: lines are duplicated, "
                "missing or out of order",
                line=reader.number,
            )
        checksum.add(raw + "\n")
        try:
            event = decode_event_row(cid, row.event_columns())
            # decode_event_row trusts the log it reads; a file is checked as an append would be
            event = _validated(event)
            fold.add(event)
            if isinstance(event, StateEvent):
                apply_change(state, event.change.conversation)
        except Exception as exc:  # a payload that is not what its kind holds
            reason = str(exc) if isinstance(exc, EpisodicError) else f"{type(exc).__name__}: {exc}"
            raise ImportFormatError(
                f"event seq {seq} ({row.kind}) cannot be read: {reason}", line=reader.number
            ) from None
        if isinstance(event, BoundaryEvent | ClearEvent):
            boundary_at = event.created_at
        elif isinstance(event, DeletionEvent):
            deleted_at = event.created_at
        page.append(row)
        if len(page) == PAGE:
            await sink.add_events(page)
            page = []
    if page:
        await sink.add_events(page)
    attempts: list[AttemptRecord] = []
    for index in range(header.compaction_attempts):
        raw, data = await line_of("attempt", index, header.compaction_attempts)
        checksum.add(raw + "\n")
        attempts.append(
            read_attempt(data, reader.number, conversation_id=cid, tenant_id=header.tenant_id)
        )
        if len(attempts) == PAGE:
            await sink.add_attempts(attempts)
            attempts = []
    if attempts:
        await sink.add_attempts(attempts)
    if checksum.hexdigest() != header.checksum:
        raise ImportFormatError(
            f"conversation {cid}: its lines' checksum is {checksum.hexdigest()}, its header "
            f"says {header.checksum}: the file was changed after it was exported",
            line=header_line_number,
        )
    rebuilt = HeadImage(
        counters=fold.head, state=state, boundary_at=boundary_at, deleted_at=deleted_at
    )
    difference = head_difference(header.head, rebuilt)
    if difference is not None:
        raise ImportFormatError(
            f"conversation {cid}: the head does not match its log ({difference})",
            line=header_line_number,
        )
    await sink.finish(rebuilt, header.touched_at)


def _validated(event: StoredEvent) -> StoredEvent:
    """The event, validated as its model is when an append builds it (raises otherwise)."""
    return type(event).model_validate(event.model_dump())


__all__ = [
    "ImportSummary",
    "ImportedConversation",
    "export_conversation",
    "export_tenant",
    "import_lines",
]
