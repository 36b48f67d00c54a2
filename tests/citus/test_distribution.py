"""On Citus, a conversation lives on one node and its request path runs there.

Placement: the coordinator's metadata puts a conversation's head, events and attempts in one
shard group on one worker, and the rows are really there (counted on the workers' shard
tables), nowhere else. Routing: every request-path statement the store sends is delegated to
the node holding the conversation, or at least touches no other node, as Citus itself reports
it (``citus.log_remote_commands`` and the DEBUG1 "pushing down the function call", read off
the wire by a proxy in front of the coordinator). Cost: load_context behind a boundary is one
statement on one node that reads only the tail, whatever the length of the history (its
latency at 1k and 100k events is printed, not asserted).

Runs on the Citus lane only (``pytest --citus``, ``EPISODIC_TEST_CITUS_URL`` set).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import struct
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import asyncpg
import orjson
import pytest
from sqlalchemy.engine import make_url

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall, Usage
from episodic.compaction import CompactionRequest
from episodic.settings import EpisodicSettings
from episodic.store.postgres.queries import (
    APPEND,
    CLAIM,
    CLAIM_CONVERSATION,
    CREATE_CONVERSATION,
    END_ATTEMPT,
    LOAD_TAIL,
    MARK_RUN_COMPLETED,
    READ_HEAD,
    READ_TAIL_AFTER,
    SEARCH_EVENTS,
    TAIL_RANGE,
    WRITE_BOUNDARY,
)
from episodic.summarizers import SummarizerError, SummaryResult
from episodic.worker import CompactionOptions, compact_claimed
from tests.conftest import citus_lane, isolated_settings
from tests.support import RoundTripCounter, asyncpg_dsn
from tests.support_citus import CITUS_URL

pytestmark = pytest.mark.skipif(
    not (citus_lane() and CITUS_URL),
    reason="runs on the Citus lane: pytest --citus with EPISODIC_TEST_CITUS_URL set",
)

CO_LOCATED = ("episodic_conversations", "episodic_events", "episodic_compaction_attempts")

# ---- where a conversation is, from the coordinator's metadata ----------------------------

PLACEMENT = """
SELECT s.shardid, s.shardminvalue, s.shardmaxvalue, n.nodename, n.nodeport
  FROM pg_dist_shard s
  JOIN pg_dist_placement p ON p.shardid = s.shardid
  JOIN pg_dist_node n ON n.groupid = p.groupid
 WHERE s.shardid = get_shard_id_for_distribution_column($1::regclass, $2::uuid)
"""
WORKERS = """
SELECT nodename, nodeport FROM pg_dist_node
 WHERE noderole = 'primary' AND isactive AND groupid <> 0
 ORDER BY nodeport
"""
#: Every shard of a table placed on a node.
SHARDS_ON_NODE = """
SELECT s.shardid
  FROM pg_dist_shard s
  JOIN pg_dist_placement p ON p.shardid = s.shardid
  JOIN pg_dist_node n ON n.groupid = p.groupid
 WHERE s.logicalrelid = $1::regclass AND n.nodeport = $2
 ORDER BY s.shardid
"""


@dataclass(frozen=True)
class Placement:
    shard: int
    hash_range: tuple[str, str]
    host: str
    port: int


async def _placement(db: asyncpg.Connection, table: str, conv: UUID) -> Placement:
    """The one placement of ``conv``'s shard of ``table``."""
    rows = await db.fetch(PLACEMENT, table, conv)
    assert len(rows) == 1, f"{table} shard of {conv} has {len(rows)} placements: {rows}"
    [row] = rows
    return Placement(
        row["shardid"],
        (row["shardminvalue"], row["shardmaxvalue"]),
        row["nodename"],
        row["nodeport"],
    )


async def _workers(db: asyncpg.Connection) -> list[tuple[str, int]]:
    return [(row["nodename"], row["nodeport"]) for row in await db.fetch(WORKERS)]


async def _ids_on_each_worker(db: asyncpg.Connection, per_node: int) -> dict[int, list[UUID]]:
    """Fresh conversation ids, ``per_node`` for each worker (by worker port), as the
    coordinator would place them."""
    workers = await _workers(db)
    assert len(workers) >= 2, f"the cluster has {len(workers)} workers; these tests need two"
    chosen: dict[int, list[UUID]] = {port: [] for _, port in workers}
    for _ in range(500):
        if all(len(ids) >= per_node for ids in chosen.values()):
            break
        conv = uuid.uuid4()
        port = (await _placement(db, "episodic_conversations", conv)).port
        assert port in chosen, f"a conversation shard is placed on {port}, not on a worker"
        if len(chosen[port]) < per_node:
            chosen[port].append(conv)
    assert all(len(ids) >= per_node for ids in chosen.values()), (
        f"500 random ids did not reach every worker: {chosen}; are the shards all on one node?"
    )
    return chosen


