"""On PostgreSQL, load_context is one statement that reads only the rows it returns."""

from __future__ import annotations

import asyncpg
import orjson
import pytest
from sqlalchemy.engine import make_url

from episodic import EpisodicStore, Message, ToolCall
from episodic.store.postgres import LOAD_TAIL
from tests.support import store_through_proxy


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
        summary="summary of everything so far",
        covers_through_seq=head.last_seq,
        reason="context_pressure",
        expected_boundary_seq=None,
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


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_load_context_reads_only_the_rows_it_returns(
    pg_store: EpisodicStore, plan_mode: str
) -> None:
    conv = await _long_conversation(pg_store, events=5_000, tail=50)
    dsn = make_url(pg_store_url(pg_store)).set(drivername="postgresql")
    connection = await asyncpg.connect(dsn.render_as_string(hide_password=False))
    try:
        await connection.execute("ANALYZE episodic_events")
        await connection.execute("ANALYZE episodic_conversations")
        # asyncpg reuses prepared statements, so after a few calls PostgreSQL may switch to a
        # generic plan built without the parameter's value: both plans must use the index.
        await connection.execute(f"SET plan_cache_mode = {plan_mode}")
        raw = await connection.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {LOAD_TAIL}", conv)
    finally:
        await connection.close()
    nodes = _nodes(orjson.loads(raw)[0]["Plan"])
    reads = [n for n in nodes if n.get("Relation Name") == "episodic_events"]
    assert len(reads) == 1, nodes
    read = reads[0]
    assert read["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), nodes
    index_nodes = [read, *_nodes(read)[1:]]
    assert any(n.get("Index Name") == "pk_episodic_events" for n in index_nodes), nodes
    assert not any(
        n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "episodic_events" for n in nodes
    )
    # The boundary and the 50 tail messages: nothing older is read.
    assert read["Actual Rows"] * read["Actual Loops"] == 51


def _nodes(plan: dict[str, object]) -> list[dict[str, object]]:
    out = [plan]
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        out.extend(_nodes(child))
    return out


def pg_store_url(store: EpisodicStore) -> str:
    url: str | None = store._backend._url.asyncpg  # type: ignore[attr-defined]
    assert url is not None
    return url
