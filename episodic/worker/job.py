"""One compaction attempt for one claimed conversation.

Load the context up to a safe cut, ask the summarizer (no transaction open meanwhile), then
write the boundary fenced by the lease token and the boundary the summary was built on. Every
attempt leaves exactly one row in the attempts ledger, whatever happens.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from uuid import uuid4

from episodic.compaction import (
    PROMPT_VERSION,
    CompactionConfig,
    HandoffState,
    finalize_compaction,
    prepare_compaction,
)
from episodic.context import Context, boundary_messages, compose_context, tail_messages
from episodic.errors import ConflictError, LeaseLostError, NotFoundError, StorageFullError
from episodic.models import UnpinEvent
from episodic.policy import resting_cut
from episodic.rendering import context_token_estimate
from episodic.store import EpisodicStore
from episodic.store.attempts import AttemptEnd, AttemptOutcome, AttemptRecord, Claim
from episodic.store.boundaries import BoundaryRequest
from episodic.summarizers import ExtractiveSummarizer, Summarizer, SummarizerError, SummaryResult
from episodic.worker.backoff import backoff_delay

logger = logging.getLogger("episodic.worker")


@dataclass(frozen=True, slots=True)
class CompactionOptions:
    """How the worker compacts and what it does when that fails."""

    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    summarizer_timeout: float = 120.0
    max_attempts: int = 5
    backoff_base: float = 5.0
    backoff_max: float = 600.0
    #: after the last failed attempt, write a deterministic extractive boundary instead of
    #: leaving the conversation dead
    fallback: bool = False
    #: write no boundary that would not make the context smaller (the attempt ends
    #: ``nothing_to_compact`` and says why)
    require_smaller: bool = True

    def default_lease_seconds(self) -> float:
        """A lease that outlasts a summarizer call, even one that times out."""
        return self.summarizer_timeout * 2 + 30


@dataclass(frozen=True, slots=True)
class JobResult:
    """What one attempt did. ``retry_in`` is the backoff before the next attempt, for a
    ``failed`` one."""

    outcome: AttemptOutcome
    tokens_before: int | None = None
    tokens_after: int | None = None
    error: str | None = None
    seconds: float = 0.0
    retry_in: float | None = None
    #: it failed because the database server is out of disk space (the worker then pauses
    #: its claims: see CompactionWorker)
    storage_full: bool = False


class EmptySummaryError(Exception):
    """The summarizer answered with nothing; an empty handoff is never written."""


async def compact_claimed(
    store: EpisodicStore,
    summarizer: Summarizer,
    claim: Claim,
    *,
    worker: str,
    options: CompactionOptions,
) -> JobResult:
    """Run one attempt for ``claim`` and record it. Never raises for a failed attempt: the
    outcome says what happened, and the head's due state says what happens next."""
    # The worker claims across tenants, but reads and writes only as the claim's tenant: on
    # PostgreSQL, row-level security shows the worker no other tenant's messages.
    store = store.for_tenant(claim.tenant_id)
    started = datetime.now(UTC)
    record = AttemptRecord(
        conversation_id=claim.conversation_id,
        attempt_id=uuid4(),
        tenant_id=claim.tenant_id,
        worker=worker,
        reason=claim.reason,
        outcome="failed",
        started_at=started,
        finished_at=started,
    )
    tokens_before: int | None = None
    try:
        context, tail = await store.load_context_and_tail(claim.conversation_id)
        tokens_before = context.estimated_tokens
        record = replace(record, tokens_before=tokens_before)
        covers = context.boundary.covers_through_seq if context.boundary is not None else 0
        cut = resting_cut(tail)  # never into a run still in progress
        if cut <= covers:
            return await _end(
                store, claim, record, "nothing_to_compact", AttemptEnd(clear_due=True)
            )
        # Usually the whole tail is safe to cut: then what to summarize is the context itself.
        source = (
            context
            if cut == context.last_seq
            else compose_context(
                claim.conversation_id,
                boundary=context.boundary,
                tail=tail_messages([event for event in tail if event.seq <= cut]),
                last_seq=cut,
                estimator=store.estimator,
            )
        )
        # The trigger already decided this conversation is due: summarize whatever its size.
        previous, new_from = _previous_state(source)
        if previous is not None and new_from >= len(source.messages):
            # Nothing in view came after the boundary (only events that are no messages):
            # the notes and the record already say all there is.
            return await _end(
                store, claim, record, "nothing_to_compact", AttemptEnd(clear_due=True)
            )
        prepared = prepare_compaction(
            list(source.messages),
            options.compaction.with_limits(auto_compact_token_limit=0),
            store.estimator,
            previous=previous,
            new_from=new_from,
            cut_seq=cut,
            unpinned=[event.unpinned_seq for event in tail if isinstance(event, UnpinEvent)],
        )
        if prepared is None:
            return await _end(
                store, claim, record, "nothing_to_compact", AttemptEnd(clear_due=True)
            )
        try:
            result = await asyncio.wait_for(
                summarizer.summarize(prepared.request), timeout=options.summarizer_timeout
            )
            if not result.text.strip():
                raise EmptySummaryError(f"{_who(summarizer)} returned an empty summary")
            outcome: AttemptOutcome = "succeeded"
        except (SummarizerError, TimeoutError, EmptySummaryError) as exc:
            # An expected failure: no traceback; the worker logs the outcome in one line.
            error = _describe(exc, summarizer, options)
            final = claim.attempt >= options.max_attempts or (
                isinstance(exc, SummarizerError) and not exc.retryable
            )
            if not (final and options.fallback):
                return await _fail(
                    store, claim, record, error, final=final, options=options, exc=exc
                )
            result = await ExtractiveSummarizer().summarize(prepared.request)
            result = SummaryResult(text=result.text, usage=None, model="fallback:extractive")
            record = replace(record, error=error)
            outcome = "fallback"
        finalized = finalize_compaction(prepared.plan, result.text, store.estimator)
        replacing = (
            sum(context_token_estimate(m, store.estimator) for m in finalized.messages)
            if options.require_smaller
            else 0
        )
        if options.require_smaller and replacing >= source.estimated_tokens:
            # A boundary must make the context smaller; this one would not, so it is not
            # written, and the conversation waits until it has grown further.
            why = (
                f"the handoff and retained messages would take {replacing} tokens, not fewer "
                f"than the {source.estimated_tokens} they replace; no boundary was written"
            )
            return await _end(
                store,
                claim,
                replace(record, error=why),
                "nothing_to_compact",
                AttemptEnd(clear_due=True),
            )
        record = replace(
            record,
            outcome=outcome,
            finished_at=datetime.now(UTC),
            usage=result.usage.model_dump() if result.usage is not None else None,
            model=result.model,
        )
        boundary = await store.write_boundary(
            claim.conversation_id,
            BoundaryRequest(
                summary=finalized.handoff.text,
                covers_through_seq=cut,
                retained=finalized.retained_texts,
                reason=claim.reason,
                usage=result.usage,
                model=result.model,
                expected_boundary_seq=context.boundary_seq,
                lease_token=claim.lease_token,
                prompt_version=PROMPT_VERSION,
                tokens_before=tokens_before,
                handoff_state=finalized.state.stored(),
            ),
            attempt=record,
        )
        return JobResult(
            outcome,
            tokens_before=tokens_before,
            tokens_after=boundary.tokens_after,
            error=record.error,  # for a fallback, why the summarizer's answer was not used
            seconds=(datetime.now(UTC) - started).total_seconds(),
        )
    except LeaseLostError as exc:
        return await _end(store, claim, replace(record, error=str(exc)), "lease_lost", AttemptEnd())
    except NotFoundError as exc:
        # Deleted or erased while we held it: nothing to compact, and for an erased one no
        # attempt row is written (end_attempt answers "gone" without one).
        return await _end(
            store, claim, replace(record, error=str(exc)), "gone", AttemptEnd(clear_due=True)
        )
    except ConflictError as exc:
        # Someone else wrote a boundary since we loaded: try again at once from the new one.
        return await _end(store, claim, replace(record, error=str(exc)), "conflict", AttemptEnd())
    except StorageFullError as exc:
        # The database server is out of disk space: its trouble, not this conversation's, and
        # over once someone frees space. Expected (no traceback), and never final, whatever
        # the attempt: retried after the backoff, so a long outage cannot make it dead.
        # (Recording the attempt needs space too: when that fails as well, the error leaves
        # here, and the lease's expiry is the backoff.)
        error = f"{type(exc).__name__}: {exc}"
        failed = await _fail(store, claim, record, error, final=False, options=options, exc=exc)
        return replace(failed, storage_full=True)
    except Exception as exc:  # a database failure or a bug: recorded, retried with backoff
        # Unexpected, so with its traceback; the outcome line follows from the worker.
        logger.exception(
            "compaction of %s failed unexpectedly (attempt %d)",
            claim.conversation_id,
            claim.attempt,
        )
        error = f"{type(exc).__name__}: {exc}"
        final = claim.attempt >= options.max_attempts
        return await _fail(store, claim, record, error, final=final, options=options, exc=exc)


