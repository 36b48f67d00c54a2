"""T8: a hypothesis state machine of the whole store, checked against an in-memory model.

Scenario. Each example is a fresh conversation (one database per test, on PostgreSQL and
SQLite) driven by rules: append a user message, an assistant message (empty and system
messages included), an assistant message with 1-3 parallel tool calls (some answered in the
same batch, ids reused once answered), tool results (possibly after a new user turn); appends
with a correct, stale or future ``expected_seq``; refused appends (orphan results, a call id
that is still open, an empty batch); retries of a keyed batch (idempotency key or first
client id) with the same batch and with a different one; ``mark_run_completed``; compaction
enqueued by the due marks (the conversation's ``trigger_unfinished_turns`` override is 3) or
forced by ``claim_conversation``; a worker step (``store.claim_due`` + ``job.compact_claimed``
with a deterministic fake summarizer, exactly what ``CompactionWorker`` runs); a crashed worker
(a claim that is then abandoned: with a 30 s lease that holds for the rest of the example, or
with a 0.02 s lease that runs out and is taken over); the short lease running out (an explicit
rule, which waits until the database no longer counts the lease as live); the crashed worker
waking up and finishing its attempt late; direct ``write_boundary`` calls at a requested cut
(safe, unsafe, or moved earlier with ``safe_cut_at_or_before``) and with a stale expected
boundary.

The model is independent of the store: its log is the list of messages the rules sent, the
run completions with the calls it expects abandoned, and the boundaries it expects; it tracks
open calls, keyed batches, the due flag and reason, the attempt counter and the lease holder.
Whether a lease holds is model state, never a clock reading, so every replay of a prefix of
steps makes the same draws (hypothesis replays prefixes while generating and shrinking): a 30 s
lease holds throughout an example; a 0.02 s lease is never observed while it may hold: it is
recorded expired by the expiry rule or at the start of the next step that claims or compacts,
each of which first waits until the database sees it expired.

Pass criteria, checked after every step (``invariant``): the database log equals the model
log (kinds, seqs, message payloads, abandoned ids, boundary cut, summary, retained texts,
reason); the head equals the fold of the log and the model's last seq, boundary, cut, open
calls, due flag and reason, attempt count and lease owner; ``load_context`` equals the model's
own rendering (handoff, retained texts, tail in order with results moved up to their calls and
synthetic results for calls without one) and equals ``compose_context`` over the log; the
context passes an OpenAI-style and an Anthropic-style tool-pairing validator; boundaries are
contiguous and non-overlapping (cuts non-decreasing, each below its own seq) and no stored
result crosses a cut. Every refusal is the exact typed error the model predicts and writes
nothing; every claim is granted or refused, and every attempt ends (succeeded, lease_lost,
nothing_to_compact), exactly as the model's lease state says. 0 invariant failures.

Run: ``EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
.venv/bin/pytest tests/reliability/test_t8_stateful.py -x -q -s`` (``EPISODIC_TEST_NIGHTLY=1`` for
nightly sizes).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID, uuid4

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall
from episodic.compaction import DEFAULT_SUMMARY_PREFIX, NO_SUMMARY_TEXT
from episodic.context import MISSING_RESULT_TEXT, Context, compose_context, tail_messages
from episodic.errors import (
    ConflictError,
    DuplicateToolCallError,
    IdempotencyMismatchError,
    OrphanToolResultError,
    UnsafeCutError,
    ValidationError,
)
from episodic.models import (
    BoundaryEvent,
    Conversation,
    MessageEvent,
    RunCompletedEvent,
    StoredEvent,
    TextBlock,
)
from episodic.policy import safe_cut_at_or_before
from episodic.store.attempts import AttemptEnd, AttemptRecord, Claim
from episodic.store.projection import counters_of, rebuild_head
from episodic.worker.job import CompactionOptions, compact_claimed
from tests.conftest import isolated_settings
from tests.reliability.sizes import NIGHTLY, size
from tests.reliability.strategies import (
    FakeSummarizer,
    anthropic_violations,
    battery_settings,
    is_safe_cut,
    openai_violations,
    private_database,
    resting_limit,
    results_crossing,
)

# CI size is the battery's 200 x 50 (~10k steps; ~9k run, as hypothesis ends some examples
# early): a step (the operation plus three concurrent reads for the invariant) costs ~3.5 ms
# on PostgreSQL on the shared 2-core machine (~30 s) and ~11 ms on SQLite, which runs 8.
EXAMPLES = size(200, 5_000)  # PostgreSQL
SQLITE_EXAMPLES = size(8, 1_000)
STEPS = size(50, 100)
WORK_LEASE = 30.0  # outlives any example: a work lease, or a crashed worker's "long" lease
CRASH_LEASE = 0.02  # a crashed worker's "short" lease: it runs out before any later step
CLOCK_SLACK = 0.01  # between this process's clock and the database's now()
EXPIRY_DEADLINE = 5.0  # seconds the database may take to see a short lease run out
TRIGGER_TURNS = 3
MAX_EVENTS = 10_000
# The model's conversations are a few words: whether a boundary shrinks them is not modelled.
OPTIONS = CompactionOptions(summarizer_timeout=10.0, max_attempts=5, require_smaller=False)
T0 = datetime(2025, 1, 1, tzinfo=UTC)

T = TypeVar("T")

# ---- strategies -----------------------------------------------------------------------

short_texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["héllo", "日本語", "emoji 🧪🚀", "a\u0301", "tab\tnl\n", " ", "\x00nul"]),
)
user_contents = st.one_of(
    short_texts,
    short_texts.map(lambda t: (TextBlock(text=t),)),
    st.tuples(short_texts, short_texts).map(lambda p: (TextBlock(text=p[0]), TextBlock(text=p[1]))),
)


def user_text(message: Message) -> str:
    """A user message's words as the handoff retains them (text blocks joined by newlines)."""
    if isinstance(message.content, str):
        return message.content
    return "\n".join(b.text for b in message.content or () if isinstance(b, TextBlock))


