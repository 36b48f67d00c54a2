"""JSON and rows: what the store writes as JSON text (:func:`encode_json`), and rows to models.
Rows become models only here, inside the store."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import UUID

import orjson
from pydantic import TypeAdapter
from pydantic_core import to_json

from episodic.errors import ValidationError
from episodic.models import (
    CONTEXT_KINDS,
    EVENT_KINDS,
    LEFT_OUT_WHEN_EMPTY,
    BoundaryEvent,
    ClearEvent,
    Conversation,
    DeletionEvent,
    ImageBlock,
    Message,
    MessageEvent,
    NativePayload,
    RawBlock,
    RetractionEvent,
    RunCompletedEvent,
    StateChange,
    StateEvent,
    StoredEvent,
    TextBlock,
    ToolCall,
    UnpinEvent,
    Usage,
    UsageEvent,
    construct_valid,
    plain_defaults,
)
from episodic.store.gc_pause import collection_paused
from episodic.store.projection import COUNTER_FIELDS, HeadCounters, HeadState


def encode_json(value: object, *, what: str, floats_checked: bool = False) -> str:
    """JSON text for the log. Unpaired surrogates and other unencodable data are refused, and
    so are NaN and infinity, which orjson would silently store as ``null``.

    ``floats_checked`` skips the search for those when validation already refused them (a
    message's fields: episodic's models refuse NaN and infinity).
    """
    try:
        encoded = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValidationError(f"{what} cannot be stored as JSON: {exc}", field=what) from exc
    # A non-finite float can only have become null: the value is searched only when the text
    # has one (or the word in a string), so most values cost one scan of their bytes.
    if not floats_checked and b"null" in encoded:
        refuse_non_finite(value, what)
    return encoded.decode()


def refuse_non_finite(value: object, path: str) -> None:
    """Raise :class:`ValidationError` naming the first NaN or infinity in ``value`` (inside
    the dicts, lists and tuples orjson encodes; its depth limit of 255 bounds the recursion),
    as ``path.key[0]``."""
    if isinstance(value, float):
        if not math.isfinite(value):
            what = "NaN" if math.isnan(value) else "infinite"
            shown = path if len(path) <= 200 else f"{path[:100]}...{path[-100:]}"
            raise ValidationError(
                f"{shown} is {what}; JSON has no NaN or infinity, so it cannot be stored",
                field=path,
            )
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, float | dict | list | tuple):
                refuse_non_finite(item, _key_path(path, key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if isinstance(item, float | dict | list | tuple):
                refuse_non_finite(item, f"{path}[{index}]")


def _key_path(path: str, key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r:.80}]"


def utc(value: datetime) -> datetime:
    """SQLite hands back naive timestamps; everything episodic stores is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def json_value(value: Any) -> Any:
    """A JSON column as Python: drivers return either decoded values or text."""
    if isinstance(value, str | bytes):
        return orjson.loads(value)
    return value


# ---- trusted construction -------------------------------------------------------------------
# Rows are read back far more often than written, and the log holds only what validation
# accepted when it was appended (strictly, from the very fields stored: store/batch.py). So a
# row becomes a model without a second validation (models.construct_valid: about 5x cheaper
# than validating). A payload format change therefore comes with a migration, and the store
# refuses to run on a database at another revision. tests/unit/test_codec.py checks this
# construction equals validation on generated messages of every shape.

#: The columns an event's row starts with, in this order: rows are read by position (the
#: backends select them so; a name lookup per column is a third of a row's reading).
EVENT_COLUMNS = ("seq", "kind", "created_at", "token_estimate", "payload", "usage")

#: Message fields a payload leaves out, at their defaults (metadata is made per message).
_MESSAGE_DEFAULTS = plain_defaults(Message)


def _block(data: dict[str, Any]) -> TextBlock | ImageBlock | RawBlock:
    kind = data["type"]
    if kind == "text":
        return construct_valid(TextBlock, {"type": "text", "text": data["text"]})
    if kind == "image":
        return construct_valid(
            ImageBlock,
            {
                "type": "image",
                "url": data["url"],
                "detail": data.get("detail"),
                "alt": data.get("alt"),
            },
        )
    return construct_valid(RawBlock, {"type": "raw", "data": data["data"]})


