"""Deciding a boundary write, shared by both backends.

The backend locks the head, reads the events after the requested cut, and hands them here;
this checks the write is still valid (expected boundary, lease, safe cut), builds the boundary
event, and computes the head that follows. Nothing here touches the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast
from uuid import UUID

import orjson
from pydantic import JsonValue

from episodic.errors import ConflictError, LeaseLostError, UnsafeCutError, ValidationError
from episodic.models import (
    MAX_TOKEN_COUNT,
    BoundaryEvent,
    Message,
    MessageEvent,
    RetentionMode,
    StoredEvent,
    Usage,
)
from episodic.policy import EpisodicCompactionPressure
from episodic.rendering import context_token_estimate, render_transcript
from episodic.store.checks import MAX_SEQ, check_int, check_text, checked_usage
from episodic.store.codec import encode_json
from episodic.store.due import pressure_from
from episodic.store.projection import HeadCounters, HeadState
from episodic.tokens import TokenEstimator
from episodic.view import in_view

RETENTION_MODES: tuple[RetentionMode, ...] = ("recent_user_messages", "recent_turns")
#: The longest reason, model name and prompt version a boundary records.
MAX_LABEL_LENGTH = 512
#: The characters of a framework's handoff items rendered as a boundary's summary.
MAX_HANDOFF_RENDERING = 4_000


@dataclass(frozen=True, slots=True)
class BoundaryRequest:
    """What the caller of ``write_boundary`` asks for, every field checked when it is made
    (before any SQL): its type and range, and text the database can store. Raises
    :class:`ValidationError` naming the field."""

    summary: str
    covers_through_seq: int
    reason: str
    expected_boundary_seq: int | None
    #: the retained user texts (kept as a tuple)
    retained: Sequence[str] = ()
    retention: RetentionMode = "recent_user_messages"
    lease_token: UUID | None = None
    usage: Usage | None = None
    model: str | None = None
    prompt_version: str | None = None
    tokens_before: int | None = None
    #: the pressure the boundary is written under (as given, else the head's when written)
    pressure: EpisodicCompactionPressure | None = None
    #: A framework's own compaction (Responses-API items, kept as given) that the context
    #: starts with instead of the summary and retained texts; ``summary`` may then be empty
    #: (it becomes the items' rendering, for people).
    handoff_items: Sequence[Mapping[str, Any]] | None = None
    #: Write only if the log still ends at this seq (a :class:`ConflictError` otherwise): for
    #: a caller that replaces exactly what it read, as a framework's compaction does.
    expected_last_seq: int | None = None
    #: A framework's own record of what the boundary stands for, kept as given for that
    #: framework's integration to read back (Google ADK: its compaction events); episodic
    #: itself reads ``summary``.
    native_handoff: Mapping[str, Any] | None = None
    #: What the worker's next compaction builds on (``HandoffState`` as JSON), kept as given.
    handoff_state: Mapping[str, Any] | None = None
    #: ``handoff_items`` as the messages a load reads them as (made once, when checked)
    handoff_messages: tuple[Message, ...] = field(default=(), init=False, compare=False)

    def __post_init__(self) -> None:
        if self.handoff_items is not None:
            self._check_handoff_items()
        if not isinstance(self.summary, str) or not self.summary.strip():
            raise ValidationError("a boundary needs a non-empty summary", field="summary")
        encode_json(self.summary, what="summary")
        check_int(self.covers_through_seq, field="covers_through_seq", low=1, high=MAX_SEQ)
        if self.expected_boundary_seq is not None:
            check_int(
                self.expected_boundary_seq, field="expected_boundary_seq", low=0, high=MAX_SEQ
            )
        retained: object = self.retained
        if (
            isinstance(retained, str | bytes)
            or not isinstance(retained, Sequence)
            or any(not isinstance(text, str) for text in retained)
        ):
            raise ValidationError("retained must be a list of strings", field="retained")
        object.__setattr__(self, "retained", tuple(retained))
        encode_json(list(self.retained), what="retained")
        check_text(self.reason, field="reason", max_length=MAX_LABEL_LENGTH)
        if self.retention not in RETENTION_MODES:
            raise ValidationError(
                f"retention must be one of {', '.join(RETENTION_MODES)}", field="retention"
            )
        if self.lease_token is not None and not isinstance(self.lease_token, UUID):
            raise ValidationError(
                "lease_token must be the UUID of a claim (Claim.lease_token)", field="lease_token"
            )
        for field_name, label in (("model", self.model), ("prompt_version", self.prompt_version)):
            if label is not None:
                check_text(label, field=field_name, max_length=MAX_LABEL_LENGTH, min_length=0)
        if self.tokens_before is not None:
            check_int(self.tokens_before, field="tokens_before", low=0, high=MAX_TOKEN_COUNT)
        if self.pressure is not None and not isinstance(self.pressure, EpisodicCompactionPressure):
            raise ValidationError(
                "pressure must be an EpisodicCompactionPressure (store.pressure() gives one)",
                field="pressure",
            )
        if self.usage is not None:
            object.__setattr__(self, "usage", checked_usage(self.usage))
        if self.expected_last_seq is not None:
            check_int(self.expected_last_seq, field="expected_last_seq", low=0, high=MAX_SEQ)
        for name in ("native_handoff", "handoff_state"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ValidationError(f"{name} must be a JSON object", field=name)
            object.__setattr__(self, name, orjson.loads(encode_json(dict(value), what=name)))

    def _check_handoff_items(self) -> None:
        items: object = self.handoff_items
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
            raise ValidationError(
                "handoff_items must be a list of Responses-API items", field="handoff_items"
            )
        if self.retained:
            raise ValidationError(
                "retained texts go with a summary; a framework's compaction puts everything "
                "it keeps in handoff_items",
                field="retained",
            )
        # Each must read as a message, as it will on every load behind the boundary.
        messages = tuple(Message.from_responses_item(item) for item in items)
        object.__setattr__(self, "handoff_items", tuple(dict(item) for item in items))
        object.__setattr__(self, "handoff_messages", messages)
        if not isinstance(self.summary, str) or not self.summary.strip():
            rendered = render_transcript(messages) if messages else "(an empty compaction)"
            if len(rendered) > MAX_HANDOFF_RENDERING:  # for people only: the items are kept
                rendered = rendered[:MAX_HANDOFF_RENDERING] + " [...]"
            object.__setattr__(self, "summary", rendered)

    def check_size(self, max_summary_bytes: int) -> None:
        """The summary (and each handoff item) takes the place of messages in the context,
        so it is held to the limit on a message (``EPISODIC_MAX_MESSAGE_BYTES``)."""
        texts: list[tuple[str, object]] = [("summary", self.summary)]
        texts += [("handoff_items", item) for item in self.handoff_items or ()]
        texts += [
            (name, value)
            for name, value in (
                ("native_handoff", self.native_handoff),
                ("handoff_state", self.handoff_state),
            )
            if value is not None
        ]
        for field_name, value in texts:
            size = len(encode_json(value, what=field_name).encode("utf-8"))
            if size > max_summary_bytes:
                raise ValidationError(
                    f"the {field_name.replace('_', ' ')} is {size:,} bytes encoded, over the "
                    f"limit of {max_summary_bytes:,} bytes (EPISODIC_MAX_MESSAGE_BYTES); write "
                    "a shorter one, or raise the limit",
                    field=field_name,
                )


@dataclass(frozen=True, slots=True)
class BoundaryWrite:
    """The row to insert and the head to store."""

    event: BoundaryEvent
    payload: str
    counters: HeadCounters
    #: the lease the write is fenced by (None for writes outside the worker)
    lease_token: UUID | None = None


def plan_boundary(
    conversation_id: UUID,
    request: BoundaryRequest,
    head: HeadState,
    tail: Sequence[StoredEvent],
    *,
    now: datetime,
    estimator: TokenEstimator,
) -> BoundaryWrite:
    """Check the write against the locked head and the events after the cut, and build it."""
    counters = head.counters
    # The lease first: a worker that lost it learns that, whatever else changed since.
    if request.lease_token is not None and (
        head.lease_token != request.lease_token
        or head.lease_expires_at is None
        or head.lease_expires_at <= now
    ):
        raise LeaseLostError(
            f"the compaction lease on conversation {conversation_id} expired or was taken over; "
            "the boundary was not written",
            conversation_id=conversation_id,
        )
    if counters.boundary_seq != request.expected_boundary_seq:
        raise ConflictError(
            f"conversation {conversation_id} has boundary {counters.boundary_seq}, not the "
            f"expected {request.expected_boundary_seq}: a newer boundary was written meanwhile. "
            "Nothing was written; reload the context and summarize again.",
            conversation_id=conversation_id,
            expected_seq=request.expected_boundary_seq,
            actual_seq=counters.boundary_seq,
        )
    if request.expected_last_seq is not None and counters.last_seq != request.expected_last_seq:
        raise ConflictError(
            f"conversation {conversation_id} ends at seq {counters.last_seq}, not the expected "
            f"{request.expected_last_seq}: it changed since it was read. Nothing was written.",
            conversation_id=conversation_id,
            expected_seq=request.expected_last_seq,
            actual_seq=counters.last_seq,
        )
    _check_cut(conversation_id, request.covers_through_seq, counters, tail)

    handoff_items = request.handoff_items
    handoff_tokens: tuple[int, ...] = ()
    if handoff_items is not None:
        handoff_tokens = tuple(
            context_token_estimate(message, estimator) for message in request.handoff_messages
        )
        retained_tokens: tuple[int, ...] = ()
        token_estimate = sum(handoff_tokens)
    else:
        retained_tokens = tuple(
            context_token_estimate(Message.user(text), estimator) for text in request.retained
        )
        token_estimate = context_token_estimate(Message.user(request.summary), estimator)
        token_estimate += sum(retained_tokens)
    seq = counters.last_seq + 1
    draft = BoundaryEvent(
        conversation_id=conversation_id,
        seq=seq,
        created_at=now,
        token_estimate=token_estimate,
        summary=request.summary,
        covers_through_seq=request.covers_through_seq,
        retained=tuple(request.retained),
        retained_token_estimates=retained_tokens,
        retention=request.retention,
        reason=request.reason,
        # The pressure the boundary was written under: as given, else as the head shows it.
        pressure=(
            request.pressure
            or pressure_from(
                counters, created_at=head.created_at, boundary_at=head.boundary_at, now=now
            )
        ).model_dump(mode="json"),
        usage=request.usage,
        model=request.model,
        prompt_version=request.prompt_version,
        tokens_before=request.tokens_before,
        handoff_items=cast(tuple[dict[str, JsonValue], ...] | None, handoff_items),
        handoff_token_estimates=handoff_tokens,
        native_handoff=cast(dict[str, JsonValue] | None, request.native_handoff),
        handoff_state=cast(dict[str, JsonValue] | None, request.handoff_state),
    )
    after = counters.after_boundary(draft, tail)
    event = draft.model_copy(update={"tokens_after": after.context_tokens})
    return BoundaryWrite(
        event=event, payload=_payload(event), counters=after, lease_token=request.lease_token
    )


def _payload(event: BoundaryEvent) -> str:
    envelope = {"conversation_id", "seq", "created_at", "token_estimate", "kind"}
    if event.handoff_items is None:  # the worker's boundaries: no bytes for what they lack
        envelope |= {"handoff_items", "handoff_token_estimates"}
    envelope |= {
        name for name in ("native_handoff", "handoff_state") if getattr(event, name) is None
    }
    body: dict[str, Any] = event.model_dump(mode="json", exclude=envelope)
    return encode_json(body, what="boundary")


def _check_cut(
    conversation_id: UUID, covers: int, counters: HeadCounters, tail: Sequence[StoredEvent]
) -> None:
    def refuse(why: str) -> UnsafeCutError:
        return UnsafeCutError(
            f"cannot write a boundary through seq {covers} in conversation {conversation_id}: "
            f"{why}",
            conversation_id=conversation_id,
            covers_through_seq=covers,
        )

    if covers > counters.last_seq:
        raise refuse(f"the log ends at seq {counters.last_seq}")
    if covers < counters.covers_through_seq:
        raise refuse(f"the latest boundary already covers through {counters.covers_through_seq}")
    waiting = sorted(
        (seq, call_id) for call_id, seq in counters.open_tool_calls.items() if seq <= covers
    )
    if waiting:
        seq, call_id = waiting[0]
        raise refuse(
            f"tool call {call_id!r} at seq {seq} still waits for its result; cut before it, or "
            "mark_run_completed() to close it as abandoned"
        )
    called: set[str] = set()
    for event in in_view(tail):
        if not isinstance(event, MessageEvent):
            continue
        message = event.message
        called.update(call.id for call in message.tool_calls)
        if message.tool_call_id is not None:
            if message.tool_call_id not in called:
                raise refuse(
                    f"the result at seq {event.seq} answers tool call "
                    f"{message.tool_call_id!r} made before the cut"
                )
            called.discard(message.tool_call_id)


__all__ = [
    "MAX_LABEL_LENGTH",
    "RETENTION_MODES",
    "BoundaryRequest",
    "BoundaryWrite",
    "plan_boundary",
]
