"""From the floor to ``episodic_append``, one step at a time: the server's CPU of each.

Each step is a plpgsql function that adds one part of what ``episodic_append`` does to the
step before it, on episodic's own tables; the last row is ``episodic_append`` itself, called
as the store calls it. Run by ``python -m bench.profile`` (``synchronous_commit = off``), so
what it measures is the logic, not the disk.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from episodic import EpisodicStore, Message
from episodic.store.batch import PreparedBatch, prepare_batch
from episodic.store.postgres.backend import _init_connection as init_connection
from episodic.store.postgres.backend import trigger_document
from episodic.store.postgres.queries import APPEND

# The floor of an append with episodic's guarantees: a gapless seq taken from a head row that
# also keeps a counter, and the event's row, in one function call (one round trip). No
# idempotency, no tenant, no tool pairing, no due check: what is left of episodic_append once
# everything it does beyond the seq is removed.
FLOOR = """
CREATE TABLE bench_floor_head (
    conversation_id uuid PRIMARY KEY,
    last_seq bigint NOT NULL,
    tokens bigint NOT NULL
) WITH (fillfactor = 70);
CREATE TABLE bench_floor_events (
    conversation_id uuid NOT NULL,
    seq bigint NOT NULL,
    payload jsonb NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE FUNCTION bench_floor_append(p_conversation_id uuid, p_payload jsonb, p_tokens int)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
BEGIN
    UPDATE bench_floor_head SET last_seq = last_seq + 1, tokens = tokens + p_tokens
     WHERE conversation_id = p_conversation_id
    RETURNING last_seq INTO v_seq;
    INSERT INTO bench_floor_events VALUES (p_conversation_id, v_seq, p_payload);
    RETURN v_seq;
END
$$;
"""
FLOOR_APPEND = "SELECT bench_floor_append($1, $2, $3)"

_DECLARE = (
    "v_seq bigint; v_tenant text; v_last bigint; v_open jsonb; v_head episodic_conversations;"
)
_LOCKED = (
    "SELECT c.tenant_id, c.last_seq, c.open_tool_calls INTO v_tenant, v_last, v_open"
    " FROM episodic_conversations c WHERE c.conversation_id = p_c FOR UPDATE;"
)
_INSERT_ONE = (
    "INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at,"
    " token_estimate, payload) VALUES (p_c, v_last + 1, v_tenant, 'message', now(), p_t, p_p);"
)
_INSERT_BATCH = """
INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at, token_estimate,
                             payload, client_id, usage, idempotency_key, request_hash, batch_size)
SELECT p_c, v_last + t.i, v_tenant, 'message', now(), t.tokens, t.payload, t.client_id,
       NULL, NULL, CASE WHEN t.i = 1 THEN 'hash' END, CASE WHEN t.i = 1 THEN 1 END
  FROM unnest(ARRAY[p_p], ARRAY[p_t], NULL::text[]) WITH ORDINALITY AS t(payload, tokens,
                                                                        client_id, i);"""
_COUNTERS = """
UPDATE episodic_conversations c SET
    last_seq = v_last + 1,
    total_user_messages = c.total_user_messages + 1,
    user_messages_since_boundary = c.user_messages_since_boundary + 1,
    user_messages_since_run_completed = c.user_messages_since_run_completed + 1,
    context_tokens = c.context_tokens + p_t,
    tokens_since_usage = c.tokens_since_usage + p_t,
    open_tool_calls = v_open
 WHERE c.conversation_id = p_c
