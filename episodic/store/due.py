"""When a conversation becomes due for compaction, decided from its head alone.

The Python twins of ``postgres/schema.sql``'s ``episodic_pressure`` (:func:`pressure_from`),
``episodic_trigger_config`` (:func:`trigger_config_for`), ``episodic_mark_due``
(:func:`due_marking`) and ``episodic_sweep_due`` (:func:`sweep_due_candidate`, with
:func:`due_marking`); the SQLite backend and ``store.pressure`` call them, and
tests/contract/test_twins.py checks both sides agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from episodic.errors import ValidationError
from episodic.policy import (
    EpisodicCompactionConfig,
    EpisodicCompactionPressure,
    EpisodicCompactionTrigger,
    age_in_days,
    episodic_compaction_trigger,
)
from episodic.store.checks import MAX_EXACT_JSON_INT
from episodic.store.projection import HeadCounters

#: metadata["compaction"] keys that override the store's trigger settings per conversation
#: (a model with a smaller window wants a smaller trigger_context_tokens).
OVERRIDE_KEYS = (
    "trigger_context_tokens",
    "trigger_unfinished_turns",
    "trigger_age_days",
    "trigger_age_turn_count",
)
#: The largest threshold an override may set (a JSON number's exact range).
MAX_THRESHOLD = MAX_EXACT_JSON_INT


@dataclass(frozen=True, slots=True)
class DueState:
    """The columns of a head beside its counters that decide whether it is marked due:
    whether it already is (or is dead, or deleted), when its current context began (the
    trigger's age), and its per-conversation trigger overrides (``metadata``)."""

    created_at: datetime
    boundary_at: datetime | None = None
    due_since: datetime | None = None
    dead_since: datetime | None = None
    deleted_at: datetime | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def check_overrides(metadata: Mapping[str, Any]) -> None:
    """Refuse ``metadata["compaction"]`` overrides the database could not apply."""
    overrides = metadata.get("compaction")
    if overrides is None:
        return
    if not isinstance(overrides, Mapping):
        raise ValidationError("metadata['compaction'] must be an object", field="metadata")
    for key, value in overrides.items():
        if key not in OVERRIDE_KEYS:
            raise ValidationError(
                f"unknown compaction override {key!r}; expected one of {', '.join(OVERRIDE_KEYS)}",
                field="metadata",
            )
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_THRESHOLD
        ):
            raise ValidationError(
                f"metadata['compaction'][{key!r}] must be a non-negative integer or null",
                field="metadata",
            )


#: A boundary ends any compaction in progress: the due state and the lease are cleared.
CLEARED_COMPACTION_STATE: dict[str, Any] = {
    "due_since": None,
    "due_reason": None,
    "lease_owner": None,
    "lease_token": None,
    "lease_expires_at": None,
    "compaction_attempts": 0,
    "next_attempt_at": None,
    "last_error": None,
    "dead_since": None,
}


def trigger_config_for(
    default: EpisodicCompactionConfig, metadata: Mapping[str, Any]
) -> EpisodicCompactionConfig:
    """The store's trigger settings with the conversation's overrides applied."""
    overrides = metadata.get("compaction") or {}
    changes = {k: overrides[k] for k in OVERRIDE_KEYS if overrides.get(k) is not None}
    return default.model_copy(update=changes) if changes else default


def pressure_from(
    counters: HeadCounters, *, created_at: datetime, boundary_at: datetime | None, now: datetime
) -> EpisodicCompactionPressure:
    """The pressure a head describes at ``now``. The estimate is the larger of the stored
    estimate of the current context and the latest provider-reported input tokens plus what
    was appended after them; the age is that of the current context."""
    estimate = counters.context_tokens
    if counters.usage_input_tokens is not None:
        estimate = max(estimate, counters.usage_input_tokens + counters.tokens_since_usage)
    return EpisodicCompactionPressure(
        estimated_context_tokens=estimate,
        user_messages_since_boundary=counters.user_messages_since_boundary,
        run_completed_since_boundary=counters.run_completed_since_boundary,
        user_messages_after_latest_run_completed=counters.user_messages_since_run_completed,
        conversation_age_days=age_in_days(boundary_at or created_at, now),
        total_user_messages=counters.total_user_messages,
    )


def due_reason(
    counters: HeadCounters, head: DueState, default: EpisodicCompactionConfig, now: datetime
) -> EpisodicCompactionTrigger | None:
    """Why the conversation is due now, or None."""
    pressure = pressure_from(
        counters, created_at=head.created_at, boundary_at=head.boundary_at, now=now
    )
    return episodic_compaction_trigger(pressure, trigger_config_for(default, head.metadata))


def due_marking(
    counters: HeadCounters, head: DueState, default: EpisodicCompactionConfig, now: datetime
) -> dict[str, Any]:
    """The head columns that mark the conversation due when the trigger fires on it now
    (empty when it does not, or the conversation is already due or dead)."""
    if head.due_since is not None or head.dead_since is not None:
        return {}
    reason = due_reason(counters, head, default, now)
    if reason is None:
        return {}
    return {
        "due_since": now,
        "due_reason": str(reason),
        "next_attempt_at": now,
        "compaction_attempts": 0,
        "last_error": None,
    }


def sweep_due_candidate(counters: HeadCounters, head: DueState) -> bool:
    """Whether the periodic sweep looks at this head: not due, not dead, not deleted, and
    with something after its latest boundary to compact (the sweep then marks it as
    :func:`due_marking` says). Twin of the scan's ``WHERE`` in ``episodic_sweep_due``."""
    return (
        head.due_since is None
        and head.dead_since is None
        and head.deleted_at is None
        and counters.last_seq > (counters.boundary_seq or 0)
    )


__all__ = [
    "CLEARED_COMPACTION_STATE",
    "OVERRIDE_KEYS",
    "DueState",
    "check_overrides",
    "due_marking",
    "due_reason",
    "pressure_from",
    "sweep_due_candidate",
    "trigger_config_for",
]