def _tool_call(data: dict[str, Any]) -> ToolCall:
    return construct_valid(
        ToolCall,
        {
            "id": data["id"],
            "name": data["name"],
            "args": data.get("args", {}),
            "arguments_json": data.get("arguments_json"),
        },
    )


_MESSAGE_FIELDS = set(Message.model_fields)
_new = object.__new__
_set = object.__setattr__


def message_from_payload(
    body: dict[str, Any], seq: int | None, created_at: datetime | None, token_estimate: int
) -> Message:
    """A stored message's payload (``Message.stored_fields``) as the message it was, with the
    fields the store sets. (``construct_valid`` written out: this runs once per loaded
    message, the most frequent call of a load.)"""
    values = {**_MESSAGE_DEFAULTS, **body}
    if values["content"].__class__ is list:
        values["content"] = tuple(_block(block) for block in values["content"])
    if values["tool_calls"]:
        values["tool_calls"] = tuple(_tool_call(call) for call in values["tool_calls"])
    if values["native"] is not None:
        values["native"] = construct_valid(NativePayload, values["native"])
    if "metadata" not in values:
        values["metadata"] = {}
    values["seq"] = seq
    values["created_at"] = created_at
    values["token_estimate"] = token_estimate
    message: Message = _new(Message)
    _set(message, "__dict__", values)
    _set(message, "__pydantic_fields_set__", _MESSAGE_FIELDS)
    _set(message, "__pydantic_extra__", None)
    _set(message, "__pydantic_private__", None)
    return message


def _usage(text: str | None) -> Usage | None:
    return construct_valid(Usage, orjson.loads(text)) if text is not None else None


def decode_event(
    conversation_id: UUID,
    *,
    seq: int,
    kind: str,
    created_at: datetime,
    token_estimate: int,
    payload: str,
    usage: str | None,
) -> StoredEvent:
    """One ``episodic_events`` row as a stored event model (trusted: see above)."""
    body = orjson.loads(payload)
    created = utc(created_at)
    if kind == "message":
        message = message_from_payload(body, seq, created, token_estimate)
        return construct_valid(
            MessageEvent,
            {
                "conversation_id": conversation_id,
                "seq": seq,
                "created_at": created,
                "token_estimate": token_estimate,
                "kind": "message",
                "message": message,
                "usage": _usage(usage),
            },
        )
    if kind == "run_completed":
        return construct_valid(
            RunCompletedEvent,
            {
                "conversation_id": conversation_id,
                "seq": seq,
                "created_at": created,
                "token_estimate": token_estimate,
                "kind": "run_completed",
                "abandoned_tool_call_ids": tuple(body.get("abandoned_tool_call_ids", ())),
            },
        )
    envelope = {
        "conversation_id": conversation_id,
        "seq": seq,
        "created_at": created,
        "token_estimate": token_estimate,
    }
    if kind == "retraction":
        return construct_valid(
            RetractionEvent,
            {**envelope, "kind": "retraction", "retracted_seq": body["retracted_seq"]},
        )
    if kind == "clear":
        return construct_valid(ClearEvent, {**envelope, "kind": "clear"})
    if kind == "usage":
        return construct_valid(
            UsageEvent, {**envelope, "kind": "usage", "usage": construct_valid(Usage, body)}
        )
    if kind == "state":
        change = construct_valid(
            StateChange,
            {"conversation": body.get("conversation", {}), "shared": body.get("shared", {})},
        )
        return construct_valid(StateEvent, {**envelope, "kind": "state", "change": change})
    if kind == "deletion":
        return construct_valid(DeletionEvent, {**envelope, "kind": "deletion"})
    if kind == "unpin":
        return construct_valid(
            UnpinEvent, {**envelope, "kind": "unpin", "unpinned_seq": body["unpinned_seq"]}
        )
    return boundary_from_payload(body, conversation_id, seq, created, token_estimate)


