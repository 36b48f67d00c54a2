"""Python is the spec: the same generated appends, through the Python twins and through
PostgreSQL's functions, give the same answers and leave the same heads.

The twin is built here from the pure functions the SQLite backend runs: ``rules.
append_refusal`` (the refusals, in their order), ``HeadCounters`` (the head fold),
``due.due_marking`` and ``due.due_reason`` (the trigger), ``due.swept`` (which heads the
sweep looks at) and ``due.CLEARED_COMPACTION_STATE`` (what a boundary leaves). PostgreSQL runs
``episodic_append``, ``episodic_mark_run_completed``, ``episodic_trigger_reason``,
``episodic_sweep_due`` and ``episodic_write_boundary`` from ``postgres/schema.sql``. After every
step the outcome (kind, seq, the offending id) and the whole head (counters, open calls, due
state) are compared, and so is the trigger's answer each side gives on that head.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall, Usage, ValidationError
from episodic.policy import EpisodicCompactionConfig, safe_cut
from episodic.store.batch import PreparedBatch, prepare_batch
from episodic.store.codec import decode_conversation
from episodic.store.due import CLEARED_COMPACTION_STATE, due_marking, due_reason, swept
from episodic.store.postgres.backend import trigger_document
from episodic.store.projection import HeadCounters, abandoned_result_tokens, counters_of
from episodic.store.rules import PriorBatch, WriteOutcome, append_refusal
from tests.conftest import isolated_settings
from tests.support import asyncpg_dsn

CALL_IDS = ("t1", "t2", "t3")
KEYS = (None, None, "k1", "k2")
CLIENT_IDS = (None, "m1", "m1", "m2")
DUE_COLUMNS = ("due_reason", "compaction_attempts", "last_error", "lease_token", "dead_since")


@dataclass
class Twin:
    """The conversation as the Python rules see it."""

    created_at: datetime
    metadata: dict[str, Any]
    trigger: EpisodicCompactionConfig
    counters: HeadCounters = field(default_factory=HeadCounters)
    due: dict[str, Any] = field(default_factory=dict)
    boundary_at: datetime | None = None
    #: per stored batch: its key, request hash and first seq; every client id; abandoned calls
    keyed: dict[str, PriorBatch] = field(default_factory=dict)
    client_ids: set[str] = field(default_factory=set)
    abandoned: list[str] = field(default_factory=list)

    def mark_due(self, now: datetime) -> None:
        self.due.update(
            due_marking(
                self.counters,
                due_since=self.due.get("due_since"),
                dead_since=None,
                created_at=self.created_at,
                boundary_at=self.boundary_at,
                metadata=self.metadata,
                default=self.trigger,
                now=now,
            )
        )

    def append(self, batch: PreparedBatch, now: datetime) -> WriteOutcome:
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
        abandoned = self.counters.abandoned_ids()
        self.abandoned.extend(abandoned)
        seq = self.counters.last_seq + 1
        self.counters = self.counters.after_run_completed(
            seq=seq, token_estimate=tokens_per_abandoned * len(abandoned)
        )
        self.mark_due(now)
        return WriteOutcome("appended", seq=seq, detail=orjson.dumps(abandoned).decode())


# ---- generated steps ------------------------------------------------------------------------

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
steps = st.lists(
    st.one_of(
        append_step,
        append_step,
        append_step,
        st.just({"kind": "complete_run"}),
        st.just({"kind": "boundary"}),
    ),
    min_size=1,
    max_size=20,
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
    # episodic_trigger_reason and due_reason, on the same head at the same instant (whether
    # or not it is due already).
    python = due_reason(
        counters_of(head),
        created_at=head.created_at,
        boundary_at=head.boundary_at,
        metadata=head.metadata,
        default=twin.trigger,
        now=now,
    )
    assert row["sql_reason"] == (str(python) if python is not None else None), step


async def _play(url: str, plan: list[dict[str, Any]], trigger: EpisodicCompactionConfig,
                metadata: dict[str, Any]) -> None:  # fmt: skip
    store = await EpisodicStore.open(url, settings=isolated_settings(), trigger=trigger)
    connection = await asyncpg.connect(asyncpg_dsn(url))
    backend = store._backend
    per_abandoned = abandoned_result_tokens(store.estimator)
    try:
        conv = await store.create_conversation(metadata=metadata)
        created = (await store.get_conversation(conv)).created_at
        twin = Twin(created_at=created, metadata=metadata, trigger=trigger)
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
            else:
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
        # The sweep: PostgreSQL's episodic_sweep_due against due.swept + due_marking.
        row = await _head_row(connection, conv, trigger, datetime.now(UTC))
        counters = counters_of(decode_conversation(dict(row)))
        would = bool(
            swept(counters, due_since=row["due_since"], dead_since=row["dead_since"])
            and due_marking(
                counters,
                due_since=row["due_since"],
                dead_since=row["dead_since"],
                created_at=row["created_at"],
                boundary_at=row["boundary_at"],
                metadata=metadata,
                default=trigger,
                now=datetime.now(UTC),
            )
        )
        marked = await connection.fetch(
            "SELECT * FROM episodic_sweep_due(p_trigger => $1)",
            orjson.dumps(trigger_document(trigger)).decode(),
        )
        assert (conv in {r[0] for r in marked}) == would
    finally:
        await connection.close()
        await store.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps, trigger=triggers, metadata=overrides)
def test_postgres_functions_and_python_twins_agree(
    postgres_url: str,
    plan: list[dict[str, Any]],
    trigger: EpisodicCompactionConfig,
    metadata: dict[str, Any],
) -> None:
    asyncio.run(_play(postgres_url, plan, trigger, metadata))