# ---- the model --------------------------------------------------------------------------


@dataclass
class ModelEvent:
    kind: str  # "message" | "run_completed" | "boundary"
    message: Message | None = None
    abandoned: tuple[str, ...] = ()
    covers: int = 0
    summary: str = ""
    retained: tuple[str, ...] = ()
    reason: str = ""
    #: written by the worker: it carries the state the next compaction builds on
    by_worker: bool = False


@dataclass
class Lease:
    """A claim as the model knows it. Whether it holds is model state, never a clock reading
    (hypothesis replays a prefix of steps and must see the same draws): a ``WORK_LEASE`` holds
    for the whole example; a ``CRASH_LEASE`` is never looked at while it may still hold. It
    runs out in ``crashed_lease_runs_out``, or at the start of the next step that claims or
    compacts, which waits until the database sees it expired and only then records that."""

    claim: Claim
    owner: str
    seconds: float
    expired: bool = False  # set only once the database has been seen to agree

    @property
    def running_out(self) -> bool:
        """A short lease not yet recorded as expired: no step may observe it in this state."""
        return self.seconds == CRASH_LEASE and not self.expired

    def state(self) -> str:
        assert not self.running_out, "a short lease observed before it was recorded expired"
        return "expired" if self.expired else "held"


@dataclass
class Model:
    events: list[ModelEvent] = field(default_factory=list)
    open_calls: dict[str, int] = field(default_factory=dict)  # id -> seq of its call
    closed_ids: set[str] = field(default_factory=set)  # answered or abandoned, not open now
    ever_abandoned: set[str] = field(default_factory=set)
    keyed: list[tuple[str, str, list[Message], int]] = field(default_factory=list)
    due: bool = False
    due_reason: str | None = None
    attempts: int = 0
    lease: Lease | None = None  # the claim whose token the head holds
    zombies: list[Lease] = field(default_factory=list)  # crashed claims, not resumed yet
    counter: int = 0

    @property
    def last_seq(self) -> int:
        return len(self.events)

    @property
    def boundary_seq(self) -> int | None:
        for seq in range(len(self.events), 0, -1):
            if self.events[seq - 1].kind == "boundary":
                return seq
        return None

    @property
    def covers(self) -> int:
        seq = self.boundary_seq
        return self.events[seq - 1].covers if seq is not None else 0

    def next_id(self) -> str:
        self.counter += 1
        return f"n{self.counter}"

    def unfinished_turns(self) -> int:
        """User messages since the last run completion, as the head counts them (a boundary
        recounts its tail: the events after its cut and before it)."""
        count = 0
        for index, event in enumerate(self.events):
            if event.kind == "message" and event.message is not None:
                count += event.message.role == "user"
            elif event.kind == "run_completed":
                count = 0
            else:
                count = 0
                for earlier in self.events[event.covers : index]:
                    if earlier.kind == "run_completed":
                        count = 0
                    elif earlier.kind == "message" and earlier.message is not None:
                        count += earlier.message.role == "user"
        return count

    def after_write(self) -> None:
        """The trigger runs with every append and run completion."""
        if not self.due and self.unfinished_turns() >= TRIGGER_TURNS:
            self.due, self.due_reason = True, "unfinished_turns"

    def append(self, batch: list[Message]) -> int:
        first = self.last_seq + 1
        for message in batch:
            self.events.append(ModelEvent("message", message))
            seq = self.last_seq
            if message.role == "tool" and message.tool_call_id is not None:
                self.open_calls.pop(message.tool_call_id)
                self.closed_ids.add(message.tool_call_id)
            for call in message.tool_calls:
                self.open_calls[call.id] = seq
                self.closed_ids.discard(call.id)
        self.after_write()
        return first

    def run_completed(self) -> tuple[str, ...]:
        abandoned = tuple(k for k, _ in sorted(self.open_calls.items(), key=lambda kv: kv[::-1]))
        self.events.append(ModelEvent("run_completed", abandoned=abandoned))
        self.ever_abandoned.update(abandoned)
        self.closed_ids.update(abandoned)
        self.open_calls.clear()
        self.after_write()
        return abandoned

    def boundary(
        self,
        covers: int,
        summary: str,
        retained: tuple[str, ...],
        reason: str,
        *,
        by_worker: bool = False,
    ) -> None:
        self.events.append(
            ModelEvent("boundary", None, (), covers, summary, retained, reason, by_worker)
        )
        self.due, self.due_reason, self.attempts, self.lease = False, None, 0, None

    def claimed(self, lease: Lease, reason: str) -> None:
        self.lease = lease
        self.attempts += 1
        self.due = True
        self.due_reason = reason if reason else self.due_reason

    def stored_events(self, conversation_id: UUID) -> list[StoredEvent]:
        """The model log as events, for the safe-cut oracle."""
        out: list[StoredEvent] = []
        for seq, e in enumerate(self.events, 1):
            base = {"conversation_id": conversation_id, "seq": seq, "created_at": T0}
            if e.kind == "message":
                assert e.message is not None
                out.append(MessageEvent(**base, token_estimate=0, message=e.message))
            elif e.kind == "run_completed":
                out.append(
                    RunCompletedEvent(**base, token_estimate=0, abandoned_tool_call_ids=e.abandoned)
                )
            else:
                out.append(
                    BoundaryEvent(
                        **base,
                        token_estimate=0,
                        summary=e.summary,
                        covers_through_seq=e.covers,
                        retained=e.retained,
                        reason=e.reason,
                    )
                )
        return out

    def render(self, through: int | None = None) -> list[tuple[str, int | None, Any]]:
        """What loading should return: (role, seq, payload) per message, where payload is the
        stored fields of a logged message, the text of a handoff or retained message, or the
        call id of a synthetic result."""
        out: list[tuple[str, int | None, Any]] = []
        bseq = self.boundary_seq
        covers = 0
        if bseq is not None:
            b = self.events[bseq - 1]
            covers = b.covers
            out.append(("handoff", bseq, b.summary))
            out.extend(("retained", None, text) for text in b.retained)
        last = self.last_seq if through is None else through
        body: list[tuple[Message, int, list[tuple[Message, int] | None]]] = []
        waiting: dict[str, tuple[int, int]] = {}
        for seq in range(covers + 1, last + 1):
            event = self.events[seq - 1]
            if event.kind != "message" or event.message is None:
                continue
            m = event.message
            if m.role == "system":
                continue
            if m.role == "assistant" and not m.tool_calls and not m.text.strip():
                continue
            if m.role == "tool":
                place = waiting.pop(m.tool_call_id or "", None)
                if place is not None:
                    body[place[0]][2][place[1]] = (m, seq)
                continue
            body.append((m, seq, [None] * len(m.tool_calls)))
            for position, call in enumerate(m.tool_calls):
                waiting[call.id] = (len(body) - 1, position)
        for m, seq, results in body:
            out.append((m.role, seq, m.stored_fields()))
            for position, result in enumerate(results):
                if result is None:
                    out.append(("synthetic", None, m.tool_calls[position].id))
                else:
                    out.append(("tool", result[1], result[0].stored_fields()))
        return out

    def expected_compaction(self, conversation_id: UUID) -> int | None:
        """The cut a worker compacts through now, or None for nothing to compact."""
        events = self.stored_events(conversation_id)
        covers = self.covers
        limit = resting_limit(events, above=covers)  # never into a run in progress
        cut = max(
            (c for c in range(covers + 1, limit + 1) if is_safe_cut(events, c)),
            default=0,
        )
        rendered = self.render(through=cut)
        if cut <= covers or not rendered:
            return None
        bseq = self.boundary_seq
        # A worker's boundary carries its notes and record: a compaction after it summarizes
        # only the messages since, and with none there is nothing to do.
        after_worker = bseq is not None and self.events[bseq - 1].by_worker
        if after_worker and all(role in ("handoff", "retained") for role, _, _ in rendered):
            return None
        return cut

    def retained_through(self, cut: int) -> tuple[str, ...]:
        """The user texts a worker retains: every non-empty user text of the source, oldest
        first (the texts here are far below the 20,000-token budget), handoffs excluded."""
        texts: list[str] = []
        for role, _seq, payload in self.render(through=cut):
            if role in ("handoff", "retained"):
                texts.append(payload)
            elif role == "user":
                texts.append(user_text(Message.model_validate(payload)))
        return tuple(t for t in texts if t and not t.startswith(DEFAULT_SUMMARY_PREFIX))


