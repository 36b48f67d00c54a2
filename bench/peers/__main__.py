"""``python -m bench.peers``: raw asyncpg, episodic, and the OpenAI Agents SDK, Google ADK and
LangGraph session stores through their real APIs; the same workloads, one PostgreSQL, one run.

Each store gets its own throwaway database ``bench_peers_<hex>``, created on the server's
``postgres`` database and always dropped (``DROP DATABASE ... WITH (FORCE)``), also on Ctrl-C or
SIGTERM. Raw asyncpg runs first and again last; its figure is the mean of the two runs. A peer
whose package is missing is skipped and said so; a peer that hits a time cap reports how far it
got. episodic is also loaded behind a compaction boundary (a fourth workload, episodic's
alone). Results are printed, written to ``bench/PEERS.md``, and plotted to
``bench/load_latency.png``. Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import signal
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

from bench import db
from bench.peers import workloads
from bench.peers.report import StoreResult, boundary_table, figures, plot, tables
from bench.peers.stores import (
    GROW_BATCH,
    Episodic,
    GoogleADK,
    LangGraph,
    OpenAIAgents,
    Raw,
    Store,
)
from bench.provenance import command_line, episodic_source, terminate

HERE = Path(__file__).resolve().parent.parent
OUTPUT = HERE / "PEERS.md"
PLOT = HERE / "load_latency.png"
TABLE_SIZES = (1_000, 2_000, 5_000)
_T0 = time.perf_counter()


def log(what: str) -> None:
    print(f"peers: [{time.perf_counter() - _T0:6.1f} s] {what}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument(
        "--url",
        default=os.environ.get("EPISODIC_BENCH_URL", db.DEFAULT_ADMIN_URL),
        help="PostgreSQL server and a database on it for CREATE/DROP DATABASE "
        "(default: %(default)s)",
    )
    p.add_argument("--appends", type=int, default=2_000, help="sequential messages (%(default)s)")
    p.add_argument(
        "--sizes",
        default="100,500,1000,2000,5000",
        help="history lengths for the load workload, comma-separated, even (%(default)s)",
    )
    p.add_argument("--loads", type=int, default=20, help="timed loads per length (%(default)s)")
    p.add_argument(
        "--boundary-sizes",
        default=None,
        help="history lengths before the boundary for episodic's loads behind one, "
        "comma-separated, even (default: --sizes plus 20000)",
    )
    p.add_argument(
        "--tail", type=int, default=200, help="messages after the boundary (%(default)s)"
    )
    p.add_argument(
        "--boundary-rounds", type=int, default=4, help="rounds the loads rotate in (%(default)s)"
    )
    p.add_argument(
        "--cap-boundary",
        type=float,
        default=60.0,
        help="seconds of growth for the loads behind a boundary (%(default)s)",
    )
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--conversations", type=int, default=50, help="per task (%(default)s)")
    p.add_argument("--per-task", type=int, default=500, help="messages per task (%(default)s)")
    p.add_argument("--cap-appends", type=float, default=25.0, help="seconds (%(default)s)")
    p.add_argument("--cap-concurrent", type=float, default=20.0, help="seconds (%(default)s)")
    p.add_argument(
        "--cap-loads", type=float, default=45.0, help="seconds, growth included (%(default)s)"
    )
    p.add_argument(
        "--cap-load-size", type=float, default=10.0, help="seconds of loading per length"
    )
    p.add_argument(
        "--only",
        default="",
        help="comma-separated store keys to run: raw, episodic, openai_agents, adk, langgraph "
        "(raw always runs)",
    )
    p.add_argument("--output", type=Path, default=OUTPUT)
    p.add_argument("--plot", type=Path, default=PLOT)
    args = p.parse_args(argv)
    args.size_list = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if any(s <= 0 or s % 2 for s in args.size_list) or args.appends % 2 or args.per_task % 2:
        p.error("sizes, --appends and --per-task must be even (LangGraph appends pairs)")
    if args.boundary_sizes is None:
        args.boundary_list = sorted({*args.size_list, 20_000})
    else:
        args.boundary_list = sorted({int(s) for s in args.boundary_sizes.split(",") if s.strip()})
    if any(s < 2 for s in args.boundary_list) or args.tail < 1 or args.boundary_rounds < 1:
        p.error("--boundary-sizes must be at least 2, --tail and --boundary-rounds at least 1")
    return args


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


async def _exercise(store: Store, url: str, args: argparse.Namespace, r: StoreResult) -> None:
    await store.open(url)
    try:
        await workloads.warm(store)
        log(f"{store.key}: {args.appends:,} sequential messages")
        r.appends = await workloads.appends(store, args.appends, args.cap_appends)
        log(f"  {r.appends.per_second:,.0f} msg/s ({r.appends.messages:,} messages)")
        log(f"{store.key}: {args.tasks} tasks x {args.conversations} conversations")
        r.concurrent = await workloads.concurrent(
            store, args.tasks, args.conversations, args.per_task, args.cap_concurrent
        )
        log(f"  {r.concurrent.per_second:,.0f} msg/s ({r.concurrent.messages:,} messages)")
        log(f"{store.key}: loads at {args.size_list}")
        r.loads = await workloads.loads(
            store, args.size_list, args.loads, args.cap_loads, args.cap_load_size, log
        )
        if isinstance(store, Episodic):
            log(f"{store.key}: loads behind a boundary at {args.boundary_list}")
            r.boundary = await workloads.boundary_loads(
                store,
                args.boundary_list,
                args.tail,
                args.loads,
                args.boundary_rounds,
                args.cap_boundary,
                args.cap_load_size,
                log,
            )
    finally:
        await store.close()


def run_store(store: Store, args: argparse.Namespace) -> StoreResult:
    r = StoreResult(store.key, store.label, store.how, store.per_call)
    r.versions = {d: _version(d) for d in store.packages}
    missing = [d for d, v in r.versions.items() if v == "not installed"]
    if missing:
        r.status = f"skipped: {', '.join(missing)} not installed"
        log(f"{store.key}: {r.status}")
        return r
    name = f"bench_peers_{secrets.token_hex(4)}"
    started = time.perf_counter()
    try:
        asyncio.run(db.create_database(args.url, name))
        log(f"{store.key}: database {name}")
        asyncio.run(_exercise(store, db.database_url(args.url, name), args, r))
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a peer that breaks is reported, the others still run
        traceback.print_exc()
        r.status = f"stopped by an error: {type(exc).__name__}: {str(exc)[:200]}"
        log(f"{store.key}: {r.status}")
    finally:
        previous = (
            signal.signal(signal.SIGINT, signal.SIG_IGN),
            signal.signal(signal.SIGTERM, signal.SIG_IGN),
        )
        try:
            asyncio.run(db.drop_database(args.url, name))
            log(f"{store.key}: dropped {name}")
        except Exception as exc:
            print(f"peers: could not drop {name}: {exc!r}", file=sys.stderr)
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
        r.seconds = time.perf_counter() - started
    return r


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, terminate)
    command = command_line("bench.peers", argv)
    # episodic is imported by now (bench.workload imports it): say which source that was.
    source = episodic_source()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    stores: list[Store] = [
        Raw(),
        *(
            s
            for s in (Episodic(), OpenAIAgents(), GoogleADK(), LangGraph())
            if not only or s.key in only
        ),
        Raw(label="raw asyncpg (second run, last)"),
    ]
    started = time.perf_counter()
    results: list[StoreResult] = []
    try:
        for store in stores:
            results.append(run_store(store, args))
    except KeyboardInterrupt:
        print("peers: interrupted", file=sys.stderr)
        return 130
    runtime = time.perf_counter() - started
    postgres = asyncio.run(db.server_version(args.url))
    machine = db.machine()

    figs = figures(
        [s for s in TABLE_SIZES if s in args.size_list],
        args.appends,
        args.tasks,
        args.conversations,
    )
    summary, full = tables(results, figs, args.appends)
    behind = boundary_table(results, args.tail)
    print(summary)
    print()
    print(behind)
    print()
    print(full)

    subtitle = f"{machine['date']}, {machine['nproc']} CPUs, PostgreSQL {postgres.split()[1]}"
    plot(results, args.plot, subtitle, args.tail)

    versions: dict[str, str] = {}
    for r in results:
        versions.update(r.versions)
    for d in ("orjson", "numpy", "matplotlib"):
        versions[d] = _version(d)
    args.output.write_text(
        document(
            args,
            results,
            summary,
            behind,
            full,
            machine,
            postgres,
            command,
            runtime,
            versions,
            source,
        )
    )
    log(f"written to {args.output} and {args.plot}")
    return 0


def document(
    args: argparse.Namespace,
    results: list[StoreResult],
    summary: str,
    behind: str,
    full: str,
    machine: dict[str, str],
    postgres: str,
    command: str,
    runtime: float,
    versions: dict[str, str],
    source: str,
) -> str:
    plot_rel = os.path.relpath(args.plot, args.output.parent)
    pkgs = ", ".join(f"{d} {v}" for d, v in sorted(versions.items(), key=lambda x: x[0].lower()))
    hows = "\n".join(
        f"- **{r.label}**: {r.how}." for r in results if r.key != "raw" or r is results[0]
    )
    python = platform.python_version()
    statuses = [f"- {r.label}: {r.status}" for r in results if r.status != "ok"]
    timings = ", ".join(
        f"{r.key}{' (2nd)' if r.key == 'raw' and n else ''} {r.seconds:.0f} s"
        for n, r in enumerate(results)
    )
    return f"""# Peers: raw asyncpg, episodic and three agent frameworks' session stores