def _previous_state(source: Context) -> tuple[HandoffState | None, int]:
    """The state the latest boundary carries for this compaction to build on, and where the
    messages after it start in ``source``; ``(None, 0)`` for a boundary without one (written
    by an older version, by hand, or a framework's own compaction), whose handoff is then
    summarized with the rest."""
    boundary = source.boundary
    if boundary is None or boundary.handoff_state is None or boundary.handoff_items is not None:
        return None, 0
    state = HandoffState.from_stored(boundary.handoff_state)
    return state, len(boundary_messages(boundary))


async def _fail(
    store: EpisodicStore,
    claim: Claim,
    record: AttemptRecord,
    error: str,
    *,
    final: bool,
    options: CompactionOptions,
    exc: BaseException,
) -> JobResult:
    if final:
        return await _end(store, claim, replace(record, error=error), "dead", AttemptEnd(dead=True))
    delay = backoff_delay(claim.attempt, base=options.backoff_base, maximum=options.backoff_max)
    if isinstance(exc, SummarizerError) and exc.retry_after is not None:
        delay = max(delay, exc.retry_after)
    return await _end(
        store, claim, replace(record, error=error), "failed", AttemptEnd(retry_in=delay)
    )


async def _end(
    store: EpisodicStore,
    claim: Claim,
    record: AttemptRecord,
    outcome: AttemptOutcome,
    end: AttemptEnd,
) -> JobResult:
    record = replace(record, outcome=outcome, finished_at=datetime.now(UTC))
    recorded = await store.end_attempt(claim, end, record)
    return JobResult(
        recorded,
        tokens_before=record.tokens_before,
        error=record.error,
        seconds=(record.finished_at - record.started_at).total_seconds(),
        retry_in=end.retry_in if recorded == "failed" else None,
    )


def _who(summarizer: Summarizer) -> str:
    """The summarizer's name, and where it sends when it says (an HTTP adapter's
    ``endpoint``)."""
    endpoint = getattr(summarizer, "endpoint", None)
    return f"{summarizer.name} at {endpoint}" if isinstance(endpoint, str) else summarizer.name


def _describe(exc: BaseException, summarizer: Summarizer, options: CompactionOptions) -> str:
    if isinstance(exc, TimeoutError):
        return (
            f"the summarizer {_who(summarizer)} did not answer within "
            f"{options.summarizer_timeout:g} s"
        )
    return f"{type(exc).__name__}: {exc}"


__all__ = ["CompactionOptions", "EmptySummaryError", "JobResult", "compact_claimed"]
