"""The compaction worker."""

from episodic.worker.backoff import backoff_delay
from episodic.worker.job import CompactionOptions, EmptySummaryError, JobResult, compact_claimed
from episodic.worker.metrics import WorkerMetrics
from episodic.worker.runner import CompactionWorker

__all__ = [
    "CompactionOptions",
    "CompactionWorker",
    "EmptySummaryError",
    "JobResult",
    "WorkerMetrics",
    "backoff_delay",
    "compact_claimed",
]