# ---- driving the store from hypothesis's synchronous rules ------------------------------


class Runner:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __call__(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()


@dataclass
class Stats:
    examples: int = 0
    steps: int = 0
    checks: int = 0
    failures: int = 0
    rules: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    max_log: int = 0
    seconds: float = 0.0


def make_machine(run: Runner, store: EpisodicStore, stats: Stats) -> type[RuleBasedStateMachine]:
    summarizer = FakeSummarizer()

    class StoreMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.model = Model()
            self.conv: UUID = uuid4()
            self.last_claim: Claim | None = None  # the latest lease granted on self.conv

        @initialize()
        def create(self) -> None:
            self.conv = run(
                store.create_conversation(
                    metadata={"compaction": {"trigger_unfinished_turns": TRIGGER_TURNS}}
                )
            )
            stats.examples += 1

        def note(self, name: str) -> None:
            stats.rules[name] += 1
            stats.steps += 1

        # ---- appends ----------------------------------------------------------------

        def _append(
            self, batch: list[Message], keying: str = "none", expected_seq: int | None = None
        ) -> None:
            key: str | None = None
            if keying == "key":
                key = f"key-{self.model.next_id()}"
            elif keying == "client":
                batch = [
                    batch[0].model_copy(update={"client_id": self.model.next_id()}),
                    *batch[1:],
                ]
            stored = run(
                store.append(self.conv, batch, idempotency_key=key, expected_seq=expected_seq)
            )
            first = self.model.append(batch)
            assert [e.seq for e in stored] == list(range(first, first + len(batch)))
            if key is not None:
                self.model.keyed.append(("key", key, batch, first))
            elif keying == "client":
                self.model.keyed.append(("client", batch[0].client_id or "", batch, first))

        @rule(content=user_contents, keying=st.sampled_from(["none", "none", "key", "client"]))
        def append_user(self, content: Any, keying: str) -> None:
            self.note("append_user")
            self._append([Message.user(content)], keying)

        @rule(
            kind=st.sampled_from(["text", "text", "blocks", "empty", "reasoning_only", "system"]),
            text=short_texts,
        )
        def append_assistant(self, kind: str, text: str) -> None:
            self.note(f"append_{kind}")
            if kind == "text":
                message = Message.assistant(text)
            elif kind == "blocks":
                message = Message.assistant((TextBlock(text=text),))
            elif kind == "empty":
                message = Message.assistant(None)
            elif kind == "reasoning_only":
                message = Message.assistant("", reasoning=text or "thinking")
            else:
                message = Message.system(text)
            self._append([message])

        @rule(
            count=st.integers(1, 3),
            reuse=st.booleans(),
            answer_now=st.lists(st.integers(0, 2), unique=True, max_size=3),
            text=st.none() | short_texts,
            keying=st.sampled_from(["none", "none", "key", "client"]),
            data=st.data(),
        )
        def append_tool_calls(
            self,
            count: int,
            reuse: bool,
            answer_now: list[int],
            text: str | None,
            keying: str,
            data: st.DataObject,
        ) -> None:
            """An assistant message with parallel calls, some answered in the same batch."""
            ids: list[str] = []
            reusable = sorted(self.model.closed_ids - set(self.model.open_calls))
            for _ in range(count):
                choices = [i for i in reusable if i not in ids]
                if reuse and choices:
                    ids.append(data.draw(st.sampled_from(choices), label="reused id"))
                else:
                    ids.append(self.model.next_id())
            self.note("append_parallel_calls" if count > 1 else "append_tool_call")
            calls = [ToolCall(id=i, name="run", args={"i": n}) for n, i in enumerate(ids)]
            batch = [Message.assistant(text, tool_calls=calls)]
            for position in answer_now:
                if position < count:
                    batch.append(Message.tool_result(ids[position], f"out {position}", name="run"))
            self._append(batch, keying)

        @precondition(lambda self: bool(self.model.open_calls))
        @rule(data=st.data(), is_error=st.booleans(), user_first=st.booleans())
        def append_tool_results(
            self, data: st.DataObject, is_error: bool, user_first: bool
        ) -> None:
            """Results for open calls, in any order, sometimes after a new user turn."""
            chosen = data.draw(
                st.lists(
                    st.sampled_from(sorted(self.model.open_calls)),
                    min_size=1,
                    max_size=3,
                    unique=True,
                ),
                label="answered",
            )
            self.note("append_tool_results")
            batch = [
                Message.tool_result(i, f"result of {i}", name="run", is_error=is_error)
                for i in chosen
            ]
            if user_first:
                self.note("user_turn_before_results")
                self._append([Message.user("interrupting")])
            self._append(batch)

        @rule(kind=st.sampled_from(["orphan_unknown", "orphan_closed", "duplicate_open", "empty"]))
        def append_refused(self, kind: str) -> None:
            model = self.model
            closed = sorted(model.closed_ids - set(model.open_calls))
            if kind == "orphan_unknown" or (kind == "orphan_closed" and not closed):
                call_id = f"never-{model.next_id()}"
                with pytest.raises(OrphanToolResultError) as caught:
                    run(store.append(self.conv, [Message.tool_result(call_id, "late")]))
                assert caught.value.tool_call_id == call_id
                assert not caught.value.abandoned
                kind = "orphan_unknown"
            elif kind == "orphan_closed":
                call_id = closed[model.counter % len(closed)]
                with pytest.raises(OrphanToolResultError) as caught:
                    run(store.append(self.conv, [Message.tool_result(call_id, "late")]))
                assert caught.value.tool_call_id == call_id
                assert caught.value.abandoned == (call_id in model.ever_abandoned)
            elif kind == "duplicate_open" and model.open_calls:
                call_id = sorted(model.open_calls)[0]
                batch = [Message.assistant(None, tool_calls=[ToolCall(id=call_id, name="run")])]
                with pytest.raises(DuplicateToolCallError):
                    run(store.append(self.conv, batch))
            else:
                kind = "empty"
                with pytest.raises(ValidationError):
                    run(store.append(self.conv, []))
            self.note(f"refused_{kind}")
            stats.outcomes[f"refused:{kind}"] += 1

        @rule(which=st.sampled_from(["correct", "stale", "ahead"]), back=st.integers(1, 5))
        def append_expected(self, which: str, back: int) -> None:
            last = self.model.last_seq
            if which == "stale" and last == 0:
                which = "ahead"
            self.note(f"expected_{which}")
            if which == "correct":
                self._append([Message.user("conditional")], expected_seq=last)
                return
            expected = max(last - back, 0) if which == "stale" else last + back
            with pytest.raises(ConflictError) as caught:
                run(store.append(self.conv, [Message.user("stale")], expected_seq=expected))
            assert (caught.value.expected_seq, caught.value.actual_seq) == (expected, last)
            stats.outcomes["conflict"] += 1

        @precondition(lambda self: bool(self.model.keyed))
        @rule(data=st.data(), same=st.booleans(), stale_expected=st.booleans())
        def retry_keyed(self, data: st.DataObject, same: bool, stale_expected: bool) -> None:
            """A retry with the same key: the same batch replays the first result (whatever
            the expected seq now says); a different batch is refused."""
            how, key, batch, first = data.draw(st.sampled_from(self.model.keyed), label="keyed")
            expected = 0 if stale_expected and self.model.last_seq > 0 else None
            if not same:
                batch = [Message.user("a different request", client_id=batch[0].client_id)]
            self.note(f"retry_{how}_{'same' if same else 'different'}")
            call = store.append(
                self.conv,
                batch,
                idempotency_key=key if how == "key" else None,
                expected_seq=expected,
            )
            if same:
                stored = run(call)
                assert [e.seq for e in stored] == list(range(first, first + len(batch)))
                assert [e.message.stored_fields() for e in stored] == [
                    m.stored_fields() for m in batch
                ]
                stats.outcomes["replayed"] += 1
            else:
                with pytest.raises(IdempotencyMismatchError):
                    run(call)
                stats.outcomes["idempotency_mismatch"] += 1

        @rule()
        def mark_run_completed(self) -> None:
            self.note("mark_run_completed")
            completed = run(store.mark_run_completed(self.conv))
            expected = self.model.run_completed()
            assert completed.seq == self.model.last_seq
            assert completed.abandoned_tool_call_ids == expected

        # ---- compaction -------------------------------------------------------------

        def _claim_manual(self, owner: str, seconds: float) -> Claim | None:
            model = self.model
            state = model.lease.state() if model.lease is not None else "free"
            claim = run(store.claim_conversation(self.conv, owner, lease_seconds=seconds))
            self.last_claim = claim or self.last_claim
            if state == "held":
                assert claim is None, "a held lease was taken over by claim_conversation"
                stats.outcomes["claim_refused_while_leased"] += 1
                return None
            assert claim is not None, f"claim_conversation refused with the lease {state}"
            if model.lease is not None:
                stats.outcomes["expired_lease_taken_over"] += 1
            model.claimed(Lease(claim, owner, seconds), "manual_recovery")
            assert claim.attempt == model.attempts
            assert claim.reason == "manual_recovery"
            return claim

        def _claim_due(self, owner: str, seconds: float) -> Claim | None:
            """store.claim_due as a worker calls it. Claims of other examples' conversations
            (left due by a crash) are compacted like any worker would."""
            model = self.model
            state = model.lease.state() if model.lease is not None else "free"
            claims = run(store.claim_due(owner, limit=50, lease_seconds=seconds))
            ours = [c for c in claims if c.conversation_id == self.conv]
            self.last_claim = ours[-1] if ours else self.last_claim
            for other in claims:
                if other.conversation_id != self.conv:
                    run(compact_claimed(store, summarizer, other, worker=owner, options=OPTIONS))
                    stats.outcomes["foreign_claim_compacted"] += 1
            if not model.due:
                assert not ours, "claim_due took a conversation that is not due"
                return None
            if state == "held":
                assert not ours, "a held lease was taken over by claim_due"
                stats.outcomes["claim_due_skipped_held_lease"] += 1
                return None
            assert ours, f"due conversation not claimed (lease {state})"
            if model.lease is not None:
                stats.outcomes["expired_lease_taken_over"] += 1
            (claim,) = ours
            reason = model.due_reason or ""
            model.claimed(Lease(claim, owner, seconds), "")
            assert claim.attempt == model.attempts
            assert claim.reason == reason
            return claim

        def _compact(self, lease: Lease, *, zombie: bool = False) -> None:
            """Run one attempt for ``lease`` and move the model the way it must have gone."""
            model = self.model
            current = model.lease is not None and model.lease.claim is lease.claim
            expected_cut = model.expected_compaction(self.conv)
            retained = model.retained_through(expected_cut) if expected_cut else ()
            state = lease.state() if current else "lost"
            before = summarizer.calls
            result = run(
                compact_claimed(store, summarizer, lease.claim, worker=lease.owner, options=OPTIONS)
            )
            stats.outcomes[f"{'zombie' if zombie else 'worker'}:{result.outcome}:{state}"] += 1
            if state == "lost":
                assert result.outcome == "lease_lost", result
                return
            if expected_cut is None:
                expected = "nothing_to_compact"  # ending needs the token, not the time
            else:
                expected = "succeeded" if state == "held" else "lease_lost"
            assert result.outcome == expected, (result, state, expected_cut)
            if result.outcome == "succeeded":
                assert expected_cut is not None
                assert summarizer.calls == before + 1
                text = (summarizer.last_text or "").strip()
                # The handoff adds the summarizer's text to the earlier notes and the record
                # read from the log; the model takes it as written once it holds the text.
                written = run(store.load_context(self.conv)).boundary
                assert written is not None
                assert written.summary.startswith(f"{DEFAULT_SUMMARY_PREFIX}\n")
                assert text in written.summary or NO_SUMMARY_TEXT in written.summary
                reason = lease.claim.reason
                model.boundary(expected_cut, written.summary, retained, reason, by_worker=True)
            elif result.outcome == "nothing_to_compact":
                model.due, model.due_reason, model.attempts, model.lease = False, None, 0, None
            else:  # lease_lost with our token: released, still due, retried at once
                model.lease = None

        def _lease_runs_out(self) -> None:
            """A crashed worker's short lease runs out: wait until the database's clock has
            passed it (its own count of live leases drops to 0: no other conversation holds
            one, every example ends its leases), then record that in the model."""
            lease = self.model.lease
            assert lease is not None
            assert lease.running_out
            wait = lease.claim.lease_expires_at.timestamp() + CLOCK_SLACK - time.time()
            if wait > 0:
                time.sleep(wait)
            deadline = time.monotonic() + EXPIRY_DEADLINE
            while (status := run(store.compaction_status(recent=0))).leased:
                assert time.monotonic() < deadline, (
                    f"a {CRASH_LEASE} s lease still live in the database: {status}"
                )
                time.sleep(0.005)
            lease.expired = True
            stats.outcomes["crash_lease_ran_out"] += 1

        def _settle(self) -> None:
            """Before a step that claims or compacts: a short lease has run out by now."""
            if self.model.lease is not None and self.model.lease.running_out:
                self._lease_runs_out()

        @precondition(lambda self: self.model.lease is not None and self.model.lease.running_out)
        @rule()
        def crashed_lease_runs_out(self) -> None:
            """Time passes: the crashed worker's short lease expires (nothing is written)."""
            self.note("crash_lease_runs_out")
            self._lease_runs_out()

        @rule(via=st.sampled_from(["manual", "due", "due"]))
        def worker_step(self, via: str) -> None:
            self.note(f"worker_{via}")
            self._settle()
            owner = f"worker-{self.model.next_id()}"
            if via == "manual":
                claim = self._claim_manual(owner, WORK_LEASE)
            else:
                claim = self._claim_due(owner, WORK_LEASE)
            if claim is not None:
                lease = self.model.lease
                assert lease is not None
                self._compact(lease)

        @rule(via=st.sampled_from(["manual", "due"]), short=st.booleans())
        def crash_worker(self, via: str, short: bool) -> None:
            """Claim, then die: a short claim stays until its lease runs out and is taken
            over; a long one holds the conversation for the rest of the example (claims are
            refused) unless the worker resumes or a boundary is written."""
            self.note(f"crash_{via}_{'short' if short else 'long'}")
            self._settle()
            owner = f"crasher-{self.model.next_id()}"
            seconds = CRASH_LEASE if short else WORK_LEASE
            if via == "manual":
                claim = self._claim_manual(owner, seconds)
            else:
                claim = self._claim_due(owner, seconds)
            if claim is not None:
                assert self.model.lease is not None
                self.model.zombies.append(self.model.lease)
                stats.outcomes["crashed_claims"] += 1

        @precondition(
            lambda self: self.model.lease is not None and self.model.lease.seconds == CRASH_LEASE
        )
        @rule()
        def worker_after_lease_expiry(self) -> None:
            """Recovery: once a crashed worker's lease has expired, the next worker's
            claim_due must take the conversation over (it is still due) and compact it."""
            self.note("worker_after_expiry")
            self._settle()
            claim = self._claim_due(f"recoverer-{self.model.next_id()}", WORK_LEASE)
            assert claim is not None, "an expired lease was not recovered by claim_due"
            assert self.model.lease is not None
            self._compact(self.model.lease)

        @precondition(lambda self: bool(self.model.zombies))
        @rule(data=st.data())
        def crashed_worker_resumes(self, data: st.DataObject) -> None:
            """The crashed worker was only paused: it finishes its attempt late. It may write
            only while its lease holds; otherwise it is fenced off (lease_lost)."""
            self.note("zombie_resumes")
            zombie = data.draw(st.sampled_from(self.model.zombies), label="zombie")
            self._settle()
            self.model.zombies.remove(zombie)
            self._compact(zombie, zombie=True)

        @precondition(lambda self: self.model.last_seq > 0)
        @rule(
            data=st.data(),
            mode=st.sampled_from(["as_requested", "moved_earlier", "stale_boundary"]),
            summary=short_texts.filter(lambda s: s.strip() != ""),
            retained=st.lists(short_texts, max_size=2),
        )
        def write_boundary_direct(
            self, data: st.DataObject, mode: str, summary: str, retained: list[str]
        ) -> None:
            model = self.model
            requested = data.draw(st.integers(1, model.last_seq), label="requested cut")
            events = model.stored_events(self.conv)
            expected_boundary = model.boundary_seq
            cut = requested
            if mode == "moved_earlier":
                cut = safe_cut_at_or_before(events, requested)
                oracle = max(c for c in range(0, requested + 1) if is_safe_cut(events, c))
                assert cut == oracle, (requested, cut, oracle)
                if cut < max(model.covers, 1):
                    self.note("boundary_moved_before_cut")
                    return
            elif mode == "stale_boundary":
                expected_boundary = None if expected_boundary is not None else 1
            self.note(f"boundary_{mode}")
            call = store.write_boundary(
                self.conv,
                BoundaryRequest(
                    summary=summary,
                    covers_through_seq=cut,
                    retained=retained,
                    reason="manual_recovery",
                    expected_boundary_seq=expected_boundary,
                ),
            )
            if expected_boundary != model.boundary_seq:
                with pytest.raises(ConflictError):
                    run(call)
                stats.outcomes["boundary_conflict"] += 1
            elif cut < model.covers or not is_safe_cut(events, cut):
                with pytest.raises(UnsafeCutError):
                    run(call)
                stats.outcomes["unsafe_cut_refused"] += 1
            else:
                written = run(call)
                model.boundary(cut, summary, tuple(retained), "manual_recovery")
                assert written.seq == model.last_seq
                stats.outcomes["direct_boundary"] += 1

        def teardown(self) -> None:
            """Leave no due conversation and no live lease behind for the next example: a
            crashed worker's claim still on the head is ended with its own token (ending
            needs the token, not the time), any other conversation is claimed and retired.
            After a failure in the middle of a step the head may hold a lease the model never
            recorded: the latest claim granted on the conversation holds its token."""
            stats.max_log = max(stats.max_log, self.model.last_seq)
            claim = self.last_claim
            if self.model.lease is None or self.model.lease.claim is not claim:
                retire = run(
                    store.claim_conversation(self.conv, "retire", lease_seconds=WORK_LEASE)
                )
                claim = retire or claim
            if claim is not None:
                now = datetime.now(UTC)
                record = AttemptRecord(
                    conversation_id=self.conv,
                    attempt_id=uuid4(),
                    tenant_id=claim.tenant_id,
                    worker="retire",
                    reason=claim.reason,
                    outcome="dead",
                    started_at=now,
                    finished_at=now,
                )
                run(store.end_attempt(claim, AttemptEnd(dead=True), record))

        # ---- the invariants, after every step -----------------------------------------

        @invariant()
        def database_matches_model(self) -> None:
            stats.checks += 1
            try:
                self._check()
            except BaseException:
                stats.failures += 1
                raise

        def _check(self) -> None:
            model, cid = self.model, self.conv
            events, head, context = run(_read_all(store, cid, model.last_seq))

            # the log equals the model log
            assert [e.seq for e in events] == list(range(1, model.last_seq + 1))
            for stored, expected in zip(events, model.events, strict=True):
                assert stored.kind == expected.kind, (stored.seq, stored.kind, expected.kind)
                if isinstance(stored, MessageEvent):
                    assert expected.message is not None
                    assert stored.message.stored_fields() == expected.message.stored_fields()
                elif isinstance(stored, RunCompletedEvent):
                    assert stored.abandoned_tool_call_ids == expected.abandoned
                elif isinstance(stored, BoundaryEvent):
                    got = (stored.covers_through_seq, stored.summary, stored.retained)
                    assert got == (expected.covers, expected.summary, expected.retained)
                    assert stored.reason == expected.reason

            # the head equals the fold of the log and the model's view
            assert counters_of(head) == rebuild_head(events)
            assert head.last_seq == model.last_seq
            assert head.boundary_seq == model.boundary_seq
            assert head.covers_through_seq == model.covers
            assert head.open_tool_calls == model.open_calls
            assert (head.due_since is not None, head.due_reason) == (model.due, model.due_reason)
            assert head.compaction_attempts == model.attempts
            assert head.lease_owner == (model.lease.owner if model.lease else None)
            assert head.dead_since is None

            # load_context equals the model's rendering, and compose_context over the log
            expected_messages = model.render()
            assert len(context.messages) == len(expected_messages), (
                [(m.role, m.seq) for m in context.messages],
                [(r, s) for r, s, _ in expected_messages],
            )
            for message, (role, seq, payload) in zip(
                context.messages, expected_messages, strict=True
            ):
                if role == "handoff":
                    assert (message.role, message.seq, message.text) == ("user", seq, payload)
                elif role == "retained":
                    assert (message.role, message.seq, message.text) == ("user", None, payload)
                elif role == "synthetic":
                    assert (message.role, message.seq, message.tool_call_id) == (
                        "tool",
                        None,
                        payload,
                    )
                    assert message.is_error
                    assert message.text == MISSING_RESULT_TEXT
                else:
                    assert (message.role, message.seq) == (role, seq)
                    assert message.stored_fields() == payload
            boundary = next(
                (e for e in events if isinstance(e, BoundaryEvent) and e.seq == head.boundary_seq),
                None,
            )
            composed = compose_context(
                cid,
                boundary=boundary,
                tail=tail_messages([e for e in events if e.seq > model.covers]),
                last_seq=head.last_seq,
                estimator=store.estimator,
            )
            assert context == composed

            # the pairing invariant, as two providers state it
            wire = context.to_openai()
            assert openai_violations(wire) == []
            assert anthropic_violations(wire) == []

            # boundaries: contiguous, non-overlapping, each at a cut no result crosses
            previous = 0
            for event in events:
                if isinstance(event, BoundaryEvent):
                    assert previous <= event.covers_through_seq < event.seq
                    assert results_crossing(events, event.covers_through_seq) == []
                    previous = event.covers_through_seq

    return StoreMachine


async def _read_all(
    store: EpisodicStore, cid: UUID, last_seq: int
) -> tuple[list[StoredEvent], Conversation, Context]:
    """The log, the head and the context, read concurrently (three pooled connections on
    PostgreSQL): what every invariant check compares."""
    events = store.read_events(cid, limit=MAX_EVENTS) if last_seq else asyncio.sleep(0, [])
    return await asyncio.gather(events, store.get_conversation(cid), store.load_context(cid))


# ---- the test -------------------------------------------------------------------------


@pytest.fixture(params=["postgresql", "sqlite"])
def private_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres_server")
        template = request.getfixturevalue("postgres_template")
        yield from private_database("postgresql", server=server, template=template, tmp=tmp_path)
    else:
        template = request.getfixturevalue("sqlite_template")
        yield from private_database("sqlite", server=None, template=template, tmp=tmp_path)


def test_store_matches_the_model(private_url: str) -> None:
    run = Runner()
    stats = Stats()
    store = run(EpisodicStore.open(private_url, settings=isolated_settings()))
    started = time.perf_counter()
    try:
        machine = make_machine(run, store, stats)
        run_state_machine_as_test(
            machine,
            settings=battery_settings(
                EXAMPLES if store.dialect == "postgresql" else SQLITE_EXAMPLES,
                stateful_step_count=STEPS,
            ),
        )
    finally:
        stats.seconds = time.perf_counter() - started
        run(store.close())
        run.close()
        print(
            f"\nT8 [{store.dialect}{' nightly' if NIGHTLY else ''}]: {stats.examples} examples, "
            f"{stats.steps} steps, {stats.checks} invariant checks, "
            f"{stats.failures} invariant failures, longest log {stats.max_log} events, "
            f"{stats.seconds:.1f} s; rules {dict(sorted(stats.rules.items()))}; "
            f"outcomes {dict(sorted(stats.outcomes.items()))}"
        )
    assert stats.failures == 0
