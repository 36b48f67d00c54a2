"""The rules a write is held to once the conversation's state is known: the Python twins of
``episodic_append`` (:func:`append_refusal`) and ``episodic_create_conversation``
(:func:`create_conversation_outcome`) in ``postgres/schema.sql``.

Pure: the SQLite backend looks up the facts (the head, an earlier batch under the same key, a
reused client id; whether an id is taken or erased) and asks these functions; PostgreSQL runs
the same checks in the same order inside its functions. ``tests/contract/test_twins.py``
drives both with the same generated appends (and ids) and compares what they answer and the
heads they leave.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from episodic.store.backend import CreateOutcome, WriteOutcome
from episodic.store.batch import PreparedBatch


@dataclass(frozen=True, slots=True)
class PriorBatch:
    """The batch stored earlier under the append's idempotency key."""

    seq: int
    created_at: datetime
    request_hash: str | None


def append_refusal(
    batch: PreparedBatch,
    *,
    last_seq: int,
    open_tool_calls: Mapping[str, int],
    prior: PriorBatch | None,
    reused_client_id: str | None,
    abandoned_calls: Iterable[str] | None = None,
) -> WriteOutcome | None:
    """Why the append may not be written, first reason first, or None when it may.

    In order: a retry under a known key is replayed (or refused when the batch differs); a
    stale ``batch.expected_seq`` is a conflict; a client id already in the log is refused; a call id
    still open is a duplicate; a result that answers no open call is an orphan, and
    ``orphan_abandoned`` when a run completion closed that call (``abandoned_calls``: every id
    the log's run completions abandoned; only this error path needs them).
    """
    if prior is not None:
        same = prior.request_hash == batch.request_hash
        return WriteOutcome(
            "replayed" if same else "idempotency_mismatch",
            seq=prior.seq,
            created_at=prior.created_at,
        )
    if batch.expected_seq is not None and last_seq != batch.expected_seq:
        return WriteOutcome("conflict", seq=last_seq)
    if reused_client_id is not None:
        return WriteOutcome("client_id_reused", detail=reused_client_id)
    duplicate = next((i for i in batch.called_ids if i in open_tool_calls), None)
    if duplicate is not None:
        return WriteOutcome("duplicate_tool_call", detail=duplicate)
    orphan = next((i for i in batch.closed_ids if i not in open_tool_calls), None)
    if orphan is not None:
        abandoned = orphan in set(abandoned_calls or ())
        return WriteOutcome("orphan_abandoned" if abandoned else "orphan", detail=orphan)
    return None


def create_conversation_outcome(*, taken: bool, erased: bool, reuse_erased: bool) -> CreateOutcome:
    """What creating a conversation under an id comes to: ``taken`` when a conversation holds
    the id (whatever its tombstones), else ``erased`` when the id has a tombstone in the
    tenant and the caller did not ask to ``reuse_erased`` ids, else ``created``.

    Twin of ``episodic_create_conversation``: its insert ``ON CONFLICT DO NOTHING`` answers
    ``'taken'`` first, then a tombstone of the tenant raises ``EP410``, which the backend reads
    as ``erased``."""
    if taken:
        return "taken"
    if erased and not reuse_erased:
        return "erased"
    return "created"


def needs_abandoned_calls(batch: PreparedBatch, open_tool_calls: Mapping[str, int]) -> bool:
    """Whether :func:`append_refusal` would look at the abandoned calls (an orphan result)."""
    return any(i not in open_tool_calls for i in batch.closed_ids)


def abandoned_in(payloads: Sequence[Mapping[str, object]]) -> list[str]:
    """The call ids run completions abandoned, from their payloads."""
    ids: list[str] = []
    for payload in payloads:
        closed = payload.get("abandoned_tool_call_ids", ())
        if isinstance(closed, list | tuple):
            ids.extend(str(i) for i in closed)
    return ids


__all__ = [
    "PriorBatch",
    "abandoned_in",
    "append_refusal",
    "create_conversation_outcome",
    "needs_abandoned_calls",
]
