"""The load half's markdown: every run, the ratios of the two servers, what the checks found,
and how it was measured."""

from __future__ import annotations

import math
import textwrap

from bench.http_load import (
    SETTLE_S,
    TIMEOUT_S,
    WARMUP_S,
    LoadResult,
    LoadRun,
)
from bench.stats import ratio


def _n(value: float, digits: int = 0) -> str:
    return "" if math.isnan(value) else f"{value:,.{digits}f}"


def _i(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def load_table(result: LoadResult) -> str:
    lines = [
        "| server | processes | workload | connections | requests/s | 2xx/s | p50 ms | p99 ms "
        "| p99.9 ms | 2xx | 503 | other 5xx | 4xx | socket errors | max PG connections "
        "| lost | doubled | in flight at stop |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(result.runs, key=lambda r: (r.server, *r.key)):
        s = r.statuses
        lines.append(
            f"| {r.server} | {r.processes} | {r.workload} | {r.connections} "
            f"| {_n(r.per_second)} | {_n(r.ok_per_second)} | {_n(r.p50, 1)} | {_n(r.p99, 1)} "
            f"| {_n(r.p999, 1)} | {s['2xx']:,} | {s['503']:,} | {s['5xx']:,} "
            f"| {s['4xx'] + s['other']:,} | {r.socket_errors:,} | {r.max_pg} | {_i(r.lost)} "
            f"| {_i(r.doubled)} | {_i(r.unanswered)} |"
        )
    return "\n".join(lines)


def ratio_table(result: LoadResult) -> str:
    """episodic over the minimal server, cell by cell (only where both ran)."""
    by = {(r.server, *r.key): r for r in result.runs}
    lines = [
        "| processes | workload | connections | episodic 2xx/s | minimal 2xx/s "
        "| episodic / minimal (throughput) | episodic p99 / minimal p99 |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for key in sorted({r.key for r in result.runs}):
        e, m = by.get(("episodic", *key)), by.get(("minimal", *key))
        if e is None or m is None:
            continue
        processes, workload, connections = key
        lines.append(
            f"| {processes} | {workload} | {connections} | {_n(e.ok_per_second)} "
            f"| {_n(m.ok_per_second)} | {_n(ratio(e.ok_per_second, m.ok_per_second), 2)} "
            f"| {_n(ratio(e.p99, m.p99), 2)} |"
        )
    return "\n".join(lines)


def _where(r: LoadRun) -> str:
    return f"{r.server}, {r.processes} process(es), {r.workload}, {r.connections} connections"


def findings(result: LoadResult) -> list[str]:
    """What the checks and the statuses say, run by run; one line when all is well."""
    out: list[str] = []
    for r in result.runs:
        said = []
        if r.lost:
            said.append(f"**{r.lost:,} appends answered 2xx are not in the log**")
        if r.doubled:
            said.append(f"**{r.doubled:,} messages are in the log twice**")
        said += r.problems
        if r.statuses["5xx"] or r.statuses["4xx"] or r.statuses["other"]:
            said.append(
                f"{r.statuses['5xx']:,} 5xx other than 503, "
                f"{r.statuses['4xx'] + r.statuses['other']:,} other non-2xx; the first: "
                f"`{r.first_error[:200]}`"
            )
        if r.statuses["503"]:
            said.append(f"{r.statuses['503']:,} shed with 503 (Retry-After: {r.retry_after})")
        if r.socket_errors:
            said.append(
                "socket errors: " + ", ".join(f"{k} {v:,}" for k, v in r.socket.items() if v)
            )
        if said:
            out.append(f"- {_where(r)}: " + "; ".join(said))
    for command, found in result.logs.items():
        if not found.errors and not found.tracebacks:
            continue
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in found.failed.most_common())
        out.append(
            f"- `{command}` logged {found.errors:,} ERROR lines and {found.tracebacks:,} "
            f"tracebacks over its runs"
            + (f" (requests failed: {kinds})" if kinds else "")
            + f"; the first: `{found.first[:200]}`"
        )
    appends = [r for r in result.runs if r.workload == "append"]
    if appends and not any(r.lost or r.doubled or r.problems for r in appends):
        out.insert(
            0,
            f"- the log checks: in all {len(appends)} append runs every append answered 2xx "
            "is in the log exactly once (0 lost, 0 doubled).",
        )
    return out


def load_section(result: LoadResult) -> list[str]:
    if not result.runs:
        return ["### Under load (wrk)", "", *[f"Not run: {why}." for why in result.skipped], ""]
    method = (
        f"Each row is one `{result.wrk}` run (`bench/wrk/requests.lua`) of "
        f"{result.seconds:g} s with `-t{result.threads}` (never more threads than connections) "
        f"and `--timeout {TIMEOUT_S}s`, against the server's processes (uvicorn workers), "
        f"after {WARMUP_S:g} s of each workload untimed. wrk, not a Python client: it is C on "
        "an event loop with a thread per core at most, so it takes a small share of the 2 "
        "cores the servers and PostgreSQL share, and adds no interpreter's latency to the "
        "figures; a Python client would compete for the same cores. Each connection has one "
        "request in flight (a closed loop: no coordinated-omission correction). The two "
        "servers' runs of a cell follow each other, which goes first alternating. An append "
        "is one ~420-character user message, its text starting with a marker unique in the "
        "run which is also its `Idempotency-Key`; the appends go round robin to as many new "
        "conversations as connections, each wrk thread its own share (one conversation for "
        "all would measure the queue on its head row's lock, not the server). A load is "
        "`GET .../context` of the 200-message conversation (episodic's format=episodic, the "
        "minimal server's JSON list of the same messages). A head is `GET /v1/conversations/{id}` "
        "of the same conversation: episodic's head (the key's read, then the conversation's "
        "row, counters and compaction pressure), the minimal server's last seq (its bearer "
        "token compared in memory, one SELECT of one value): the floor each server's "
        "authenticated routes stand on, which a load's or an append's ratio cannot pass. "
        "*requests/s* counts every "
        "response, *2xx/s* the successful ones (the throughput the ratios use); p50/p99/p99.9 "
        "are wrk's latency percentiles, over every response (a prompt 503 too). *503* is shedding "
        "on purpose (overload, with Retry-After), apart from the *other 5xx*; the script "
        "honours it as a client should: after each 503 one request of that wrk thread waits "
        "the Retry-After before it is sent (a client that came straight back would turn "
        "the server's time into refusals); *socket errors* are wrk's (connect, read, "
        "write, timeout). *max PG connections* is the most client backends of that server "
        "on the bench database in `pg_stat_activity`, sampled every 50 ms during the run "
        "(the minimal server's by their application_name, episodic's as the rest). After "
        f"each append run the log is counted until it stops growing (at most {SETTLE_S:g} "
        "s), then checked against the markers wrk saw answered 2xx: *lost* is answered 2xx "
        "but not in the log, *doubled* a marker or key in the log more than once, *in flight "
        "at stop* in the log without a 2xx seen: the requests wrk abandoned at the end of its "
        "run which the server still wrote, at most one per connection (more is flagged below: "
        "an append refused or failed yet written). A server may also drop an abandoned "
        "request unwritten (episodic answers a request whose client has gone before its body "
        "arrived with 499, writing nothing), so that count can be below the connections."
    )
    found = findings(result)
    return [
        "### Under load (wrk)",
        "",
        *[f"- server: `{command}`" for command in result.commands],
        *[f"- not run: {why}" for why in result.skipped],
        "",
        "episodic over the minimal server, cell by cell:",
        "",
        ratio_table(result),
        "",
        "Every run:",
        "",
        load_table(result),
        "",
        "What the checks and the statuses say:",
        "",
        *(found or ["- nothing to report."]),
        "",
        textwrap.fill(method, 92, break_on_hyphens=False),
        "",
    ]


__all__ = ["findings", "load_section", "load_table", "ratio_table"]