RETURNING c.* INTO v_head;"""
_DUE = (
    "IF v_head.due_since IS NULL AND v_head.dead_since IS NULL"
    " AND episodic_trigger_reason(v_head, p_trig, now()) IS NOT NULL THEN"
    " PERFORM episodic_mark_due(v_head, p_trig); END IF;"
)

# (function, what it adds, body)
STEPS: tuple[tuple[str, str, str], ...] = (
    (
        "bench_step_1",
        "one UPDATE ... RETURNING of the head's seq, one INSERT, on episodic's tables",
        "UPDATE episodic_conversations c SET last_seq = c.last_seq + 1"
        " WHERE c.conversation_id = p_c RETURNING c.last_seq - 1, c.tenant_id"
        " INTO v_last, v_tenant;" + _INSERT_ONE,
    ),
    (
        "bench_step_2",
        "+ the head locked and read first (the checks need it before the write)",
        _LOCKED + _INSERT_ONE + "UPDATE episodic_conversations c SET last_seq = v_last + 1"
        " WHERE c.conversation_id = p_c;",
    ),
    (
        "bench_step_3",
        "+ every counter updated, the head returned",
        _LOCKED + _INSERT_ONE + _COUNTERS,
    ),
    ("bench_step_4", "+ the batch's INSERT from arrays", _LOCKED + _INSERT_BATCH + _COUNTERS),
    ("bench_step_5", "+ the due check", _LOCKED + _INSERT_BATCH + _COUNTERS + _DUE),
    (
        "bench_step_6",
        "+ the outcome as a row (RETURNS TABLE, RETURN QUERY)",
        _LOCKED + _INSERT_BATCH + _COUNTERS + _DUE,
    ),
)
_OUTCOME = "TABLE(o_outcome text, o_seq bigint, o_created_at timestamptz, o_detail text)"

SQL = "\n".join(
    f"CREATE FUNCTION {name}(p_c uuid, p_p text, p_t int, p_trig jsonb)"
    f" RETURNS {_OUTCOME if name == 'bench_step_6' else 'bigint'}"
    f" LANGUAGE plpgsql AS $$ DECLARE {_DECLARE} BEGIN {body} "
    + (
        "RETURN QUERY SELECT 'appended'::text, v_last + 1, now(), NULL::text;"
        if name == "bench_step_6"
        else "RETURN v_last + 1;"
    )
    + " END $$;"
    for name, _, body in STEPS
)


@dataclass(frozen=True)
class Step:
    what: str
    server_us: float  # median over the rounds
    wall_us: float


async def build_up(
    store: EpisodicStore,
    url: str,
    server_cpu: Callable[[int], float | None],
    calls: int,
    rounds: int = 4,
) -> list[Step]:
    """The steps, interleaved over ``rounds`` so they share the machine's noise, on one
    connection with episodic's codecs (``server_cpu(pid)``: its backend's CPU so far, µs)."""
    conn = await asyncpg.connect(url)
    try:
        await init_connection(conn)
        await conn.execute(SQL)
        return await _measure(store, conn, server_cpu, calls, rounds)
    finally:
        await conn.close()


async def _measure(
    store: EpisodicStore,
    conn: asyncpg.Connection,
    server_cpu: Callable[[int], float | None],
    calls: int,
    rounds: int,
) -> list[Step]:
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    floor_conv = uuid4()
    await conn.execute("INSERT INTO bench_floor_head VALUES ($1, 0, 0)", floor_conv)
    messages = [Message.user(f"message {i} " * 5) for i in range(64)]
    trigger = trigger_document(store.trigger)

    def batches(conv: UUID) -> list[PreparedBatch]:
        return [
            prepare_batch(
                conv, [m], estimator=store.estimator, max_message_bytes=store.max_message_bytes
            )
            for m in messages
        ]

    def step(name: str) -> Callable[[UUID, PreparedBatch], Awaitable[Any]]:
        query = (
            f"SELECT o_outcome, o_seq, o_created_at, o_detail FROM {name}($1, $2, $3, $4)"
            if name == "bench_step_6"
            else f"SELECT {name}($1, $2, $3, $4)"
        )
        return lambda conv, b: conn.fetchrow(
            query, conv, b.payloads[0], b.token_estimates[0], trigger
        )

    def append(conv: UUID, b: PreparedBatch) -> Awaitable[Any]:
        return conn.fetchrow(
            APPEND, conv, None, None, b.request_hash, b.payloads, b.token_estimates, None,
            None, None, b.user_messages, b.token_sum, None, None, None, None, trigger, None,
        )  # fmt: skip

    calls_by_step: list[tuple[str, Callable[[UUID, PreparedBatch], Awaitable[Any]]]] = [
        ("floor: head UPDATE (gapless seq) + INSERT on 3-column tables",
         lambda c, b: conn.fetchval(FLOOR_APPEND, floor_conv, b.payloads[0], 12)),
        *((what, step(name)) for name, what, _ in STEPS),
        ("+ the rest: idempotency, conflict and tool checks, 17 named arguments "
         "(episodic_append as the store calls it)", append),
    ]  # fmt: skip
    samples: dict[str, list[tuple[float, float]]] = {what: [] for what, _ in calls_by_step}
    for _ in range(rounds):
        for what, call in calls_by_step:
            conv = await store.create_conversation(tenant_id="bench")
            prepared = batches(conv)
            for i in range(20):
                await call(conv, prepared[i % 64])
            server0, wall0 = server_cpu(pid), time.perf_counter()
            for i in range(calls):
                await call(conv, prepared[i % 64])
            wall, server1 = time.perf_counter() - wall0, server_cpu(pid)
            server = (server1 - server0) / calls if server0 is not None and server1 else 0.0
            samples[what].append((server, wall * 1e6 / calls))
    return [
        Step(
            what,
            statistics.median(s for s, _ in values),
            statistics.median(w for _, w in values),
        )
        for what, values in samples.items()
    ]


def table(steps: list[Step]) -> str:
    rows = []
    previous: float | None = None
    for s in steps:
        added = f"{s.server_us - previous:+,.0f}" if previous is not None else ""
        rows.append(f"| {s.what} | {s.server_us:,.0f} | {added} | {s.wall_us:,.0f} |")
        previous = s.server_us
    return "| step | server CPU µs | added | wall µs |\n|---|---:|---:|---:|\n" + "\n".join(rows)