#: Boundary fields a payload of an earlier revision may lack, at their defaults (pressure is
#: made per boundary).
_BOUNDARY_DEFAULTS = plain_defaults(BoundaryEvent)
_BOUNDARY_FIELDS = set(BoundaryEvent.model_fields)


def boundary_from_payload(
    body: dict[str, Any], conversation_id: UUID, seq: int, created_at: datetime, token_estimate: int
) -> BoundaryEvent:
    """A stored boundary's payload (its ``model_dump(mode="json")`` less the envelope) as the
    event it was (trusted: see above). Every load behind a boundary reads one, so validating
    it again was a fixed ~30 µs of each such load."""
    values = {**_BOUNDARY_DEFAULTS, **{k: v for k, v in body.items() if k in _BOUNDARY_FIELDS}}
    values["retained"] = tuple(values["retained"])
    values["retained_token_estimates"] = tuple(values["retained_token_estimates"])
    values["handoff_token_estimates"] = tuple(values["handoff_token_estimates"])
    if values["handoff_items"] is not None:
        values["handoff_items"] = tuple(values["handoff_items"])
    if "pressure" not in values:
        values["pressure"] = {}
    if values["usage"] is not None:
        values["usage"] = construct_valid(Usage, values["usage"])
    values["conversation_id"] = conversation_id
    values["seq"] = seq
    values["created_at"] = created_at
    values["token_estimate"] = token_estimate
    values["kind"] = "boundary"
    return construct_valid(BoundaryEvent, values)


class StoredMessage:
    """A message of the log as a load read it, no model made: the payload text as stored,
    with the fields composing a context looks at (``context._paired``: role, the call ids,
    the text of an assistant turn without calls). A server answering in episodic's own
    format splices the store's three fields into the stored text (:meth:`episodic_json`)
    where a model would be built from the payload and serialized back into the same JSON:
    on a 200-message load that was half the server's time (py-spy under wrk, issue 35).
    :meth:`message` is the model, for anything else."""

    __slots__ = (
        "_created_json",
        "body",
        "created_at",
        "payload",
        "role",
        "seq",
        "token_estimate",
        "tool_call_id",
        "tool_calls",
    )

    def __init__(
        self, payload: str, seq: int, created_at: datetime, created_json: str, token_estimate: int
    ) -> None:
        body: dict[str, Any] = orjson.loads(payload)
        self.payload = payload
        self.body = body
        self.seq = seq
        self.created_at = created_at
        self._created_json = created_json
        self.token_estimate = token_estimate
        self.role: str = body["role"]
        self.tool_call_id: str | None = body.get("tool_call_id")
        calls = body.get("tool_calls")
        # what pairing reads of a call (its id, and its name for a synthetic result)
        self.tool_calls = (
            tuple(CallRef(call["id"], call["name"]) for call in calls) if calls else ()
        )

    @property
    def text(self) -> str:
        """:attr:`Message.text`: a text content is itself; blocks are joined by the model."""
        content = self.body.get("content")
        if content is None:
            return ""
        if content.__class__ is str:
            return str(content)
        return self.message().text

    def message(self) -> Message:
        return message_from_payload(self.body, self.seq, self.created_at, self.token_estimate)

    def episodic_json(self) -> str:
        """The message's JSON in episodic's format (its model dumped without nulls): the
        stored text, which is the model's stored fields, with the fields the store sets in
        front and the fields a payload leaves out when empty at their defaults. A payload
        not in that form (an import keeps a file's payload as the file had it: nulls, keys
        no field has) is dumped from its model instead."""
        body = self.body
        if not _spliceable(body):
            return MESSAGE_ADAPTER.dump_json(self.message(), exclude_none=True).decode()
        empty = (
            _ALL_EMPTY_JSON
            if body.keys().isdisjoint(LEFT_OUT_WHEN_EMPTY)
            else "".join(json for key, json in _EMPTY_FIELDS_JSON if key not in body)
        )
        return (
            f'{{"seq":{self.seq},"created_at":{self._created_json},'
            f'"token_estimate":{self.token_estimate},{empty}{self.payload[1:]}'
        )