def _on_node(url: str, host: str, port: int) -> str:
    """An asyncpg DSN for the test database on another node of the cluster."""
    return asyncpg_dsn(make_url(url).set(host=host, port=port).render_as_string(False))


# ---- the store's traffic as Citus reports it ---------------------------------------------


@dataclass
class Execution:
    """One request the client waited on: the statements it executed, and the notices and
    errors the coordinator sent back before it was ready again."""

    sql: list[str]
    notices: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)

    @property
    def pushed_down(self) -> int:
        return sum(
            n.get("V") == "DEBUG" and n.get("M") == "pushing down the function call"
            for n in self.notices
        )

    @property
    def remote(self) -> list[tuple[str, int]]:
        """(command, node port) of every command the coordinator sent to a node."""
        out = []
        for n in self.notices:
            if n.get("M", "").startswith("issuing "):
                found = re.search(r"on server \S+@[^:\s]+:(\d+)", n.get("D", ""))
                assert found is not None, f"no node in {n}"
                out.append((n["M"].removeprefix("issuing "), int(found.group(1))))
        return out

    @property
    def ports(self) -> set[int]:
        return {port for _, port in self.remote}

    @property
    def local(self) -> list[str]:
        """Commands the coordinator ran on its own placements."""
        return [n["M"] for n in self.notices if n.get("M", "").startswith("executing the command")]

    def describe(self) -> str:
        lines = [f"statement: {' | '.join(s[:120] for s in self.sql)}"]
        lines += [
            f"  {n.get('V')}: {n.get('M', '')[:300]} [{n.get('D', '')}]" for n in self.notices
        ]
        lines += [f"  ERROR: {e.get('M')}" for e in self.errors]
        return "\n".join(lines)


class _Session:
    def __init__(self) -> None:
        self.prepared: dict[str, str] = {}
        self.pending: list[str] = []
        #: the requests sent and not yet answered (a ReadyForQuery each)
        self.waiting: deque[Execution] = deque()
        self.started = False
        self.notices: list[dict[str, str]] = []
        self.errors: list[dict[str, str]] = []


def _cstring(body: bytes, at: int) -> tuple[str, int]:
    end = body.index(b"\0", at)
    return body[at:end].decode(), end + 1


def _fields(body: bytes) -> dict[str, str]:
    return {chr(part[0]): part[1:].decode() for part in body.split(b"\0") if part}


