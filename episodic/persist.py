"""Making an in-run compaction stick: the next request starts from it.

An agent core compacts inside one run and forgets it when the run ends. Wrapping the run's
compactor in :class:`PersistingCompactor` writes the same summary as a ``recent_turns``
boundary, so the next ``load_context`` returns exactly the history the run continued with.
"""

from __future__ import annotations

import logging
from uuid import UUID

from episodic import BoundaryRequest
from episodic.context import Context
from episodic.errors import ConflictError, UnsafeCutError
from episodic.loop import (
    CompactionContext,
    CompactionPlan,
    CompactionResult,
    Compactor,
    run_compactor,
    summary_message,
)
from episodic.models import BoundaryEvent
from episodic.policy import EpisodicCompactionTrigger
from episodic.store import EpisodicStore

logger = logging.getLogger(__name__)


class PersistingCompactor:
    """A compactor that delegates to ``inner`` (an ``LlmCompactor``, say) and persists each
    plan it returns with a summary.

    Persisting is best effort: when the plan's cut is not one the log can take (the kept user
    turn was not stored yet, a tool result in the log arrived across it, or another writer
    added a boundary meanwhile) the run still continues with its plan, nothing is written, and
    the compaction worker will summarize later.
    """

    def __init__(
        self,
        store: EpisodicStore,
        conversation_id: UUID,
        inner: Compactor,
        *,
        expected_boundary_seq: int | None,
    ) -> None:
        self._store = store
        self._conversation_id = conversation_id
        self._inner = inner
        self._expected_boundary_seq = expected_boundary_seq
        self.boundaries: list[BoundaryEvent] = []

    @classmethod
    def for_context(
        cls, store: EpisodicStore, context: Context, inner: Compactor
    ) -> PersistingCompactor:
        """A wrapper for a run that starts from ``context`` (what ``load_context`` returned)."""
        boundary = context.boundary.seq if context.boundary is not None else None
        return cls(store, context.conversation_id, inner, expected_boundary_seq=boundary)

    async def __call__(self, context: CompactionContext) -> CompactionResult:
        result = await run_compactor(self._inner, context)
        if isinstance(result, CompactionPlan) and result.summary and result.summary.strip():
            await self._persist(context, result)
        return result

    async def _persist(self, context: CompactionContext, plan: CompactionPlan) -> None:
        assert plan.summary is not None
        if plan.keep_from >= len(context.messages):
            return
        kept = context.messages[plan.keep_from]
        if kept.seq is None or kept.role != "user":
            logger.info("in-run compaction not persisted: its kept turn is not in the log yet")
            return
        try:
            boundary = await self._store.write_boundary(
                self._conversation_id,
                BoundaryRequest(
                    summary=summary_message(plan.summary).text,
                    covers_through_seq=kept.seq - 1,
                    reason=EpisodicCompactionTrigger.CONTEXT_PRESSURE,
                    usage=plan.usage,
                    retention="recent_turns",
                    expected_boundary_seq=self._expected_boundary_seq,
                ),
            )
        except (UnsafeCutError, ConflictError) as exc:
            logger.warning("in-run compaction not persisted: %s", exc)
            return
        self._expected_boundary_seq = boundary.seq
        self.boundaries.append(boundary)


__all__ = ["PersistingCompactor"]
