"""The compaction worker in one process, on PostgreSQL and SQLite (fake summarizers only)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC
from uuid import UUID

import pytest

from episodic import EpisodicStore, Message, ToolCall, Usage
from episodic.compaction import CompactionRequest
from episodic.models import BoundaryEvent
from episodic.policy import EpisodicCompactionConfig
from episodic.summarizers import SummarizerError, SummaryResult
from episodic.worker import CompactionOptions, CompactionWorker, compact_claimed
from episodic.worker.backoff import JITTER
from tests.support import FILE_LISTING, snapshot


class ScriptedSummarizer:
    """Answers from a script: a string is a summary, an exception is raised, a callable runs
    (it may append to the conversation meanwhile)."""

    name = "scripted"

    def __init__(self, *script: object, default: object = "the summary") -> None:
        self.script = list(script)
        self.default = default
        self.requests: list[CompactionRequest] = []

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        self.requests.append(request)
        step = self.script.pop(0) if self.script else self.default
        if callable(step):
            step = await step()
        if isinstance(step, BaseException):
            raise step
        return SummaryResult(
            text=str(step), usage=Usage(input_tokens=10, output_tokens=5), model="m"
        )


async def _due_conversation(store: EpisodicStore, turns: int = 3) -> UUID:
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=turns)
    conv = await store.create_conversation()
    for turn in range(turns):
        await store.append(
            conv,
            [
                Message.user(f"request {turn}"),
                Message.assistant(None, tool_calls=[ToolCall(id=f"c{turn}", name="run")]),
                Message.tool_result(f"c{turn}", f"output {turn}:\n{FILE_LISTING}", name="run"),
                Message.assistant(f"answer {turn}"),
            ],
        )
    assert (await store.get_conversation(conv)).due_since is not None
    return conv


def _worker(store: EpisodicStore, summarizer: object, **options: object) -> CompactionWorker:
    return CompactionWorker(
        store,
        summarizer,  # type: ignore[arg-type]
        options=CompactionOptions(**options),  # type: ignore[arg-type]
        worker_id="test-worker",
    )


async def _attempts(database_url: str, conv: UUID) -> list[tuple[object, ...]]:
    rows = (await snapshot(database_url))["episodic_compaction_attempts"]
    return sorted((r for r in rows if r[0] == conv), key=lambda r: r[8])


async def test_worker_compacts_a_due_conversation(store: EpisodicStore, database_url: str) -> None:
    conv = await _due_conversation(store)
    before = await store.load_context(conv)
    summarizer = ScriptedSummarizer("Three requests answered; nothing pending.")
    [result] = await _worker(store, summarizer).run_once()
    assert result.outcome == "succeeded"
    ctx = await store.load_context(conv)
    assert ctx.boundary is not None
    assert "\nThree requests answered; nothing pending.\n" in ctx.boundary.summary
    assert ctx.boundary.reason == "unfinished_turns"
    assert ctx.boundary.usage == Usage(input_tokens=10, output_tokens=5)
    assert ctx.boundary.covers_through_seq == 12
    assert ctx.boundary.tokens_before == before.estimated_tokens
    # The pressure it was written under, from the head at the time of writing.
    assert ctx.boundary.pressure["user_messages_after_latest_run_completed"] == 3
    assert ctx.boundary.pressure["estimated_context_tokens"] == before.estimated_tokens
    assert [m.text for m in ctx.messages[1:]] == ["request 0", "request 1", "request 2"]
    head = await store.get_conversation(conv)
    assert head.due_since is None
    assert head.lease_owner is None
    [attempt] = await _attempts(database_url, conv)
    assert attempt[5] == "succeeded"  # outcome
    assert attempt[13] == ctx.boundary.seq  # boundary_seq
    assert "[tool result c0 run ok]" in summarizer.requests[0].prompt
    assert await _worker(store, summarizer).run_once() == []  # nothing due any more


async def test_a_message_appended_during_summarization_stays_in_the_tail(
    store: EpisodicStore,
) -> None:
    conv = await _due_conversation(store)

    async def user_speaks_meanwhile() -> str:
        await store.append(conv, [Message.user("wait, one more thing")])
        return "summary"

    await _worker(store, ScriptedSummarizer(user_speaks_meanwhile)).run_once()
    ctx = await store.load_context(conv)
    assert ctx.boundary is not None
    assert ctx.boundary.covers_through_seq == 12
    assert ctx.messages[-1].text == "wait, one more thing"
    assert ctx.messages[-1].seq == 13


@pytest.mark.parametrize(
    "failure",
    ["retryable_error", "timeout", "empty", "whitespace"],
)
async def test_failures_back_off_then_die_and_write_nothing(
    store: EpisodicStore, database_url: str, failure: str
) -> None:
    conv = await _due_conversation(store)
    events_before = await store.read_events(conv)

    async def hang() -> str:
        await asyncio.sleep(5)
        return "too late"

    step: object = {
        "retryable_error": SummarizerError("503", summarizer="s", retryable=True),
        "timeout": hang,
        "empty": "",
        "whitespace": "  \n ",
    }[failure]
    worker = _worker(
        store,
        ScriptedSummarizer(default=step),
        max_attempts=3,
        backoff_base=100.0,
        summarizer_timeout=0.2,
    )
    for attempt in range(1, 4):
        [result] = await worker.run_once()
        head = await store.get_conversation(conv)
        assert head.compaction_attempts == attempt
        if attempt < 3:
            assert result.outcome == "failed"
            assert head.next_attempt_at is not None
            # The delay as stored: next_attempt_at and the ledger's finished_at are the same
            # database instant (end_attempt's now()), so no test-side clock or load enters it.
            finished_at = (await _attempts(database_url, conv))[-1][8]
            if finished_at.tzinfo is None:  # SQLite stores UTC without an offset
                finished_at = finished_at.replace(tzinfo=UTC)
            delay = (head.next_attempt_at - finished_at).total_seconds()
            expected = 100.0 * 2 ** (attempt - 1)
            assert expected * (1 - JITTER) - 1e-3 <= delay <= expected * (1 + JITTER) + 1e-3
            assert result.retry_in is not None
            assert abs(delay - result.retry_in) < 1e-3  # what the worker asked for is stored
            assert await worker.run_once() == []  # not before its time
            await _make_retry_due_now(store, database_url, conv)
        else:
            assert result.outcome == "dead"
            assert head.dead_since is not None
    assert await store.read_events(conv) == events_before  # no boundary, log unchanged
    assert [row[5] for row in await _attempts(database_url, conv)] == ["failed", "failed", "dead"]
    assert all(row[6] for row in await _attempts(database_url, conv))  # every error recorded
    assert (await store.load_context(conv)).boundary is None


def _worker_lines(caplog: pytest.LogCaptureFixture, conv: UUID) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "episodic.worker" and str(conv) in r.getMessage()
    ]


@pytest.mark.parametrize("failure", ["summarizer_error", "timeout", "empty"])
async def test_failed_attempts_log_warnings_and_the_dead_state_an_error(
    store: EpisodicStore, database_url: str, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    caplog.set_level(logging.INFO, logger="episodic")
    conv = await _due_conversation(store)

    async def hang() -> str:
        await asyncio.sleep(5)
        return "too late"

    step: object = {
        "summarizer_error": SummarizerError(
            "s at http://127.0.0.1:9/v1 (model m): HTTP 503 Service Unavailable: overloaded",
            summarizer="s",
            retryable=True,
        ),
        "timeout": hang,
        "empty": "",
    }[failure]
    reason = {
        "summarizer_error": "HTTP 503 Service Unavailable",
        "timeout": "did not answer within 0.2 s",
        "empty": "returned an empty summary",
    }[failure]
    worker = _worker(
        store,
        ScriptedSummarizer(default=step),
        max_attempts=3,
        backoff_base=100.0,
        summarizer_timeout=0.2,
    )
    for attempt in range(1, 4):
        [result] = await worker.run_once()
        assert result.outcome == ("dead" if attempt == 3 else "failed")
        await _make_retry_due_now(store, database_url, conv)

    lines = _worker_lines(caplog, conv)
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING, logging.ERROR], [
        (r.levelname, r.getMessage()) for r in lines
    ]
    for attempt, line in enumerate(lines[:2], 1):
        text = line.getMessage()
        assert f"attempt {attempt} failed" in text, text
        assert "next attempt in" in text, text
        assert reason in text, text
    dead = lines[2].getMessage()
    assert "is dead after attempt 3" in dead, dead
    assert reason in dead, dead
    assert "`episodic status` lists it" in dead, dead
    # An expected failure is one line each: no traceback, from the worker or the job.
    assert all(r.exc_info is None for r in caplog.records if r.name.startswith("episodic"))
    assert all("\n" not in r.getMessage() for r in lines)


async def test_a_non_retryable_error_logs_one_error_line(
    store: EpisodicStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="episodic")
    conv = await _due_conversation(store)
    bad_key = SummarizerError(
        "s at https://api.openai.com/v1 (model m): HTTP 401 Unauthorized: bad key",
        summarizer="s",
        retryable=False,
    )
    [result] = await _worker(store, ScriptedSummarizer(bad_key)).run_once()
    assert result.outcome == "dead"
    [line] = _worker_lines(caplog, conv)
    assert line.levelno == logging.ERROR
    assert line.exc_info is None
    assert "is dead after attempt 1" in line.getMessage()
    assert "https://api.openai.com/v1 (model m): HTTP 401 Unauthorized" in line.getMessage()


async def test_an_unexpected_exception_keeps_its_traceback(
    store: EpisodicStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="episodic")
    conv = await _due_conversation(store)
    [result] = await _worker(
        store, ScriptedSummarizer(RuntimeError("a bug in the summarizer")), backoff_base=100.0
    ).run_once()
    assert result.outcome == "failed"
    traceback, outcome = _worker_lines(caplog, conv)
    assert (traceback.levelno, outcome.levelno) == (logging.ERROR, logging.WARNING)
    assert traceback.exc_info is not None  # a bug: the traceback is what to read
    assert "failed unexpectedly (attempt 1)" in traceback.getMessage()
    assert "attempt 1 failed" in outcome.getMessage()
    assert "RuntimeError: a bug in the summarizer" in outcome.getMessage()


async def test_a_success_logs_at_info(
    store: EpisodicStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="episodic")
    conv = await _due_conversation(store)
    [result] = await _worker(store, ScriptedSummarizer("fine")).run_once()
    assert result.outcome == "succeeded"
    [line] = _worker_lines(caplog, conv)
    assert line.levelno == logging.INFO
    assert "succeeded (attempt 1" in line.getMessage()


async def test_a_non_retryable_error_dies_at_once(store: EpisodicStore) -> None:
    conv = await _due_conversation(store)
    bad_key = SummarizerError("401 unauthorized", summarizer="s", retryable=False)
    [result] = await _worker(store, ScriptedSummarizer(bad_key)).run_once()
    assert result.outcome == "dead"
    assert (await store.get_conversation(conv)).dead_since is not None


async def test_fallback_writes_a_deterministic_boundary(
    store: EpisodicStore, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="episodic")
    conv = await _due_conversation(store)
    failing = SummarizerError("boom", summarizer="s", retryable=True)
    [result] = await _worker(
        store, ScriptedSummarizer(failing), max_attempts=1, fallback=True
    ).run_once()
    assert result.outcome == "fallback"
    ctx = await store.load_context(conv)
    assert ctx.boundary is not None
    assert ctx.boundary.model == "fallback:extractive"
    assert "Last assistant reply: answer 2" in ctx.boundary.summary
    # the requests are kept word for word beside it, so the excerpt does not repeat them
    assert ctx.boundary.retained == ("request 0", "request 1", "request 2")
    assert "request 2" not in ctx.boundary.summary
    assert "boom" not in ctx.boundary.summary  # an error text is never a summary
    [attempt] = await _attempts(database_url, conv)
    assert attempt[5] == "fallback"
    assert "boom" in str(attempt[6])
    [line] = _worker_lines(caplog, conv)  # the model's answer was not used: a warning
    assert line.levelno == logging.WARNING
    assert "extractive fallback" in line.getMessage()
    assert "boom" in line.getMessage()


async def test_a_late_write_after_losing_the_lease_is_refused(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await _due_conversation(store)
    [stale] = await store.claim_due("slow", limit=1, lease_seconds=0.2)
    await asyncio.sleep(0.3)  # the slow worker's lease expires
    [result] = await _worker(store, ScriptedSummarizer("fresh")).run_once()
    assert result.outcome == "succeeded"
    from episodic.worker.job import compact_claimed

    late = await compact_claimed(
        store, ScriptedSummarizer("stale"), stale, worker="slow", options=CompactionOptions()
    )
    assert late.outcome == "lease_lost"
    boundaries = [e for e in await store.read_events(conv) if isinstance(e, BoundaryEvent)]
    assert len(boundaries) == 1
    assert "\nfresh\n" in boundaries[0].summary
    outcomes = sorted(row[5] for row in await _attempts(database_url, conv))
    assert outcomes == ["lease_lost", "succeeded"]


async def test_concurrent_workers_never_compact_twice(store: EpisodicStore) -> None:
    conversations = [await _due_conversation(store) for _ in range(12)]
    workers = [
        CompactionWorker(store, ScriptedSummarizer(), concurrency=3, worker_id=f"w{i}")
        for i in range(3)
    ]
    results = await asyncio.gather(*(w.run_once() for w in workers))
    assert sum(len(r) for r in results) == 12
    for conv in conversations:
        events = await store.read_events(conv)
        assert sum(isinstance(e, BoundaryEvent) for e in events) == 1


async def test_run_stops_gracefully_and_releases_unfinished_leases(store: EpisodicStore) -> None:
    conv = await _due_conversation(store)
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    worker = CompactionWorker(
        store, ScriptedSummarizer(slow), poll_interval=0.05, shutdown_grace=0.2
    )
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), timeout=10)
    worker.stop()
    await asyncio.wait_for(running, timeout=10)
    head = await store.get_conversation(conv)
    assert head.lease_owner is None
    assert head.due_since is not None  # still due: another worker will take it
    assert not any(isinstance(e, BoundaryEvent) for e in await store.read_events(conv))


async def test_nothing_to_compact_clears_the_due_state(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await store.create_conversation(metadata={"compaction": {"trigger_context_tokens": 1}})
    # Due at once, but the only event is a call still waiting for its result: no safe cut.
    await store.append(conv, [Message.assistant(None, tool_calls=[ToolCall(id="x", name="t")])])
    assert (await store.get_conversation(conv)).due_since is not None
    summarizer = ScriptedSummarizer()
    [result] = await _worker(store, summarizer).run_once()
    assert result.outcome == "nothing_to_compact"
    assert summarizer.requests == []  # no model call for nothing
    head = await store.get_conversation(conv)
    assert head.due_since is None
    assert head.lease_owner is None
    assert [row[5] for row in await _attempts(database_url, conv)] == ["nothing_to_compact"]


async def _make_retry_due_now(store: EpisodicStore, database_url: str, conv: UUID) -> None:
    from tests.support import execute_raw

    value = "now()" if store.dialect == "postgresql" else "CURRENT_TIMESTAMP"
    await execute_raw(
        database_url,
        f"UPDATE episodic_conversations SET next_attempt_at = {value} "
        f"WHERE conversation_id = '{conv if store.dialect == 'postgresql' else conv.hex}'",
    )


async def _compact_now(
    store: EpisodicStore, conv: UUID, summarizer: object, *, require_smaller: bool = False
) -> str:
    claim = await store.claim_conversation(conv, "test-worker", lease_seconds=60)
    assert claim is not None
    result = await compact_claimed(
        store,
        summarizer,  # type: ignore[arg-type]
        claim,
        worker="test-worker",
        options=CompactionOptions(require_smaller=require_smaller),
    )
    return result.outcome


async def test_a_cascade_builds_on_the_previous_boundary_instead_of_summarizing_it(
    store: EpisodicStore,
) -> None:
    conv = await store.create_conversation()
    call = ToolCall(id="c1", name="run", args={"command": "pytest tests/test_sync.py -x"})
    await store.append(
        conv,
        [
            Message.user("The sync job posts twice; fix it."),
            Message.assistant(None, tool_calls=[call]),
            Message.tool_result(
                "c1",
                "10:00:01 INFO sync.worker request handled\n" * 40
                + "FAILED - SyncError: LEDGER-E4242\n1 failed",
                name="run",
            ),
            Message.assistant("Reproduced. Decision: a unique index, because retries slip."),
        ],
    )
    await store.mark_run_completed(conv)
    first = ScriptedSummarizer(
        "## Goal\nFix the double post.\n## Decisions\n- A unique index, because retries slip."
    )
    assert await _compact_now(store, conv, first) == "succeeded"
    await store.append(
        conv,
        [
            Message.user("Check the search log, quickly. " + "Please. " * 30),
            Message.assistant("The search log is quiet. " * 20),
        ],
    )
    await store.mark_run_completed(conv)
    second = ScriptedSummarizer("## Facts\n- The search log is quiet.")
    assert await _compact_now(store, conv, second) == "succeeded"

    prompt = second.requests[0].prompt
    assert "GOAL: Fix the double post." in prompt  # the notes so far, shown as they are
    assert "Reproduced." not in prompt  # what the first boundary covers is not sent again
    assert "LEDGER-E4242" in prompt  # the record, carried in the boundary
    context = await store.load_context(conv)
    assert context.boundary is not None
    assert context.boundary.handoff_state is not None
    handoff = context.messages[0].text
    for kept in (
        "GOAL: Fix the double post.",  # written by the first compaction, kept as written
        "DECISION: A unique index, because retries slip.",
        "FACT: The search log is quiet.",
        "`pytest tests/test_sync.py -x` -> 1 failed",  # from the log, not from a model
        "LEDGER-E4242",
    ):
        assert kept in handoff, kept
    texts = [message.text for message in context.messages]
    assert len(texts) == len(set(texts))  # no text twice in one context


async def test_a_boundary_that_would_not_make_the_context_smaller_is_not_written(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("hi"), Message.assistant("hello")])
    await store.mark_run_completed(conv)
    verbose = ScriptedSummarizer("## Facts\n" + "- a long note about very little\n" * 20)
    assert await _compact_now(store, conv, verbose, require_smaller=True) == "nothing_to_compact"
    context = await store.load_context(conv)
    assert context.boundary is None
    assert [m.text for m in context.messages] == ["hi", "hello"]
    [attempt] = await _attempts(database_url, conv)
    assert "not fewer than" in str(attempt[6])  # error: why nothing was written
