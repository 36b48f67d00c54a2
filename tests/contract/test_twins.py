"""Python is the spec: the same generated input, through the Python twins and through what
PostgreSQL runs (``postgres/schema.sql``'s functions, ``postgres/queries.py``'s queries), gives
the same answers and leaves the same heads. The SQLite backend runs the Python side.

The pairs, Python twin ↔ PostgreSQL (13):

==  ============================================================  ================================
 #  Python                                                        PostgreSQL
==  ============================================================  ================================
 1  ``rules.append_refusal`` + ``HeadCounters.after_message``     ``episodic_append``
 2  ``HeadCounters.after_run_completed``                          ``episodic_mark_run_completed``
 3  ``due.due_reason``                                            ``episodic_trigger_reason``
 4  ``due.due_marking``                                           ``episodic_mark_due``
 5  ``due.sweep_due_candidate`` + ``due.due_marking``             ``episodic_sweep_due``
 6  ``due.CLEARED_COMPACTION_STATE`` +                            ``episodic_write_boundary``
    ``HeadCounters.after_boundary``
 7  ``planned_events.write_event_columns`` (on the plans of       ``episodic_write_event``
    ``plan_retraction``, ``plan_clear``, ``plan_usage``,
    ``plan_deletion``)
 8  ``rules.create_conversation_outcome``                         ``episodic_create_conversation``
 9  ``attempts.claimable`` + ``attempts.claim_columns``           ``episodic_claim`` (and its
                                                                  predicate's two copies: one text)
10  ``attempts.claimable_by_hand`` +                              ``episodic_claim_conversation``
    ``attempts.claim_conversation_columns``
11  ``attempts.end_attempt_columns`` +                            ``episodic_end_attempt``
    ``attempts.end_attempt_outcome``
12  ``attempts.in_queue``, ``queue_state``, ``queue_order``       ``queries.QUEUE``
13  ``attempts.queue_counts``                                     ``queries.QUEUE_COUNTS``
==  ============================================================  ================================

How they are driven:

- **A generated history** (pairs 1-7): appends, run completions, boundaries, retractions,
  clears, usage reports and at times a deletion, played through the store on PostgreSQL and
  through the twins. After every step the outcome (kind, seq, the offending id) and the whole
  head (counters, open calls, due state, deleted or not) are compared, and so is the trigger's
  answer each side gives on that head (3; 4 runs inside 1, 2 and 7); at the end the sweep (5).
- **Generated heads** (pairs 5, 9-13): rows written straight into the heads table inside one
  transaction, with timestamps at, just before and just after its instant; PostgreSQL's
  ``now()`` is that instant throughout, so both sides are asked at the same one, boundaries
  included. The transaction is rolled back.
- **Every case** (pair 8): taken or not, a tombstone in this tenant, another or none, reuse
  asked or not.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import orjson
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from episodic import (
    BoundaryRequest,
    EpisodicStore,
    Message,
    NotFoundError,
    ToolCall,
    Usage,
    ValidationError,
)
from episodic.policy import EpisodicCompactionConfig, safe_cut
from episodic.store.attempts import (
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    QueueHead,
    claim_columns,
    claim_conversation_columns,
    claimable,
    claimable_by_hand,
    end_attempt_columns,
    end_attempt_outcome,
    in_queue,
    queue_counts,
    queue_order,
    queue_state,
)
from episodic.store.backend import NewConversation, WriteOutcome
from episodic.store.batch import PreparedBatch, prepare_batch
from episodic.store.codec import decode_conversation
from episodic.store.due import (
    CLEARED_COMPACTION_STATE,
    DueState,
    due_marking,
    due_reason,
    sweep_due_candidate,
)
from episodic.store.planned_events import (
    PlannedEvent,
    plan_clear,
    plan_deletion,
    plan_retraction,
    plan_usage,
    write_event_columns,
)
from episodic.store.postgres.backend import trigger_document
from episodic.store.postgres.queries import (
    CLAIM,
    CLAIM_CONVERSATION,
    CREATE_CONVERSATION,
    END_ATTEMPT,
    ERASED_SQLSTATE,
    QUEUE,
    QUEUE_COUNTS,
    SWEEP_DUE,
    schema_sql,
)
from episodic.store.projection import (
    HeadCounters,
    HeadState,
    abandoned_result_tokens,
    counters_of,
)
from episodic.store.rules import PriorBatch, append_refusal, create_conversation_outcome
from tests.conftest import citus_lane, isolated_settings
from tests.support import asyncpg_dsn

CALL_IDS = ("t1", "t2", "t3")
KEYS = (None, None, "k1", "k2")
CLIENT_IDS = (None, "m1", "m1", "m2")
#: The events planned in Python and written by episodic_write_event.
PLANNED_KINDS = ("retract", "clear", "usage", "delete")
#: A boundary asked of a deleted conversation (refused as not found, whatever it asks).
GONE_BOUNDARY = BoundaryRequest(
    summary="handoff", covers_through_seq=1, reason="manual_recovery", expected_boundary_seq=None
)


@dataclass
class Twin:
    """The conversation as the Python rules see it."""

    conversation_id: UUID
    created_at: datetime
    metadata: dict[str, Any]
    trigger: EpisodicCompactionConfig
    counters: HeadCounters = field(default_factory=HeadCounters)
    due: dict[str, Any] = field(default_factory=dict)
    boundary_at: datetime | None = None
    deleted: bool = False
    #: per stored batch: its key, request hash and first seq; every client id; abandoned calls
    keyed: dict[str, PriorBatch] = field(default_factory=dict)
    client_ids: set[str] = field(default_factory=set)
    abandoned: list[str] = field(default_factory=list)

    def mark_due(self, now: datetime) -> None:
        self.due.update(due_marking(self.counters, self.due_state(), self.trigger, now))

    def due_state(self) -> DueState:
        return DueState(
            created_at=self.created_at,
            boundary_at=self.boundary_at,
            due_since=self.due.get("due_since"),
            dead_since=self.due.get("dead_since"),
            metadata=self.metadata,
        )

    def attempt(self, end: AttemptEnd, error: str | None, now: datetime) -> None:
        """A worker's attempt that writes no boundary: the conversation claimed by hand,
        then the attempt ended as ``end`` says (claim_conversation_columns, then
        end_attempt_columns)."""
        head = QueueHead(
            conversation_id=self.conversation_id,
            due_since=self.due.get("due_since"),
            dead_since=self.due.get("dead_since"),
            next_attempt_at=self.due.get("next_attempt_at"),
            last_error=self.due.get("last_error"),
            compaction_attempts=self.due.get("compaction_attempts", 0),
        )
        assert claimable_by_hand(head, now)
        self.due.update(
            claim_conversation_columns(
                head,
                owner="w1",
                token=uuid4(),
                lease_seconds=60,
                reason="manual_recovery",
                now=now,
            )
        )
        self.due.update(end_attempt_columns(end, error=error, now=now))

    def append(self, batch: PreparedBatch, now: datetime) -> WriteOutcome:
        if self.deleted:
            return WriteOutcome("deleted", seq=self.counters.last_seq)
        prior = self.keyed.get(batch.idempotency_key) if batch.idempotency_key else None
        reused = next((c for c in batch.client_ids if c in self.client_ids), None)
        refused = append_refusal(
            batch,
            last_seq=self.counters.last_seq,
            open_tool_calls=self.counters.open_tool_calls,
            prior=prior,
            reused_client_id=reused,
            abandoned_calls=self.abandoned,
        )
        if refused is not None:
            return refused
        first = self.counters.last_seq + 1
        for index, message in enumerate(batch.messages):
            self.counters = self.counters.after_message(
                message,
                seq=first + index,
                token_estimate=batch.token_estimates[index],
                usage=batch.usage if index == 0 else None,
            )
        if batch.idempotency_key is not None:
            self.keyed[batch.idempotency_key] = PriorBatch(first, now, batch.request_hash)
        self.client_ids.update(c for c in batch.client_ids if c is not None)
        self.mark_due(now)
        return WriteOutcome("appended", seq=first)

    def complete_run(self, tokens_per_abandoned: int, now: datetime) -> WriteOutcome:
        if self.deleted:
            return WriteOutcome("not_found")
        abandoned = self.counters.abandoned_ids()
        self.abandoned.extend(abandoned)
        seq = self.counters.last_seq + 1
        self.counters = self.counters.after_run_completed(
            seq=seq, token_estimate=tokens_per_abandoned * len(abandoned)
        )
        self.mark_due(now)
        return WriteOutcome("appended", seq=seq, detail=orjson.dumps(abandoned).decode())

    def plan(self, step: dict[str, Any], tail: list[Any], now: datetime) -> PlannedEvent | None:
        """What the planner decides on this twin's head (the same planner PostgreSQL's
        backend runs before it calls episodic_write_event)."""
        head = HeadState(
            tenant_id="default",
            counters=self.counters,
            lease_token=None,
            lease_expires_at=None,
            created_at=self.created_at,
            boundary_at=self.boundary_at,
        )
        cid = self.conversation_id
        if step["kind"] == "retract":
            return plan_retraction(cid, head, tail, now)
        if step["kind"] == "clear":
            return plan_clear(cid, head, tail, now)
        if step["kind"] == "usage":
            return plan_usage(cid, step["usage"], head, now)
        return plan_deletion(cid, head, now)

    def write_planned(self, planned: PlannedEvent, now: datetime) -> None:
        """The planned event written as write_event_columns says."""
        columns = write_event_columns(planned, self.due_state(), self.trigger, now)
        self.counters = planned.counters
        self.boundary_at = columns.pop("boundary_at", self.boundary_at)
        self.deleted = self.deleted or columns.pop("deleted_at", None) is not None
        self.due.update(columns)


# ---- generated histories --------------------------------------------------------------------

ids = st.sampled_from(CALL_IDS)
text = st.text(alphabet="abcxyz ", min_size=1, max_size=40)
user = st.builds(
    lambda content, client: Message.user(content, client_id=client),
    text,
    st.sampled_from(CLIENT_IDS),
)
assistant = st.builds(
    lambda content, calls: Message.assistant(
        content, tool_calls=[ToolCall(id=i, name="run") for i in dict.fromkeys(calls)]
    ),
    st.one_of(st.none(), text),
    st.lists(ids, min_size=1, max_size=2),
)
result = st.builds(lambda call, content: Message.tool_result(call, content), ids, text)
message = st.one_of(user, user, assistant, result)
append_step = st.fixed_dictionaries(
    {
        "kind": st.just("append"),
        "messages": st.lists(message, min_size=1, max_size=3),
        "key": st.sampled_from(KEYS),
        "expected": st.sampled_from([None, "last", "stale"]),
        "usage": st.one_of(st.none(), st.integers(0, 400).map(lambda n: Usage(input_tokens=n))),
    }
)
planned_step = st.one_of(
    st.just({"kind": "retract"}),
    st.just({"kind": "clear"}),
    st.integers(0, 400).map(lambda n: {"kind": "usage", "usage": Usage(input_tokens=n)}),
)
# A worker's attempt that writes no boundary: nothing to compact, a failure, or the last one.
attempt_step = st.fixed_dictionaries(
    {
        "kind": st.just("attempt"),
        "end": st.sampled_from(
            [AttemptEnd(clear_due=True), AttemptEnd(retry_in=30.0), AttemptEnd(dead=True)]
        ),
        "error": st.sampled_from([None, "boom"]),
    }
)
#: Half appends; the rest run completions, boundaries and planned events (one_of would
#: flatten planned_step's choices into its own and weigh each as much as an append).
STEP_WEIGHTS = {"append": 5, "complete_run": 1, "boundary": 1, "planned": 2, "attempt": 1}
step = st.sampled_from([kind for kind, n in STEP_WEIGHTS.items() for _ in range(n)]).flatmap(
    lambda kind: {
        "append": append_step,
        "complete_run": st.just({"kind": "complete_run"}),
        "boundary": st.just({"kind": "boundary"}),
        "planned": planned_step,
        "attempt": attempt_step,
    }[kind]
)
ONE_USER_MESSAGE = {
    "kind": "append",
    "messages": [Message.user("hello")],
    "key": None,
    "expected": None,
    "usage": None,
}
GIVE_UP = {"kind": "attempt", "end": AttemptEnd(clear_due=True), "error": None}
# How a history ends: as it goes; or a worker's attempt that writes no boundary (which leaves
# the trigger's own verdict on the head unasked), then a planned event, the one write that
# asks it again; or a deletion, perhaps after such an attempt, and what is refused after it.
ending = st.one_of(
    st.just([]),
    st.tuples(attempt_step, planned_step).map(list),
    st.tuples(st.lists(attempt_step, max_size=1), st.lists(step, max_size=3)).map(
        lambda parts: [*parts[0], {"kind": "delete"}, *parts[1]]
    ),
)
steps = st.tuples(st.lists(step, min_size=1, max_size=20), ending).map(
    lambda parts: [*parts[0], *parts[1]]
)
triggers = st.builds(
    EpisodicCompactionConfig,
    trigger_context_tokens=st.one_of(st.none(), st.integers(0, 300)),
    trigger_unfinished_turns=st.integers(1, 6),
    trigger_age_days=st.sampled_from([0, 1, 30]),
    trigger_age_turn_count=st.integers(1, 8),
)
overrides = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "trigger_unfinished_turns": st.one_of(st.none(), st.integers(1, 4)),
            "trigger_context_tokens": st.one_of(st.none(), st.integers(0, 200)),
        },
    ).map(lambda o: {"compaction": o}),
)


def _ids(detail: str | None) -> object:
    """An outcome's detail: an offending id, or a run completion's abandoned ids as JSON
    (PostgreSQL writes jsonb text, with spaces)."""
    return orjson.loads(detail) if detail is not None and detail.startswith("[") else detail


async def _head_row(connection: asyncpg.Connection, conv: UUID, trigger: EpisodicCompactionConfig,
                    now: datetime) -> Any:  # fmt: skip
    """The head, and what episodic_trigger_reason says of it at ``now``."""
    return await connection.fetchrow(
        # ROW(c.*) cast to the table's type: on Citus, ``c`` is a shard's row type.
        "SELECT c.*, episodic_trigger_reason(ROW(c.*)::episodic_conversations, $2::jsonb, $3)"
        "       AS sql_reason"
        "  FROM episodic_conversations c WHERE conversation_id = $1",
        conv,
        orjson.dumps(trigger_document(trigger)).decode(),
        now,
    )


def _compare_heads(twin: Twin, row: Any, now: datetime, step: object) -> None:
    head = decode_conversation(dict(row))
    assert counters_of(head) == twin.counters, step
    assert (head.due_since is not None) == (twin.due.get("due_since") is not None), step
    assert head.due_reason == twin.due.get("due_reason"), step
    assert (row["next_attempt_at"] is None) == (twin.due.get("next_attempt_at") is None), step
    assert (row["dead_since"] is None) == (twin.due.get("dead_since") is None), step
    assert row["compaction_attempts"] == twin.due.get("compaction_attempts", 0), step
    assert row["last_error"] == twin.due.get("last_error"), step
    assert (head.deleted_at is not None) == twin.deleted, step
    assert (head.boundary_at is not None) == (twin.boundary_at is not None), step
    # episodic_trigger_reason and due_reason, on the same head at the same instant (whether
    # or not it is due already).
    due = DueState(created_at=head.created_at, boundary_at=head.boundary_at, metadata=head.metadata)
    python = due_reason(counters_of(head), due, twin.trigger, now)
    assert row["sql_reason"] == (str(python) if python is not None else None), step


async def _write_planned(store: EpisodicStore, conv: UUID, step: dict[str, Any]) -> int | None:
    """The planned event through the store (episodic_write_event): the seq it answers with
    (a retraction: the seq of the message it took back), None when nothing was written."""
    kind = step["kind"]
    if kind == "retract":
        retracted = await store.retract_last(conv)
        return retracted.seq if retracted is not None else None
    if kind == "clear":
        cleared = await store.clear(conv)
        return cleared.seq if cleared is not None else None
    if kind == "usage":
        return (await store.report_usage(conv, step["usage"])).seq
    deleted = await store.delete_conversation(conv)
    return deleted.seq if deleted is not None else None


async def _play(url: str, plan: list[dict[str, Any]], trigger: EpisodicCompactionConfig,
                metadata: dict[str, Any], age: int) -> None:  # fmt: skip
    store = await EpisodicStore.open(url, settings=isolated_settings(), trigger=trigger)
    connection = await asyncpg.connect(asyncpg_dsn(url))
    backend = store._backend
    per_abandoned = abandoned_result_tokens(store.estimator)
    try:
        # created ``age`` days ago, so the age rule has a context to measure (and a clear or a
        # boundary a new one)
        conv = uuid4()
        born = datetime.now(UTC) - timedelta(days=age)
        new = NewConversation(conv, "default", metadata, born)
        assert await backend.create_conversation(new) == "created"
        created = (await store.get_conversation(conv)).created_at
        twin = Twin(conversation_id=conv, created_at=created, metadata=metadata, trigger=trigger)
        for step in plan:
            now = datetime.now(UTC)
            if step["kind"] == "append":
                expected = {
                    None: None,
                    "last": twin.counters.last_seq,
                    "stale": twin.counters.last_seq + 1,
                }[step["expected"]]
                try:
                    batch = prepare_batch(
                        conv,
                        step["messages"],
                        estimator=store.estimator,
                        max_message_bytes=store.max_message_bytes,
                        idempotency_key=step["key"],
                        expected_seq=expected,
                        usage=step["usage"],
                    )
                except ValidationError:
                    continue  # refused before either side sees it
                got = await backend.append(conv, batch, trigger)
                want = twin.append(batch, now)
            elif step["kind"] == "complete_run":
                got = await backend.mark_run_completed(conv, per_abandoned, trigger)
                want = twin.complete_run(per_abandoned, now)
            elif step["kind"] == "attempt":
                # episodic_claim_conversation, then episodic_end_attempt
                claim = await store.claim_conversation(conv, "w1", lease_seconds=60)
                if twin.deleted:
                    assert claim is None
                    continue
                assert claim is not None
                outcome: AttemptOutcome = (
                    "nothing_to_compact"
                    if step["end"].clear_due
                    else "dead"
                    if step["end"].dead
                    else "failed"
                )
                record = AttemptRecord(
                    conversation_id=conv,
                    attempt_id=uuid4(),
                    tenant_id=claim.tenant_id,
                    worker="w1",
                    reason=claim.reason,
                    outcome=outcome,
                    started_at=now,
                    finished_at=now,
                    error=step["error"],
                )
                ended = await store.end_attempt(claim, step["end"], record)
                assert ended == end_attempt_outcome(outcome, found=True, held=True)
                twin.attempt(step["end"], step["error"], now)
                event(f"attempt: {ended}")
                _compare_heads(twin, await _head_row(connection, conv, trigger, now), now, step)
                continue
            elif step["kind"] in PLANNED_KINDS:
                # episodic_write_event against write_event_columns, on the same plan
                if twin.deleted:
                    if step["kind"] == "delete":
                        assert await store.delete_conversation(conv) is None
                    else:
                        with pytest.raises(NotFoundError):
                            await _write_planned(store, conv, step)
                    continue
                events = await store.read_events(conv, limit=10_000)
                tail = [e for e in events if e.seq > twin.counters.covers_through_seq]
                planned = twin.plan(step, tail, now)
                written = await _write_planned(store, conv, step)
                if planned is None:
                    assert written is None, step
                else:
                    target = planned.retracted if step["kind"] == "retract" else planned.event
                    assert target is not None
                    assert written == target.seq, step
                    twin.write_planned(planned, now)
                event(f"{step['kind']}: {'written' if planned is not None else 'nothing'}")
                _compare_heads(twin, await _head_row(connection, conv, trigger, now), now, step)
                continue
            else:
                if twin.deleted:
                    with pytest.raises(NotFoundError):
                        await store.write_boundary(conv, GONE_BOUNDARY)
                    continue
                events = await store.read_events(conv, limit=10_000)
                cut = safe_cut(events)
                if cut <= twin.counters.covers_through_seq:
                    continue
                boundary = await store.write_boundary(
                    conv,
                    BoundaryRequest(
                        summary="handoff",
                        covers_through_seq=cut,
                        reason="manual_recovery",
                        expected_boundary_seq=twin.counters.boundary_seq,
                    ),
                )
                tail = [e for e in events if e.seq > cut]
                twin.counters = twin.counters.after_boundary(boundary, tail)
                twin.due = dict(CLEARED_COMPACTION_STATE)
                twin.boundary_at = boundary.created_at
                row = await _head_row(connection, conv, trigger, now)
                assert {k: row[k] for k in CLEARED_COMPACTION_STATE} == CLEARED_COMPACTION_STATE
                _compare_heads(twin, row, now, step)
                continue
            assert (got.outcome, got.seq, _ids(got.detail)) == (
                want.outcome,
                want.seq,
                _ids(want.detail),
            ), (step, twin.counters)
            event(f"{step['kind']}: {got.outcome}")
            if twin.due.get("due_since") is not None:
                event(f"due: {twin.due['due_reason']}")
            _compare_heads(twin, await _head_row(connection, conv, trigger, now), now, step)
        # The sweep: PostgreSQL's episodic_sweep_due against due.sweep_due_candidate +
        # due_marking.
        row = await _head_row(connection, conv, trigger, datetime.now(UTC))
        counters = counters_of(decode_conversation(dict(row)))
        due = DueState(
            created_at=row["created_at"],
            boundary_at=row["boundary_at"],
            due_since=row["due_since"],
            dead_since=row["dead_since"],
            deleted_at=row["deleted_at"],
            metadata=metadata,
        )
        would = bool(
            sweep_due_candidate(counters, due)
            and due_marking(counters, due, trigger, datetime.now(UTC))
        )
        marked = await connection.fetch(SWEEP_DUE, orjson.dumps(trigger_document(trigger)).decode())
        assert (conv in {r[0] for r in marked}) == would
    finally:
        await connection.close()
        await store.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Where the SQLite backend once wrote what episodic_write_event does not (generated histories
# reach them rarely): after an attempt that cleared the due state, a clear asked the age rule
# from the old context's start (episodic_write_event: from the clear), and a deletion marked the
# conversation due before hiding it (episodic_write_event: it marks nothing).
@example(
    plan=[ONE_USER_MESSAGE, GIVE_UP, {"kind": "clear"}],
    trigger=EpisodicCompactionConfig(trigger_age_days=30, trigger_age_turn_count=1),
    metadata={},
    age=40,
)
@example(
    plan=[ONE_USER_MESSAGE, GIVE_UP, {"kind": "delete"}],
    trigger=EpisodicCompactionConfig(trigger_unfinished_turns=1),
    metadata={},
    age=0,
)
@given(plan=steps, trigger=triggers, metadata=overrides, age=st.sampled_from([0, 2, 40]))
def test_postgres_functions_and_python_twins_agree(
    postgres_url: str,
    plan: list[dict[str, Any]],
    trigger: EpisodicCompactionConfig,
    metadata: dict[str, Any],
    age: int,
) -> None:
    asyncio.run(_play(postgres_url, plan, trigger, metadata, age))


# ---- generated heads, asked at one instant -------------------------------------------------

TENANTS = ("t1", "t2")
#: Where a head's timestamps fall around the instant both sides are asked at: long before, a
#: microsecond before, at it, a microsecond after, long after.
AROUND = (
    timedelta(hours=-2),
    timedelta(microseconds=-1),
    timedelta(0),
    timedelta(microseconds=1),
    timedelta(hours=2),
)
#: The head columns the queue's rules read and write.
QUEUE_COLUMNS = (
    "due_since",
    "due_reason",
    "dead_since",
    "deleted_at",
    "next_attempt_at",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "compaction_attempts",
    "last_error",
)
#: Seconds as both sides turn them into an interval exactly (a lease, a retry).
SECONDS = st.sampled_from([0.0, 0.5, 1.0, 30.0, 3600.0, 86_400.0])

#: the past side of AROUND, up to the instant: a next attempt whose time has come
COME = AROUND[:3]
instant = st.one_of(st.none(), st.sampled_from(AROUND), st.sampled_from(AROUND))
rarely = st.one_of(st.none(), st.none(), st.none(), st.none(), st.sampled_from(AROUND))


def head_spec(**fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A head's queue columns (and what the sweep reads), as offsets from the instant;
    ``fixed`` replaces a column's strategy. Leaning to claimable heads, which need every
    column to agree."""
    columns: dict[str, st.SearchStrategy[Any]] = {
        "tenant_id": st.sampled_from(TENANTS),
        "due_since": instant,
        "due_reason": st.sampled_from([None, "context_pressure"]),
        "dead_since": rarely,
        "deleted_at": rarely,
        "next_attempt_at": st.one_of(st.none(), st.sampled_from(AROUND), st.sampled_from(COME)),
        "lease_expires_at": st.one_of(st.none(), st.none(), st.sampled_from(AROUND)),
        "compaction_attempts": st.integers(0, 3),
        "last_error": st.sampled_from([None, "boom"]),
        # what the sweep looks at
        "last_seq": st.integers(0, 3),
        "boundary_seq": st.sampled_from([None, 1, 2]),
        "user_messages_since_run_completed": st.integers(0, 2),
    }
    return st.fixed_dictionaries({**columns, **fixed})


