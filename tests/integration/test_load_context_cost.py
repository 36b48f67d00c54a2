"""On PostgreSQL, load_context is one statement that reads only the rows it returns."""

from __future__ import annotations

import re

import asyncpg
import orjson
import pytest
from sqlalchemy.engine import make_url

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall
from episodic.store.postgres.queries import LOAD_TAIL, TAIL_RANGE, schema_sql
from tests.support import store_through_proxy


def test_tail_range_is_the_query_episodic_load_tail_runs() -> None:
    """The plan tests explain TAIL_RANGE: it must be the function's own query (the head's two
    columns left out, its bounds renumbered from $3-$5 to $1-$3), or they prove nothing."""
    executed = re.search(
        r"RETURN QUERY EXECUTE\s+'SELECT \$1, \$2, (.*?)'", schema_sql(), re.DOTALL
    )
    assert executed is not None, "episodic_load_tail's EXECUTE is not where it was"
    query = re.sub(r"\$([345])", lambda m: f"${int(m.group(1)) - 2}", executed.group(1))
    assert " ".join(query.split()) == " ".join(TAIL_RANGE.split()).removeprefix("SELECT ")


async def _long_conversation(store: EpisodicStore, *, events: int, tail: int) -> object:
    conv = await store.create_conversation()
    batch = []
    for i in range(1_000):
        if i % 10 == 0:
            batch.append(Message.assistant(None, tool_calls=[ToolCall(id=f"c{i}", name="run")]))
        elif i % 10 == 1:
            batch.append(Message.tool_result(f"c{i - 1}", "ok " * 50, name="run"))
        else:
            batch.append(Message.user(f"message {i} " + "x" * 200))
    for _ in range(events // 1_000):
        await store.append(conv, batch)
    head = await store.get_conversation(conv)
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="summary of everything so far",
            covers_through_seq=head.last_seq,
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conv, [Message.user(f"tail {i}") for i in range(tail)])
    return conv


async def test_load_context_is_one_round_trip(postgres_url: str) -> None:
    async with store_through_proxy(postgres_url) as (store, counter):
        conv = await _long_conversation(store, events=2_000, tail=20)
        await store.load_context(conv)  # prepares the statement on this connection
        before = counter.round_trips
        ctx = await store.load_context(conv)
        assert counter.round_trips - before == 1
        assert len(ctx.messages) == 21


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed", "never-analyzed"])
@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_load_context_reads_only_the_rows_it_returns(
    pg_store: EpisodicStore, plan_mode: str, analyzed: bool
) -> None:
    conv = await _long_conversation(pg_store, events=5_000, tail=50)
    head = await pg_store.get_conversation(conv)
    connection = await _connect(pg_store)
    try:
        if analyzed:
            await connection.execute("ANALYZE episodic_events")
            await connection.execute("ANALYZE episodic_conversations")
        await connection.execute(f"SET plan_cache_mode = {plan_mode}")
        # The range query load_context runs, as PostgreSQL plans it.
        raw = await connection.fetchval(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {TAIL_RANGE}",
            conv,
            head.covers_through_seq,
            head.last_seq,
        )
        # And what load_context's statement reads, counted by PostgreSQL itself.
        fetched, scanned = await _rows_read(connection, conv)
    finally:
        await connection.close()
    nodes = _nodes(orjson.loads(raw)[0]["Plan"])
    reads = [n for n in nodes if n.get("Relation Name") == "episodic_events"]
    assert len(reads) == 1, nodes
    read = reads[0]
    assert read["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), nodes
    index_nodes = [read, *_nodes(read)[1:]]
    assert any(n.get("Index Name") == "pk_episodic_events" for n in index_nodes), nodes
    # The boundary and the 50 tail messages: nothing older is read.
    assert read["Actual Rows"] * read["Actual Loops"] == 51
    assert (fetched, scanned) == (51, 0)


async def test_a_statement_prepared_while_the_table_was_tiny_still_reads_only_the_tail(
    pg_store: EpisodicStore,
) -> None:
    """A pooled connection prepares load_context's statement while episodic_events is nearly
    empty and keeps it; the table then grows. It must still read only the tail (a cached
    generic plan once scanned a conversation's every event and filtered them by seq)."""
    conv = await pg_store.create_conversation()
    await pg_store.append(conv, [Message.user("first")])
    connection = await _connect(pg_store)
    try:
        statement = await connection.prepare(LOAD_TAIL)
        for _ in range(8):  # past the five custom plans, so a generic plan would be cached
            await statement.fetch(conv, None)
        await _grow_behind_boundary(pg_store, conv, events=5_000, tail=50)
        fetched, scanned = await _rows_read(connection, conv, statement.fetch)
    finally:
        await connection.close()
    assert (fetched, scanned) == (51, 0)


async def _connect(store: EpisodicStore) -> asyncpg.Connection:
    dsn = make_url(pg_store_url(store)).set(drivername="postgresql")
    return await asyncpg.connect(dsn.render_as_string(hide_password=False))


async def _rows_read(
    connection: asyncpg.Connection, conv: object, fetch: object = None
) -> tuple[int, int]:
    """Rows of episodic_events fetched through indexes and read by sequential scans while
    load_context's statement runs, from PostgreSQL's own per-transaction counters."""
    counters = (
        "SELECT idx_tup_fetch, seq_tup_read FROM pg_stat_xact_user_tables "
        "WHERE relname = 'episodic_events'"
    )
    async with connection.transaction():
        # Differences within one transaction: the view may also hold counts of earlier
        # statements not yet flushed to the cumulative statistics.
        before = await connection.fetchrow(counters)
        if fetch is None:
            rows = await connection.fetch(LOAD_TAIL, conv, None)
        else:
            rows = await fetch(conv, None)  # type: ignore[operator]
        after = await connection.fetchrow(counters)
    assert len(rows) == 51
    return (
        after["idx_tup_fetch"] - before["idx_tup_fetch"],
        after["seq_tup_read"] - before["seq_tup_read"],
    )


async def _grow_behind_boundary(
    store: EpisodicStore, conv: object, *, events: int, tail: int
) -> None:
    batch = [Message.user(f"message {i} " + "x" * 200) for i in range(1_000)]
    for _ in range(events // 1_000):
        await store.append(conv, batch)  # type: ignore[arg-type]
    head = await store.get_conversation(conv)  # type: ignore[arg-type]
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary="summary",
            covers_through_seq=head.last_seq,
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conv, [Message.user(f"tail {i}") for i in range(tail)])  # type: ignore[arg-type]


def _nodes(plan: dict[str, object]) -> list[dict[str, object]]:
    out = [plan]
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        out.extend(_nodes(child))
    return out


def pg_store_url(store: EpisodicStore) -> str:
    url: str | None = store._backend._url.asyncpg  # type: ignore[attr-defined]
    assert url is not None
    return url