def _spliceable(body: dict[str, Any]) -> bool:
    """``body`` is a message's stored fields as the store writes them: only message fields
    the store does not set, and no nulls at the top or in a block or a call (which the
    model's dump would leave out)."""
    if not body.keys() <= _PAYLOAD_FIELDS or None in body.values():
        return False
    content = body.get("content")
    if content.__class__ is list and any(
        None in block.values() for block in content if isinstance(block, dict)
    ):
        return False
    calls = body.get("tool_calls")
    return not calls or not any(None in call.values() for call in calls if isinstance(call, dict))


#: the fields a stored payload may hold: the message's, less those the store sets
_PAYLOAD_FIELDS = frozenset(Message.model_fields) - {"seq", "created_at", "token_estimate"}
#: a message's JSON (``dump_json``), for what is not spliced
MESSAGE_ADAPTER = TypeAdapter(Message)


class CallRef(NamedTuple):
    """A stored call as pairing reads it (``context._paired``)."""

    id: str
    name: str


#: each field a payload leaves out when empty, as ``"name":default,`` (the model's dump)
_EMPTY_FIELDS_JSON = tuple(
    (key, f'"{key}":{to_json(_MESSAGE_DEFAULTS.get(key, {})).decode()},')
    for key in LEFT_OUT_WHEN_EMPTY
)
_ALL_EMPTY_JSON = "".join(json for _, json in _EMPTY_FIELDS_JSON)


@dataclass(frozen=True, slots=True)
class Tail:
    """What ``load_context`` reads: the head's position, the latest boundary, the stored
    messages after its cut (in seq order) and, when asked for, every event after the cut.
    Read ``stored``, the messages are :class:`StoredMessage` views, in ``stored`` (and
    ``messages`` is empty)."""

    last_seq: int
    boundary_seq: int | None
    boundary: BoundaryEvent | None
    messages: list[Message]
    events: list[StoredEvent] | None
    stored: list[StoredMessage] | None = None


def decode_tail(
    conversation_id: UUID,
    rows: Iterable[Sequence[Any]],
    *,
    last_seq: int,
    boundary_seq: int | None,
    with_events: bool,
    stored: bool = False,
) -> Tail:
    """The rows after the cut, each starting with the :data:`EVENT_COLUMNS`, except that
    ``created_at`` is in seconds since the epoch (see :func:`instant`). Without
    ``with_events`` only messages are built: load_context needs no events, and a large load
    spends most of its time making objects. ``stored`` (not with ``with_events``): no
    message models at all, :class:`StoredMessage` views instead."""
    if stored and with_events:
        raise ValueError("a tail is read with its events or as stored messages, not both")
    messages: list[Message] = []
    views: list[StoredMessage] | None = [] if stored else None
    events: list[StoredEvent] | None = [] if with_events else None
    boundary: BoundaryEvent | None = None
    loads = orjson.loads
    # A batch's events share their created_at: one datetime for each run of equal instants.
    seconds: float | None = None
    created = _EPOCH
    created_json = ""
    retracted: set[int] = set()
    with collection_paused():
        for row in rows:
            kind = row[1]
            if events is None and kind in _NOT_IN_CONTEXT:
                # A retraction always comes after the message it takes back (the newest in
                # view then): note its target, and drop the target at the end.
                if kind == "retraction":
                    retracted.add(loads(row[4])["retracted_seq"])
                continue
            if row[2] != seconds:
                seconds = row[2]
                created = instant(row[2])
                if views is not None:
                    created_json = to_json(created).decode()
            if views is not None and kind == "message":
                views.append(StoredMessage(row[4], row[0], created, created_json, row[3]))
                continue
            if events is None and kind == "message":
                messages.append(message_from_payload(loads(row[4]), row[0], created, row[3]))
                continue
            event = decode_event(
                conversation_id,
                seq=row[0],
                kind=kind,
                created_at=created,
                token_estimate=row[3],
                payload=row[4],
                usage=row[5],
            )
            if isinstance(event, MessageEvent):
                messages.append(event.message)
            elif isinstance(event, BoundaryEvent) and event.seq == boundary_seq:
                boundary = event
            elif isinstance(event, RetractionEvent):
                retracted.add(event.retracted_seq)
            if events is not None:
                events.append(event)
    if retracted:
        messages = [message for message in messages if message.seq not in retracted]
        if views is not None:
            views = [view for view in views if view.seq not in retracted]
    return Tail(last_seq, boundary_seq, boundary, messages, events, views)