head_specs = st.lists(head_spec(), min_size=1, max_size=8)
heads_settings = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


#: The head-row twins compare the SQL and Python at one instant, PostgreSQL's now() in one
#: transaction. On Citus a delegated function runs in its node's own transaction, whose now()
#: is later than the coordinator's, so the instant is not one there; the twin test over
#: generated histories (above) runs on the Citus lane.
at_one_instant_only = pytest.mark.skipif(
    citus_lane(), reason="compares at one transaction's now(), which a Citus cluster has not"
)


@asynccontextmanager
async def _at_one_instant(url: str) -> AsyncIterator[tuple[asyncpg.Connection, datetime]]:
    """A connection in a transaction, rolled back at the end, and its instant: PostgreSQL's
    ``now()`` throughout it."""
    connection = await asyncpg.connect(asyncpg_dsn(url))
    transaction = connection.transaction()
    await transaction.start()
    try:
        yield connection, await connection.fetchval("SELECT now()")
    finally:
        await transaction.rollback()
        await connection.close()


async def _insert_heads(
    connection: asyncpg.Connection, specs: Sequence[dict[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """The heads the specs describe, written as they are (timestamps around ``now``; a lease
    held by "w0" when it has an end): their rows, as written."""
    rows = []
    for spec in specs:
        row = {
            "conversation_id": uuid4(),
            **{k: (now + v if isinstance(v, timedelta) else v) for k, v in spec.items()},
            "created_at": now,
            "lease_owner": "w0" if spec["lease_expires_at"] is not None else None,
            "lease_token": uuid4() if spec["lease_expires_at"] is not None else None,
        }
        names = ", ".join(row)
        values = ", ".join(f"${i}" for i in range(1, len(row) + 1))
        await connection.execute(
            "INSERT INTO episodic_conversations (metadata, open_tool_calls, "
            f"{names}) VALUES ('{{}}', '{{}}', {values})",
            *row.values(),
        )
        rows.append(row)
    return rows


async def _heads_now(connection: asyncpg.Connection, ids: Sequence[UUID]) -> dict[UUID, Any]:
    found = await connection.fetch(
        "SELECT * FROM episodic_conversations WHERE conversation_id = ANY($1::uuid[])", list(ids)
    )
    return {UUID(str(row["conversation_id"])): row for row in found}


def _columns(row: Any, names: Sequence[str] = QUEUE_COLUMNS) -> dict[str, Any]:
    """A head's ``names``, uuids as uuid.UUID (asyncpg has its own type)."""
    return {
        name: UUID(str(row[name])) if isinstance(row[name], UUID) else row[name] for name in names
    }


def _scoped(rows: Sequence[dict[str, Any]], scope: str | None) -> list[dict[str, Any]]:
    return [row for row in rows if scope is None or row["tenant_id"] == scope]


@at_one_instant_only
@heads_settings
@given(
    specs=head_specs,
    limit=st.integers(1, 7),
    scope=st.sampled_from([None, "t1"]),
    lease=SECONDS.filter(bool),
)
def test_episodic_claim_takes_what_claimable_says(
    postgres_url: str,
    specs: list[dict[str, Any]],
    limit: int,
    scope: str | None,
    lease: float,
) -> None:
    async def check() -> None:
        async with _at_one_instant(postgres_url) as (connection, now):
            rows = await _insert_heads(connection, specs, now)
            claimed = await connection.fetch(CLAIM, limit, "w1", lease, scope)
            after = await _heads_now(connection, [row["conversation_id"] for row in rows])
        by_id = {row["conversation_id"]: row for row in rows}
        took = {UUID(str(r["conversation_id"])): r for r in claimed}
        can = [r for r in _scoped(rows, scope) if claimable(QueueHead.of(r), now)]
        event(f"claimable: {len(can)}, limit {limit}")
        assert set(took) <= {r["conversation_id"] for r in can}
        assert len(took) == min(limit, len(can))
        # the earliest next attempts first
        if took:
            latest = max(by_id[cid]["next_attempt_at"] for cid in took)
            assert all(
                r["next_attempt_at"] >= latest for r in can if r["conversation_id"] not in took
            )
        for cid, row in by_id.items():
            if cid not in took:
                assert _columns(after[cid]) == _columns(row)
                continue
            answer = took[cid]
            token = UUID(str(answer["lease_token"]))
            written = claim_columns(
                QueueHead.of(row), owner="w1", token=token, lease_seconds=lease, now=now
            )
            assert _columns(after[cid]) == _columns({**row, **written})
            assert answer["claimed_at"] == now
            assert answer["compaction_attempts"] == written["compaction_attempts"]
            assert answer["lease_expires_at"] == written["lease_expires_at"]

    asyncio.run(check())


@at_one_instant_only
@heads_settings
@given(
    specs=head_specs,
    pick=st.integers(0, 7),
    scope=st.sampled_from([None, "t1"]),
    lease=SECONDS.filter(bool),
)
def test_episodic_claim_conversation_takes_what_claimable_by_hand_says(
    postgres_url: str,
    specs: list[dict[str, Any]],
    pick: int,
    scope: str | None,
    lease: float,
) -> None:
    async def check() -> None:
        async with _at_one_instant(postgres_url) as (connection, now):
            rows = await _insert_heads(connection, specs, now)
            row = rows[pick % len(rows)]
            cid = row["conversation_id"]
            answer = await connection.fetchrow(
                CLAIM_CONVERSATION, cid, "w1", lease, "manual_recovery", scope
            )
            after = (await _heads_now(connection, [cid]))[cid]
        one = QueueHead.of(row)
        can = claimable_by_hand(one, now) and (scope is None or row["tenant_id"] == scope)
        event(f"claimable by hand: {can}")
        assert (answer is not None) == can
        if answer is None:
            assert _columns(after) == _columns(row)
            return
        written = claim_conversation_columns(
            one,
            owner="w1",
            token=UUID(str(answer["lease_token"])),
            lease_seconds=lease,
            reason="manual_recovery",
            now=now,
        )
        assert _columns(after) == _columns({**row, **written})
        assert answer["due_reason"] == "manual_recovery"
        assert answer["compaction_attempts"] == written["compaction_attempts"]

    asyncio.run(check())


@at_one_instant_only
@heads_settings
@given(
    # a lease, the ending worker's or not
    spec=head_spec(lease_expires_at=st.sampled_from(AROUND)),
    fence=st.sampled_from(["held", "held", "held", "another", "gone", "other_tenant"]),
    end=st.builds(AttemptEnd, retry_in=SECONDS, dead=st.booleans(), clear_due=st.booleans()),
    error=st.sampled_from([None, "boom"]),
    outcome=st.sampled_from(["failed", "dead", "released", "nothing_to_compact", "fallback"]),
)
def test_episodic_end_attempt_writes_what_end_attempt_columns_says(
    postgres_url: str,
    spec: dict[str, Any],
    fence: str,
    end: AttemptEnd,
    error: str | None,
    outcome: AttemptOutcome,
) -> None:
    async def check() -> None:
        async with _at_one_instant(postgres_url) as (connection, now):
            (row,) = await _insert_heads(connection, [spec], now)
            cid = row["conversation_id"] if fence != "gone" else uuid4()
            token = row["lease_token"] if fence == "held" else uuid4()
            tenant = row["tenant_id"] if fence != "other_tenant" else "t3"
            attempt = AttemptRecord(
                conversation_id=cid,
                attempt_id=uuid4(),
                tenant_id=tenant,
                worker="w1",
                reason="context_pressure",
                outcome=outcome,
                started_at=now - timedelta(seconds=5),
                finished_at=now - timedelta(seconds=1),
                error=error,
            )
            answered = await connection.fetchval(
                END_ATTEMPT,
                cid,
                token,
                end.clear_due,
                end.retry_in,
                end.dead,
                orjson.dumps(attempt.row()).decode(),
                None,
            )
            after = (await _heads_now(connection, [row["conversation_id"]]))[row["conversation_id"]]
            recorded = await connection.fetchrow(
                "SELECT outcome, finished_at FROM episodic_compaction_attempts"
                " WHERE attempt_id = $1",
                attempt.attempt_id,
            )
        found = fence in ("held", "another")
        held = found and token is not None and token == row["lease_token"]
        want = end_attempt_outcome(outcome, found=found, held=held)
        event(f"end attempt: {want}")
        assert answered == want
        if want == "gone":
            assert recorded is None
        else:
            assert (recorded["outcome"], recorded["finished_at"]) == (want, now)
        written = end_attempt_columns(end, error=error, now=now) if held else {}
        assert _columns(after) == _columns({**row, **written})

    asyncio.run(check())


@at_one_instant_only
@heads_settings
@given(specs=head_specs, limit=st.integers(0, 7), scope=st.sampled_from([None, "t1"]))
def test_the_queue_query_lists_what_queue_state_and_queue_order_say(
    postgres_url: str, specs: list[dict[str, Any]], limit: int, scope: str | None
) -> None:
    async def check() -> None:
        async with _at_one_instant(postgres_url) as (connection, now):
            rows = await _insert_heads(connection, specs, now)
            listed = await connection.fetch(QUEUE, limit, scope)
            counted = await connection.fetchrow(QUEUE_COUNTS, scope)
        heads = [QueueHead.of(row) for row in _scoped(rows, scope)]
        queued = sorted((h for h in heads if in_queue(h, now)), key=lambda h: queue_order(h, now))
        assert [(UUID(str(r["conversation_id"])), r["state"]) for r in listed] == [
            (h.conversation_id, queue_state(h, now)) for h in queued[:limit]
        ]
        assert dict(counted) == queue_counts(heads, now)
        for h in queued[:limit]:
            event(f"queue: {queue_state(h, now)}")

    asyncio.run(check())


@at_one_instant_only
@heads_settings
@given(specs=head_specs)
def test_episodic_sweep_due_marks_what_sweep_due_candidate_says(
    postgres_url: str, specs: list[dict[str, Any]]
) -> None:
    """Pair 5 on heads the history never makes: due, dead or deleted ones."""
    trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)

    async def check() -> None:
        async with _at_one_instant(postgres_url) as (connection, now):
            rows = await _insert_heads(connection, specs, now)
            marked = await connection.fetch(
                SWEEP_DUE, orjson.dumps(trigger_document(trigger)).decode()
            )
        want = set()
        for row in rows:
            counters = HeadCounters(
                last_seq=row["last_seq"],
                boundary_seq=row["boundary_seq"],
                user_messages_since_run_completed=row["user_messages_since_run_completed"],
            )
            due = DueState(
                created_at=row["created_at"],
                due_since=row["due_since"],
                dead_since=row["dead_since"],
                deleted_at=row["deleted_at"],
            )
            if sweep_due_candidate(counters, due) and due_marking(counters, due, trigger, now):
                want.add(row["conversation_id"])
        event(f"swept: {len(want)}")
        assert {UUID(str(r[0])) for r in marked} == want

    asyncio.run(check())


@at_one_instant_only
async def test_episodic_create_conversation_answers_what_create_conversation_outcome_says(
    postgres_url: str,
) -> None:
    """Every case: the id free or held (by this tenant or another), a tombstone of it in this
    tenant, in another, in both or in none, reuse asked or not."""
    cases = itertools.product(
        [None, "t1", "t2"], [(), ("t1",), ("t2",), ("t1", "t2")], [False, True]
    )
    for held_by, tombstones, reuse in cases:
        async with _at_one_instant(postgres_url) as (connection, now):
            cid = uuid4()
            if held_by is not None:
                held = {"conversation_id": cid, "tenant_id": held_by, "lease_expires_at": None}
                await _insert_heads(connection, [held], now)
            for tenant in tombstones:
                await connection.execute(
                    "INSERT INTO episodic_erasures (erasure_id, tenant_id, conversation_id,"
                    " reason, conversations, events, compaction_attempts, shared_states,"
                    " erased_at, erased_by) VALUES ($1, $2, $3, 'test', 1, 0, 0, 0, $4, 'test')",
                    uuid4(),
                    tenant,
                    cid,
                    now,
                )
            try:
                async with connection.transaction():
                    answered = await connection.fetchval(
                        CREATE_CONVERSATION,
                        cid,
                        "t1",
                        now,
                        "{}",
                        None,
                        None,
                        None,
                        None,
                        None,
                        reuse,
                    )
            except asyncpg.PostgresError as exc:
                if exc.sqlstate != ERASED_SQLSTATE:
                    raise
                answered = "erased"
        want = create_conversation_outcome(
            taken=held_by is not None, erased="t1" in tombstones, reuse_erased=reuse
        )
        assert answered == want, (held_by, tombstones, reuse)


def _function(name: str) -> str:
    """The text of one function in schema.sql, from CREATE FUNCTION to its end."""
    text = schema_sql()
    start = text.index(f"CREATE FUNCTION {name}(")
    return text[start : text.index("$fn$;", start)]


def test_episodic_claim_writes_its_predicate_twice_as_claimable_says() -> None:
    """episodic_claim asks its predicate twice (the pick of candidates, and each again under
    its row lock), and a behaviour test cannot tell the copies apart (with no other worker,
    the re-check never refuses). Both copies are this text: attempts.claimable, clause by
    clause, and the scope."""
    claimable_sql = (
        "c.due_since IS NOT NULL AND c.dead_since IS NULL AND c.deleted_at IS NULL"
        " AND c.next_attempt_at <= now()"
        " AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())"
        " AND (p_scope IS NULL OR c.tenant_id = p_scope)"
    )
    copies = re.findall(
        r"c\.due_since IS NOT NULL.*?c\.tenant_id = p_scope\)", _function("episodic_claim"), re.S
    )
    assert [" ".join(copy.split()) for copy in copies] == [claimable_sql, claimable_sql]
