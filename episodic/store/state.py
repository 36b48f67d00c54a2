"""State beside the log: checking a :class:`~episodic.models.StateChange` before it is
written, and folding the log's state events back into the state the database keeps.

A change is appended as a ``state`` event and applied, in the same statement, to the head's
``state`` (the conversation's own) and to ``episodic_shared_state`` (the tenant's scopes):
each key given replaces the stored value. Both are projections: :func:`rebuild_state` folds a
conversation's events into its own state, :func:`rebuild_shared_state` folds many
conversations' events into the shared scopes, and a test proves both equal what is stored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from episodic.errors import ValidationError
from episodic.models import StateChange, StateEvent, StoredEvent
from episodic.store.checks import check_text
from episodic.store.codec import encode_json

#: The longest scope name (it is a key of the database's shared-state table).
MAX_SCOPE_LENGTH = 512


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """State as one read found it (:meth:`EpisodicStore.read_state`)."""

    #: the conversation's own state ({} for a read of shared scopes alone)
    conversation: dict[str, JsonValue]
    #: each shared scope asked for that has been written, by name
    shared: dict[str, dict[str, JsonValue]]
    #: where the conversation's log ended when it was read (None without a conversation)
    last_seq: int | None = None
    #: the caller's time of its latest write (:attr:`Conversation.touched_at`)
    touched_at: float | None = None


def encode_state_change(change: object, *, max_bytes: int) -> str | None:
    """The change's JSON as the log stores it, or None when it changes nothing. Raises
    :class:`ValidationError` for what is not a change, holds what the database's JSON cannot
    (a NUL character, NaN or infinity), or is over ``max_bytes`` encoded."""
    if not isinstance(change, StateChange):
        raise ValidationError("state must be an episodic.StateChange", field="state")
    for scope in change.shared:
        check_text(scope, field="state.shared", max_length=MAX_SCOPE_LENGTH)
    if not change:
        return None
    body: dict[str, Any] = {}
    if change.conversation:
        body["conversation"] = change.conversation
    shared = {scope: delta for scope, delta in change.shared.items() if delta}
    if shared:
        body["shared"] = shared
    encoded = encode_json(body, what="state")
    if "\\u0000" in encoded:  # only then is the value searched, to name where
        _refuse_nul(body, "state")
    size = len(encoded.encode("utf-8"))
    if size > max_bytes:
        raise ValidationError(
            f"the state change is {size:,} bytes encoded, over the limit of {max_bytes:,} "
            "bytes (EPISODIC_MAX_MESSAGE_BYTES); keep large values elsewhere",
            field="state",
        )
    return encoded


def check_touched_at(value: object) -> float | None:
    """A caller's timestamp: a finite number of seconds since the epoch, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(
            "touched_at must be a finite number of seconds since the epoch", field="touched_at"
        )
    return float(value)


def apply_change(state: dict[str, JsonValue], delta: Mapping[str, JsonValue]) -> None:
    """``delta`` applied to ``state`` as the database applies it (jsonb ``||``): each key
    replaces its value."""
    state.update(delta)


def rebuild_state(events: Iterable[StoredEvent]) -> dict[str, JsonValue]:
    """A conversation's own state, folded from its events, oldest first."""
    state: dict[str, JsonValue] = {}
    for event in events:
        if isinstance(event, StateEvent):
            apply_change(state, event.change.conversation)
    return state


def rebuild_shared_state(events: Iterable[StoredEvent]) -> dict[str, dict[str, JsonValue]]:
    """The shared scopes, folded from the state events of every conversation of a tenant in
    the order they were written (by ``created_at``; ties, which only writes in one
    transaction share, by conversation and seq)."""
    ordered = sorted(
        (event for event in events if isinstance(event, StateEvent)),
        key=lambda event: (event.created_at, str(event.conversation_id), event.seq),
    )
    scopes: dict[str, dict[str, JsonValue]] = {}
    for event in ordered:
        for scope, delta in event.change.shared.items():
            apply_change(scopes.setdefault(scope, {}), delta)
    return scopes


def _refuse_nul(value: object, path: str) -> None:
    """PostgreSQL's jsonb cannot hold a NUL character, in a key or a string: name the first
    place one is (orjson's depth limit, already passed, bounds the recursion)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValidationError(f"{path} holds a NUL character", field=path)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if "\x00" in key:
                raise ValidationError(f"a key in {path} holds a NUL character", field=path)
            _refuse_nul(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _refuse_nul(item, f"{path}[{index}]")


__all__ = [
    "MAX_SCOPE_LENGTH",
    "StateSnapshot",
    "apply_change",
    "check_touched_at",
    "encode_state_change",
    "rebuild_shared_state",
    "rebuild_state",
]