Measured by `python -m bench.peers` in one process and one run, on one PostgreSQL server, each
store on its own throwaway database. The machine is shared and noisy: read the ratios, not the
absolute times.

- date: {machine["date"]}
- machine: {machine["nproc"]} CPUs (nproc), {machine["memory"]} memory, Python {python}
- PostgreSQL: {postgres}
- episodic: {source} (when the run started)
- packages: {pkgs}
- command: `{command}`
- runtime: {runtime:.0f} s ({timings})

{summary}

![load latency against conversation length]({plot_rel})

### episodic behind a boundary

Each history length gets its own episodic conversation: grown to that many messages, a boundary
written through the last safe cut, then a {args.tail}-message tail appended. `load_context`
then returns the handoff summary, the retained user messages and the tail, whatever the length
before the boundary: the dashed line of the plot. The whole-history columns repeat, for
comparison, the loads of the table above at the same length.

{behind}

{full}

{chr(10).join(statuses) + chr(10) + chr(10) if statuses else ""}## How each store is driven

Every store writes the same conversation: ~400-character messages, (user, assistant) turns, and
every fifth turn a tool call/result pair (user, assistant tool call, tool result, assistant);
every store here supports tool calls, so all of them store the pairs in their own format.

{hows}

Workloads, run store by store (raw asyncpg first and again last; its figure is the mean of both
runs): (1) {args.appends:,} sequential messages to one new conversation after a 20-message
warm-up on another, capped at {args.cap_appends:.0f} s; (2) {args.tasks} tasks, each appending
round-robin to its own {args.conversations} conversations (created untimed), {args.per_task:,}
messages per task, capped at {args.cap_concurrent:.0f} s; (3) one conversation grown untimed (in
batches where the API has them) to {", ".join(f"{s:,}" for s in args.size_list)} messages,
loaded whole {args.loads} times at each length after one warm load (fewer, at least 5, once
{args.cap_load_size:.0f} s of loading is spent), the median reported; growth and loads capped at
{args.cap_loads:.0f} s; (4) episodic only: for each of
{", ".join(f"{s:,}" for s in args.boundary_list)} messages, its own conversation grown untimed
in batches of {GROW_BATCH}, a boundary written through the last safe cut (a ~2,000-character
summary, the last two user messages retained), and {args.tail} more messages appended; then,
after one warm load of each, `load_context` timed {args.loads} times per length, rotating over
the lengths in {args.boundary_rounds} rounds (fewer calls, at least 5, once
{args.cap_load_size:.0f} s of loading is spent), the median reported; growth capped at
{args.cap_boundary:.0f} s. *vs raw asyncpg* and *vs fastest peer* are speed ratios (throughput
over throughput, or latency of the reference over latency): above 1 is faster. The fastest peer
is the best of the OpenAI Agents SDK, Google ADK and LangGraph for that figure. The windows in the
append notes are tenths of the run, showing whether the cost grows with the conversation.
"""


if __name__ == "__main__":
    sys.exit(main())