@dataclass
class RoutingTrace(RoundTripCounter):
    """A :class:`RoundTripCounter` that also reads the protocol both ways: the statements
    each request executed (Parse, Bind, Query) and the notices that came back for it."""

    executions: list[Execution] = field(default_factory=list)

    def _new_session(self) -> _Session:
        return _Session()

    def _client_message(self, session: _Session, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            name, at = _cstring(body, 0)
            session.prepared[name] = _cstring(body, at)[0]
        elif kind == b"B":
            statement = _cstring(body, _cstring(body, 0)[1])[0]
            session.pending.append(session.prepared[statement])
        elif kind == b"Q":
            session.pending.append(_cstring(body, 0)[0])
        if kind in (b"S", b"Q"):
            session.waiting.append(Execution(session.pending))
            session.pending = []

    async def _server_to_client(
        self, session: _Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                kind = await reader.readexactly(1)
                (length,) = struct.unpack("!I", await reader.readexactly(4))
                body = await reader.readexactly(length - 4)
                if kind == b"N":
                    session.notices.append(_fields(body))
                elif kind == b"E":
                    session.errors.append(_fields(body))
                elif kind == b"Z":
                    # The first ReadyForQuery ends the startup, not a request.
                    if session.started:
                        done = session.waiting.popleft()
                        done.notices, done.errors = session.notices, session.errors
                        if done.sql:  # not a Parse/Describe only
                            self.executions.append(done)
                    session.started = True
                    session.notices, session.errors = [], []
                writer.write(kind + struct.pack("!I", length) + body)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    def of(self, statement: str) -> list[Execution]:
        return [e for e in self.executions if statement in e.sql]


@asynccontextmanager
async def _traced_store(url: str) -> AsyncIterator[tuple[EpisodicStore, RoutingTrace]]:
    """A store on one connection through a :class:`RoutingTrace`, with the session settings
    that make Citus say where each statement goes."""
    target = make_url(url)
    trace = RoutingTrace(target.host or "127.0.0.1", target.port or 5432)
    port = await trace.start()
    traced = make_url(trace.url_through(url, port)).update_query_dict(
        {"client_min_messages": "debug1", "citus.log_remote_commands": "on"}
    )
    settings = EpisodicSettings(_env_file=None, pool_min_size=1, pool_max_size=1)
    store = await EpisodicStore.open(traced.render_as_string(False), settings=settings)
    try:
        yield store, trace
    finally:
        await store.close()
        await trace.stop()


def _function(statement: str) -> str:
    found = re.search(r"FROM (episodic_\w+)\(", statement)
    assert found is not None, statement
    return found.group(1)


def _assert_delegated(execution: Execution, conv: UUID, port: int) -> None:
    """Citus pushed the call down, whole, to the node at ``port``: one command, there."""
    function = _function(execution.sql[0])
    why = execution.describe()
    assert not execution.errors, why
    assert execution.pushed_down == 1, f"{function} not pushed down:\n{why}"
    [(command, node)] = execution.remote
    assert node == port, f"{function} for {conv} went to {node}, not {port}:\n{why}"
    assert f"public.{function}('{conv}'::uuid" in command, why
    assert not execution.local, why


# ---- the store's traffic -----------------------------------------------------------------


class FakeSummarizer:
    name = "fake"

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        if self.fail:
            raise SummarizerError("the provider is down", summarizer=self.name, retryable=True)
        return SummaryResult(
            text="the summary", usage=Usage(input_tokens=10, output_tokens=5), model="m"
        )


async def _converse(store: EpisodicStore, conv: UUID, turns: int = 2) -> None:
    """Create ``conv`` and give it finished runs: something compaction can cut."""
    await store.create_conversation(conversation_id=conv)
    for turn in range(turns):
        await store.append(
            conv,
            [
                Message.user(f"request {turn}"),
                Message.assistant(None, tool_calls=[ToolCall(id=f"c{turn}", name="run")]),
                Message.tool_result(f"c{turn}", "output " * 20, name="run"),
                Message.assistant(f"answer {turn}"),
            ],
        )
        await store.mark_run_completed(conv)


async def _compact(store: EpisodicStore, conv: UUID, *, fail: bool = False) -> str:
    """One compaction attempt on ``conv``, as the worker makes it; its outcome."""
    claim = await store.claim_conversation(conv, "citus-test", lease_seconds=60)
    assert claim is not None
    result = await compact_claimed(
        store,
        FakeSummarizer(fail=fail),
        claim,
        worker="citus-test",
        options=CompactionOptions(),
    )
    return result.outcome


# ---- 1. placement ------------------------------------------------------------------------


async def test_a_conversations_rows_sit_in_one_shard_group_on_one_worker(
    pg_store: EpisodicStore, db: asyncpg.Connection, postgres_url: str
) -> None:
    placed = await _ids_on_each_worker(db, per_node=3)
    for ids in placed.values():
        for conv in ids:
            await _converse(pg_store, conv)
            assert await _compact(pg_store, conv) == "succeeded"
    # The test database on each worker, where its shards are.
    nodes: dict[int, asyncpg.Connection] = {}
    try:
        for host, port in await _workers(db):
            nodes[port] = await asyncpg.connect(_on_node(postgres_url, host, port))
        for port, ids in placed.items():
            for conv in ids:
                head = await pg_store.get_conversation(conv)
                assert head.boundary_seq is not None
                expected = {
                    "episodic_conversations": 1,
                    "episodic_events": head.last_seq,
                    "episodic_compaction_attempts": 1,
                }
                placements = {t: await _placement(db, t, conv) for t in CO_LOCATED}
                # One shard group: the same hash range, on the same node, for every table.
                assert {p.port for p in placements.values()} == {port}, placements
                assert len({p.hash_range for p in placements.values()}) == 1, placements
                for table, placement in placements.items():
                    # The rows are in that shard, on that worker...
                    here = await nodes[port].fetchval(
                        f"SELECT count(*) FROM {table}_{placement.shard} "
                        "WHERE conversation_id = $1",
                        conv,
                    )
                    assert here == expected[table], (table, conv, port)
                    # ...and in no shard of the table on any other node.
                    for other, connection in nodes.items():
                        if other == port:
                            continue
                        for shard in await db.fetch(SHARDS_ON_NODE, table, other):
                            there = await connection.fetchval(
                                f"SELECT count(*) FROM {table}_{shard['shardid']} "
                                "WHERE conversation_id = $1",
                                conv,
                            )
                            assert there == 0, (table, conv, other)
        # The conversations are spread: every worker holds rows of its three.
        for port, connection in nodes.items():
            shards = [r["shardid"] for r in await db.fetch(SHARDS_ON_NODE, "episodic_events", port)]
            held = set()
            for shard in shards:
                held |= {
                    r[0]
                    for r in await connection.fetch(
                        f"SELECT DISTINCT conversation_id FROM episodic_events_{shard}"
                    )
                }
            assert held == set(placed[port]), (port, held)
    finally:
        for connection in nodes.values():
            await connection.close()


# ---- 2. routing --------------------------------------------------------------------------

#: Request-path statements Citus delegates whole to the conversation's node.
DELEGATED = {
    "create_conversation": CREATE_CONVERSATION,
    "append": APPEND,
    "mark_run_completed": MARK_RUN_COMPLETED,
    "load_context": LOAD_TAIL,
    "claim_conversation": CLAIM_CONVERSATION,
    "boundary: read the head": READ_HEAD,
    "boundary: write": WRITE_BOUNDARY,
}


async def test_each_request_path_statement_runs_on_the_one_node_holding_the_conversation(
    postgres_url: str, db: asyncpg.Connection
) -> None:
    placed = await _ids_on_each_worker(db, per_node=1)
    traced: dict[UUID, list[Execution]] = {}
    async with _traced_store(postgres_url) as (store, trace):
        for [conv] in placed.values():
            start = len(trace.executions)
            await _converse(store, conv)
            # Past the five custom plans: a cached generic plan must be delegated too.
            for _ in range(7):
                await store.load_context(conv)
            assert await _compact(store, conv) == "succeeded"
            traced[conv] = trace.executions[start:]
        # Not the request path: the worker's queue scan reads every head. The control: the
        # trace does see a statement that goes to several nodes.
        await store.claim_due("citus-test", limit=10, lease_seconds=60)
    for port, [conv] in placed.items():
        executions = traced[conv]

        def of(statement: str, executions: list[Execution] = executions) -> list[Execution]:
            return [e for e in executions if statement in e.sql]

        for what, statement in DELEGATED.items():
            assert of(statement), f"{what} ({_function(statement)}) never ran for {conv}"
            for execution in of(statement):
                _assert_delegated(execution, conv, port)
        assert len(of(APPEND)) == 2
        assert len(of(MARK_RUN_COMPLETED)) == 2
        assert len(of(LOAD_TAIL)) == 8  # load_context's and the attempt's load
        # The tail read before the boundary's write: today not delegated (Citus pushes down
        # no call with a WHERE on its rows), so it runs on the coordinator, but its queries
        # go to the conversation's node and shards only.
        [tail] = of(READ_TAIL_AFTER)
        if tail.pushed_down:
            _assert_delegated(tail, conv, port)
            continue
        shards = {(await _placement(db, t, conv)).shard for t in CO_LOCATED}
        assert not tail.errors, tail.describe()
        assert tail.ports == {port}, tail.describe()
        for command, _ in tail.remote:
            assert str(conv) in command, tail.describe()
            touched = {int(s) for s in re.findall(r"episodic_[a-z_]+_(\d+)\b", command)}
            assert touched, tail.describe()
            assert touched <= shards, tail.describe()
    # No statement the store sent went to more than one node, but the worker's queue scan.
    [claim] = trace.of(CLAIM)
    assert claim.ports == set(placed), claim.describe()
    for execution in trace.executions:
        if execution is not claim:
            assert len(execution.ports) <= 1, execution.describe()


async def test_the_end_of_a_failed_attempt_runs_on_the_one_node_holding_the_conversation(
    postgres_url: str, db: asyncpg.Connection
) -> None:
    placed = await _ids_on_each_worker(db, per_node=1)
    async with _traced_store(postgres_url) as (store, trace):
        for port, [conv] in placed.items():
            await _converse(store, conv)
            assert await _compact(store, conv, fail=True) == "failed"
            [end] = trace.of(END_ATTEMPT)[-1:]
            _assert_delegated(end, conv, port)
            head = await store.get_conversation(conv)
            assert head.lease_owner is None
            assert head.last_error is not None


async def test_a_search_runs_on_the_one_node_and_shard_holding_the_conversation(
    postgres_url: str, db: asyncpg.Connection
) -> None:
    """store.search is one statement over the conversation's rows: Citus routes it, whole,
    to the node that holds them, and it reads that conversation's shard only."""
    placed = await _ids_on_each_worker(db, per_node=1)
    async with _traced_store(postgres_url) as (store, trace):
        for port, [conv] in placed.items():
            await _converse(store, conv)
            hits = await store.search(conv, "answer output")
            assert hits, f"nothing found in {conv}"
            [search] = trace.of(SEARCH_EVENTS)[-1:]
            assert not search.errors, search.describe()
            assert search.ports == {port}, search.describe()
            shard = (await _placement(db, "episodic_events", conv)).shard
            for command, _ in search.remote:
                touched = {int(s) for s in re.findall(r"episodic_[a-z_]+_(\d+)\b", command)}
                assert touched == {shard}, search.describe()


# ---- 3. load_context's cost --------------------------------------------------------------

TAIL = 20
SUMMARY = "summary of everything so far"


async def _behind_boundary(store: EpisodicStore, events: int) -> UUID:
    """A conversation with ``events`` messages behind a boundary, then :data:`TAIL` more."""
    conv = await store.create_conversation()
    batch = [Message.user(f"message {i}") for i in range(1_000)]
    for _ in range(events // 1_000):
        await store.append(conv, batch)
    head = await store.get_conversation(conv)
    assert head.last_seq == events
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary=SUMMARY,
            covers_through_seq=head.last_seq,
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conv, [Message.user(f"tail {i}") for i in range(TAIL)])
    return conv


async def _median_load(store: EpisodicStore, conv: UUID, calls: int = 50) -> float:
    await store.load_context(conv)
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        await store.load_context(conv)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


async def test_load_context_behind_a_boundary_costs_the_same_at_1k_and_100k_events(
    postgres_url: str, db: asyncpg.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    store = await EpisodicStore.open(postgres_url, settings=isolated_settings())
    try:
        built = time.perf_counter()
        small = await _behind_boundary(store, 1_000)
        big = await _behind_boundary(store, 100_000)
        built = time.perf_counter() - built
        small_ctx, big_ctx = await store.load_context(small), await store.load_context(big)
        small_median = await _median_load(store, small)
        big_median = await _median_load(store, big)
    finally:
        await store.close()
    # The same context, the boundary's summary and the tail, whatever lies behind it.
    assert len(big_ctx.messages) == TAIL + 1
    assert [m.text for m in big_ctx.messages] == [m.text for m in small_ctx.messages]
    assert SUMMARY in big_ctx.messages[0].text
    assert big_ctx.boundary is not None
    assert big_ctx.boundary.covers_through_seq == 100_000

    # One statement from the client, delegated whole to the conversation's node...
    placement = await _placement(db, "episodic_events", big)
    head = big_ctx.boundary.covers_through_seq, big_ctx.last_seq
    async with _traced_store(postgres_url) as (traced, trace):
        await traced.load_context(big)  # prepares the statement on this connection
        before, seen = trace.round_trips, len(trace.executions)
        ctx = await traced.load_context(big)
        assert trace.round_trips - before == 1
        assert len(ctx.messages) == TAIL + 1
    [load] = trace.executions[seen:]
    assert load.sql == [LOAD_TAIL]
    _assert_delegated(load, big, placement.port)

    # ...where the range it reads is the tail's rows only, through the primary key.
    head_connection = await asyncpg.connect(_on_node(postgres_url, placement.host, placement.port))
    try:
        shard_range = TAIL_RANGE.replace(
            "FROM episodic_events e", f"FROM episodic_events_{placement.shard} e"
        )
        assert shard_range != TAIL_RANGE
        raw = await head_connection.fetchval(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {shard_range}", big, *head
        )
    finally:
        await head_connection.close()
    plan = _nodes(orjson.loads(raw)[0]["Plan"])
    [read] = [n for n in plan if str(n.get("Relation Name", "")).startswith("episodic_events")]
    assert read["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), plan
    assert any(str(n.get("Index Name", "")).startswith("pk_episodic_events") for n in plan), plan
    assert read["Actual Rows"] * read["Actual Loops"] == TAIL + 1, plan

    with capsys.disabled():
        print(
            f"\nload_context on Citus, median of 50 calls behind a boundary: "
            f"1k events {small_median * 1e3:.2f} ms, 100k events {big_median * 1e3:.2f} ms, "
            f"ratio {big_median / small_median:.2f} (history built in {built:.1f} s)"
        )


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_nodes(child))
    return out