#: Kinds a context has no message for: load_context skips their rows (a retraction's target
#: is noted first). A clear is never in a tail: it is the cut.
_NOT_IN_CONTEXT = frozenset(EVENT_KINDS) - CONTEXT_KINDS


_EPOCH = datetime.fromtimestamp(0, UTC)
_from_seconds = datetime.fromtimestamp


def instant(seconds: float) -> datetime:
    """The UTC datetime ``seconds`` after the epoch, to the microsecond. A load reads
    timestamps so (PostgreSQL's ``date_part('epoch', ...)``): the driver's own timestamptz
    decoding is a sixth of a loaded row's cost, this a fraction of it. Exact for every
    microsecond up to the year 2242, where a double's spacing reaches a microsecond
    (tests/unit/test_codec.py checks the round trip)."""
    return _from_seconds(seconds, UTC)


def epoch_seconds(value: datetime) -> float:
    """``value`` (naive means UTC) as seconds since the epoch: :func:`instant`'s inverse."""
    return utc(value).timestamp()


def decode_event_row(conversation_id: UUID, row: Sequence[Any]) -> StoredEvent:
    """An event from a row that starts with the :data:`EVENT_COLUMNS`."""
    seq, kind, created_at, token_estimate, payload, usage = row[:6]
    return decode_event(
        conversation_id,
        seq=seq,
        kind=kind,
        created_at=created_at,
        token_estimate=token_estimate,
        payload=payload,
        usage=usage,
    )


def decode_counters(row: Mapping[str, Any]) -> HeadCounters:
    """The log-derived counters of a head row."""
    values = {name: row[name] for name in COUNTER_FIELDS}
    values["open_tool_calls"] = json_value(values["open_tool_calls"])
    return HeadCounters(**values)


def decode_head_state(row: Mapping[str, Any]) -> HeadState:
    """A locked head row, as a boundary write needs it."""
    return HeadState(
        tenant_id=row["tenant_id"],
        counters=decode_counters(row),
        lease_token=row["lease_token"],
        lease_expires_at=_utc_or_none(row["lease_expires_at"]),
        created_at=utc(row["created_at"]),
        boundary_at=_utc_or_none(row["boundary_at"]),
    )


def counter_values(counters: HeadCounters) -> dict[str, Any]:
    """Head columns to store for ``counters``."""
    values = {name: getattr(counters, name) for name in COUNTER_FIELDS}
    values["open_tool_calls"] = dict(counters.open_tool_calls)
    return values


_TIMESTAMPS = (
    "boundary_at",
    "deleted_at",
    "due_since",
    "lease_expires_at",
    "next_attempt_at",
    "dead_since",
)


def decode_conversation(row: Mapping[str, Any]) -> Conversation:
    """One ``episodic_conversations`` row as a model."""
    values = {name: row[name] for name in Conversation.model_fields}
    values["created_at"] = utc(values["created_at"])
    values["metadata"] = json_value(values["metadata"])
    values["open_tool_calls"] = json_value(values["open_tool_calls"])
    values["state"] = json_value(values["state"]) if values["state"] is not None else {}
    for name in _TIMESTAMPS:
        values[name] = _utc_or_none(values[name])
    return Conversation(**values)


def _utc_or_none(value: datetime | None) -> datetime | None:
    return utc(value) if value is not None else None


__all__ = [
    "Tail",
    "counter_values",
    "decode_conversation",
    "decode_counters",
    "decode_event",
    "decode_event_row",
    "decode_head_state",
    "decode_tail",
    "encode_json",
    "json_value",
    "message_from_payload",
    "refuse_non_finite",
    "utc",
]
