"""The compaction worker: claims due conversations and compacts them, until told to stop.

Shaped like procrastinate's worker: claims in one ``SKIP LOCKED`` statement, NOTIFY only
wakes it (polling is the fallback and the only way on SQLite), a fixed number of attempts in
flight, a periodic sweep for the age rule, and a graceful stop: no new claims, in-flight
attempts get a grace period, and any still running then are cancelled and their leases
released for another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from dataclasses import replace
from datetime import UTC, datetime
from uuid import uuid4

from episodic.errors import StorageFullError
from episodic.store import EpisodicStore
from episodic.store.attempts import AttemptEnd, AttemptRecord, Claim
from episodic.summarizers import Summarizer
from episodic.worker.backoff import backoff_delay
from episodic.worker.job import CompactionOptions, JobResult, compact_claimed
from episodic.worker.metrics import WorkerMetrics

logger = logging.getLogger("episodic.worker")


class CompactionWorker:
    """Compacts due conversations with ``summarizer``.

    ``lease_seconds`` must outlast a summarizer call (it defaults to twice the timeout plus a
    margin): a lease that expires mid-call lets another worker take over, and this one's
    write is then refused.

    A database server out of disk space (:class:`StorageFullError`) is transient: the
    attempt fails with its backoff (or, when not even the attempt can be recorded, its lease
    expires), the conversation never becomes dead for it, and the worker claims nothing
    for a backoff of its own (``backoff_base`` doubling up to ``backoff_max``, for each such
    failure in a row), so that a full disk does not cost a summarizer call for every due
    conversation in turn.
    """

    def __init__(
        self,
        store: EpisodicStore,
        summarizer: Summarizer,
        *,
        concurrency: int = 4,
        options: CompactionOptions | None = None,
        lease_seconds: float | None = None,
        poll_interval: float = 5.0,
        sweep_interval: float = 300.0,
        shutdown_grace: float = 30.0,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.store = store
        self.summarizer = summarizer
        self.concurrency = concurrency
        self.options = options or CompactionOptions()
        self.lease_seconds = lease_seconds or self.options.default_lease_seconds()
        self.poll_interval = poll_interval
        self.sweep_interval = sweep_interval
        self.shutdown_grace = shutdown_grace
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:6]}"
        self.metrics = metrics
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._in_flight: dict[asyncio.Task[JobResult], Claim] = {}
        #: failures for a full disk in a row, and until when (time.monotonic) not to claim
        self._full_disk_failures = 0
        self._paused_until = 0.0

    # ---- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once in-flight attempts end (or the grace
        period runs out)."""
        self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """Stop gracefully on SIGTERM and SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # ---- running -------------------------------------------------------------------------

    async def run_once(self) -> list[JobResult]:
        """Claim what is due now (up to ``concurrency`` at a time) and compact it all; return
        when nothing due is left. For cron-style runs and tests."""
        await self.store.mark_due_by_age()
        results: list[JobResult] = []
        while claims := await self._claim(self.concurrency):
            results += await asyncio.gather(*(self._attempt(claim) for claim in claims))
        return results

    async def run(self) -> None:
        """Work until :meth:`stop` (or SIGTERM/SIGINT with the handlers installed)."""
        close_listener = await self.store.listen_for_due(self._wake.set)
        sweeper = asyncio.create_task(self._sweep_periodically())
        logger.info(
            "worker %s started (concurrency %d, summarizer %s)",
            self.worker_id,
            self.concurrency,
            self.summarizer.name,
        )
        try:
            while not self._stopping.is_set():
                paused = self._paused_until - time.monotonic()
                if paused > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), timeout=paused)
                    continue
                free = self.concurrency - len(self._in_flight)
                claims = await self._claim(free) if free > 0 else []
                for claim in claims:
                    task = asyncio.create_task(self._attempt(claim))
                    self._in_flight[task] = claim
                    task.add_done_callback(self._finished)
                if claims and len(claims) == free:
                    continue  # there may be more: claim again as soon as a slot frees
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_interval)
        finally:
            sweeper.cancel()
            if close_listener is not None:
                await close_listener()
            await self._drain()
            logger.info("worker %s stopped", self.worker_id)

    async def _claim(self, limit: int) -> list[Claim]:
        try:
            claims = await self.store.claim_due(
                self.worker_id, limit=limit, lease_seconds=self.lease_seconds
            )
        except StorageFullError as exc:
            logger.warning("claiming failed: %s", exc)
            self._note_full_disk(True)
            return []
        except Exception:
            logger.exception("claiming failed; retrying after the poll interval")
            return []
        if self.metrics is not None:
            self.metrics.claimed.inc(len(claims))
        return claims

    async def _attempt(self, claim: Claim) -> JobResult:
        try:
            result = await compact_claimed(
                self.store, self.summarizer, claim, worker=self.worker_id, options=self.options
            )
        except StorageFullError as exc:
            # Recording the attempt needs disk space too: the lease expires and a worker tries
            # again. Expected, so no traceback: the outcome line says it all.
            error = f"{type(exc).__name__}: {exc} (the attempt could not be recorded)"
            result = JobResult("failed", error=error, storage_full=True)
        except Exception as exc:
            # The attempt could not even be recorded (the database went away while it ended):
            # the lease expires and a worker tries again; nothing was written half-way.
            logger.exception("could not finish %s; its lease will expire", claim.conversation_id)
            result = JobResult("failed", error=f"{type(exc).__name__}: {exc}")
        log_result(claim, result)
        if self.metrics is not None:
            self.metrics.observe(result)
        self._note_full_disk(result.storage_full)
        return result

    def _note_full_disk(self, storage_full: bool) -> None:
        """After a full disk, claim nothing for a backoff that grows with each such failure
        in a row; anything else ends the streak."""
        if not storage_full:
            self._full_disk_failures = 0
            return
        self._full_disk_failures += 1
        pause = backoff_delay(
            self._full_disk_failures,
            base=self.options.backoff_base,
            maximum=self.options.backoff_max,
        )
        self._paused_until = max(self._paused_until, time.monotonic() + pause)
        logger.warning(
            "the database server is out of disk space: worker %s claims nothing for %.1f s",
            self.worker_id,
            pause,
        )

    def _finished(self, task: asyncio.Task[JobResult]) -> None:
        self._in_flight.pop(task, None)
        self._wake.set()  # a slot is free

    async def _sweep_periodically(self) -> None:
        while True:
            try:
                marked = await self.store.mark_due_by_age()
                if marked:
                    logger.info("sweep marked %d conversations due by age", marked)
            except Exception:
                logger.exception("age sweep failed")
            await asyncio.sleep(self.sweep_interval)

    async def _drain(self) -> None:
        if not self._in_flight:
            return
        pending = set(self._in_flight)
        logger.info(
            "worker %s stopping: %d attempts in flight get up to %g s to finish",
            self.worker_id,
            len(pending),
            self.shutdown_grace,
        )
        _, still_running = await asyncio.wait(pending, timeout=self.shutdown_grace)
        # Take the claims now: each task removes itself from _in_flight when it ends.
        unfinished = [(task, self._in_flight[task]) for task in still_running]
        for task, _ in unfinished:
            task.cancel()
        for task, claim in unfinished:
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self._release(claim)

    async def _release(self, claim: Claim) -> None:
        now = datetime.now(UTC)
        record = AttemptRecord(
            conversation_id=claim.conversation_id,
            attempt_id=uuid4(),
            tenant_id=claim.tenant_id,
            worker=self.worker_id,
            reason=claim.reason,
            outcome="released",
            started_at=claim.claimed_at,
            finished_at=now,
            error="the worker shut down before the attempt finished",
        )
        try:
            scoped = self.store.for_tenant(claim.tenant_id)
            await scoped.end_attempt(claim, AttemptEnd(retry_in=0), replace(record))
        except Exception:
            logger.exception("could not release %s; its lease will expire", claim.conversation_id)


def log_result(claim: Claim, result: JobResult) -> None:
    """One log line per attempt, at the level its outcome deserves: INFO when all is well
    (or will be at once: a conflict is retried from the new boundary), WARNING for an attempt
    that failed (it will be retried after its backoff, or its work was discarded: a lost lease,
    or replaced: the extractive fallback), ERROR for a conversation that reached the dead state
    (no worker will try it again; ``episodic status`` lists it)."""
    conversation, attempt, seconds = claim.conversation_id, claim.attempt, result.seconds
    error = " ".join((result.error or "(no error recorded)").split())  # one line, always
    if result.outcome == "dead":
        logger.error(
            "conversation %s is dead after attempt %d (%.2f s): %s; no worker will try it "
            "again: `episodic status` lists it, `episodic compact %s` retries it",
            conversation,
            attempt,
            seconds,
            error,
            conversation,
        )
    elif result.outcome == "failed":
        retry = (
            f"next attempt in {result.retry_in:.1f} s"
            if result.retry_in is not None
            else "next attempt once its lease expires"
        )
        logger.warning(
            "conversation %s: attempt %d failed (%.2f s), %s: %s",
            conversation,
            attempt,
            seconds,
            retry,
            error,
        )
    elif result.outcome == "fallback":
        logger.warning(
            "conversation %s: attempt %d failed (%.2f s), wrote the extractive fallback "
            "boundary instead: %s",
            conversation,
            attempt,
            seconds,
            error,
        )
    elif result.outcome == "lease_lost":
        logger.warning(
            "conversation %s: attempt %d lost its lease (%.2f s), its work was discarded: %s",
            conversation,
            attempt,
            seconds,
            error,
        )
    else:
        logger.info(
            "conversation %s: %s (attempt %d, %.2f s)%s",
            conversation,
            result.outcome,
            attempt,
            seconds,
            f": {error}" if result.error else "",
        )


__all__ = ["CompactionWorker", "log_result"]
