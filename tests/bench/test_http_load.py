"""The HTTP benchmark's load half (``bench/http_load.py``): the data handed to the wrk
script, the log check that finds lost and doubled appends (shown to find them), the server
log scan, the report; and, when wrk is installed, one short run against the minimal server
with the log checked."""

from __future__ import annotations

from collections import Counter
from uuid import uuid4

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from bench import minimal_server
from bench.http_load import (
    LoadResult,
    LoadRun,
    Side,
    check_log,
    find_wrk,
    load_run,
    scan_log,
)
from bench.http_load import _data as lua_data
from bench.http_load_report import findings, load_section, load_table, ratio_table
from bench.http_servers import serving_minimal


def test_the_data_is_a_lua_table_of_quoted_strings() -> None:
    text = lua_data("append", "ab12", 2, "Bearer x.y", ["/v1/a", "/v1/b"], ["one two"])
    assert text.startswith("return {")
    assert 'mode = "append", run = "ab12", threads = 2,' in text
    assert 'paths = {"/v1/a", "/v1/b"}' in text
    assert 'authorization = "Bearer x.y"' in text


@pytest.mark.parametrize("text", ['say "hi"', "back\\slash", "naïve", "line\nbreak"])
def test_texts_the_script_cannot_paste_into_json_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"cannot paste|printable ASCII"):
        lua_data("append", "ab12", 1, "Bearer x", ["/v1/a"], [text])


def test_the_log_scan_counts_errors_tracebacks_and_failed_requests() -> None:
    found = scan_log(
        [
            "2026-01-01 00:00:00,000 INFO uvicorn.error Started server process [1]",
            "2026-01-01 00:00:01,000 ERROR episodic.server.errors request abc failed: "
            "ClientDisconnect: ",
            "2026-01-01 00:00:01,000 ERROR uvicorn.error Exception in ASGI application",
            "Traceback (most recent call last):",
            "ERROR:    Exception in ASGI application",
        ]
    )
    assert (found.errors, found.tracebacks) == (3, 1)
    assert found.failed == Counter({"ClientDisconnect": 1})
    assert "ClientDisconnect" in found.first


@pytest.fixture
async def minimal_url(empty_postgres_url: str) -> str:
    """A database with the minimal server's table, as a plain postgresql:// URL."""
    url = make_url(empty_postgres_url).set(drivername="postgresql")
    plain = url.render_as_string(hide_password=False)
    conn = await asyncpg.connect(plain)
    try:
        await conn.execute(minimal_server.CREATE)
    finally:
        await conn.close()
    return plain


async def test_the_log_check_finds_lost_doubled_and_unanswered_appends(minimal_url: str) -> None:
    conversation = uuid4()
    conn = await asyncpg.connect(minimal_url)
    try:
        for marker in ("t1-0-1", "t1-0-2", "t1-0-2", "t1-0-4"):
            payload = f'{{"role":"user","content":"{marker} some text"}}'
            await conn.fetchval(minimal_server.INSERT, conversation, payload, marker)
        run = LoadRun("minimal", 1, "append", 8)
        run.statuses["2xx"] = 3
        # 1 and 2 answered and there (2 twice), 3 answered and missing, 4 there unanswered
        await check_log(conn, run, "t1", [conversation], ["t1-0-1", "t1-0-2", "t1-0-3"])
    finally:
        await conn.close()
    assert (run.lost, run.doubled, run.unanswered) == (1, 1, 1)
    assert run.problems == []
    said = "\n".join(findings(LoadResult(runs=[run])))
    assert "**1 appends answered 2xx are not in the log**" in said
    assert "**1 messages are in the log twice**" in said


def _run(server: str, workload: str, ok: int, **extra: int) -> LoadRun:
    run = LoadRun(server, 1, workload, 8, seconds=2.0, requests=ok + sum(extra.values()))
    run.statuses.update({"2xx": ok, "503": 0, "5xx": 0, "4xx": 0, "other": 0} | extra)
    run.p50, run.p99, run.p999 = 1.0, 2.0, 3.0
    if workload == "append":
        run.lost, run.doubled, run.unanswered = 0, 0, 3
    return run


def test_the_report_has_every_run_the_ratios_and_the_503s_apart() -> None:
    result = LoadResult(
        runs=[
            _run("episodic", "append", 100, **{"503": 20}),
            _run("minimal", "append", 400),
            _run("episodic", "load", 50, **{"5xx": 2}),
        ],
        wrk="wrk 4.1.0",
    )
    result.runs[2].first_error = "500 oops"
    assert "| 1 | append | 8 | 50 | 200 | 0.25 | 1.00 |" in ratio_table(result)
    assert "| load |" not in ratio_table(result)  # the minimal server's load did not run
    assert "| episodic | 1 | append | 8 | 60 | 50 | 1.0 | 2.0 | 3.0 | 100 | 20 | 0 |" in (
        load_table(result)
    )
    said = "\n".join(findings(result))
    assert "in all 2 append runs every append answered 2xx is in the log exactly once" in said
    assert "20 shed with 503" in said
    assert "2 5xx other than 503" in said
    assert "500 oops" in said
    assert load_section(result)[0] == "### Under load (wrk)"


@pytest.mark.skipif(find_wrk() is None, reason="wrk is not installed")
async def test_wrk_against_the_minimal_server_loses_and_doubles_nothing(minimal_url: str) -> None:
    wrk = find_wrk()
    assert wrk is not None
    plain = uuid4()
    conn = await asyncpg.connect(minimal_url)
    try:
        for i in range(3):
            payload = f'{{"role":"user","content":"message {i}"}}'
            await conn.fetchval(minimal_server.INSERT, plain, payload, None)
        with serving_minimal(minimal_url, "secret") as server:
            path = f"/v1/conversations/{plain}"
            side = Side("minimal", 1, server.base, f"{path}/context", path)
            append = await load_run(wrk, conn, side, "secret", "append", 4, 2, 1.0)
            load = await load_run(wrk, conn, side, "secret", "load", 4, 2, 1.0)
            head = await load_run(wrk, conn, side, "secret", "head", 4, 2, 1.0)
    finally:
        await conn.close()
    assert append.statuses["2xx"] > 0
    assert append.statuses["2xx"] == append.requests
    assert (append.lost, append.doubled, append.problems) == (0, 0, [])
    assert 0 <= (append.unanswered or 0) <= 4
    assert load.statuses["2xx"] == load.requests > 0
    assert head.statuses["2xx"] == head.requests > 0
    assert 1 <= append.max_pg <= minimal_server.POOL_MAX_SIZE
    assert not scan_log(server.lines).tracebacks
