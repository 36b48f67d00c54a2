"""``python -m bench``: raw asyncpg and episodic, the same workloads, one PostgreSQL, one run;
then the compaction worker's throughput (``bench/worker.py``).

Each part gets a throwaway database ``episodic_bench_<random>``, created and always dropped
(also on Ctrl-C or SIGTERM). Results are printed and written to ``bench/RESULTS.md``; the
worker's go to its "## Worker" section, which ``--only worker`` alone rewrites; ``--only
core`` rewrites the part above the first "## " heading and keeps the rest. ``--citus`` runs
only the Citus comparison (``bench/citus.py``) and rewrites only its "## Citus" section;
``--http`` only the HTTP API against the direct API and a minimal server, one call at a time
and under load with wrk (``bench/http.py``), its "## HTTP" section.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from bench import citus as citus_bench
from bench import db
from bench import http as http_bench
from bench import worker as worker_bench
from bench.provenance import command_line, episodic_source, terminate
from bench.run import run

RESULTS = Path(__file__).with_name("RESULTS.md")
T = TypeVar("T")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--url",
        default=os.environ.get("EPISODIC_BENCH_URL", db.DEFAULT_ADMIN_URL),
        help="a PostgreSQL server and a database on it to connect to for "
        "CREATE/DROP DATABASE (default: %(default)s)",
    )
    p.add_argument(
        "--max-events",
        type=int,
        default=100_000,
        help="largest history length measured (default: %(default)s)",
    )
    p.add_argument("--quick", action="store_true", help="same as --max-events 10000")
    p.add_argument(
        "--appends",
        type=int,
        default=2_000,
        help="sequential single-message appends for throughput (default: %(default)s)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=500,
        help="single-message appends per latency window (default: %(default)s)",
    )
    p.add_argument(
        "--loads", type=int, default=50, help="load_context calls per size (default: %(default)s)"
    )
    p.add_argument(
        "--concurrent-per-task",
        type=int,
        default=500,
        help="appends per task in the 8 x 50 workload (default: %(default)s)",
    )
    p.add_argument(
        "--only",
        choices=("core", "worker"),
        help="run only the append/load workloads (core) or only the worker benchmark",
    )
    p.add_argument(
        "--worker-conversations",
        type=int,
        default=1_000,
        help="due conversations per instant-summarizer run (default: %(default)s)",
    )
    p.add_argument(
        "--worker-messages",
        type=int,
        default=worker_bench.MESSAGES,
        help="messages per due conversation (default: %(default)s)",
    )
    p.add_argument(
        "--worker-slow-conversations",
        type=int,
        default=160,
        help="due conversations per slow-summarizer run (default: %(default)s)",
    )
    p.add_argument(
        "--worker-slow-delay",
        type=float,
        default=2.0,
        help="latency of the slow summarizer, seconds (default: %(default)s)",
    )
    p.add_argument(
        "--worker-pool",
        type=int,
        default=None,
        help="connections per worker process (default: EPISODIC_POOL_MAX_SIZE, 10)",
    )
    p.add_argument(
        "--worker-profile",
        type=Path,
        metavar="PATH",
        help="after the worker runs, profile one more (instant, 1 process, concurrency 16) "
        "with cProfile, write the stats to PATH and print the hot spots",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=RESULTS,
        help="markdown file to write (default: bench/RESULTS.md)",
    )
    citus_bench.add_arguments(p)
    http_bench.add_arguments(p)
    args = p.parse_args(argv)
    citus_bench.check_arguments(p, args)
    http_bench.check_arguments(p, args)
    if args.quick:
        args.max_events = 10_000
    if args.max_events < 1_000:
        p.error("--max-events must be at least 1000")
    if args.worker_messages < 8:
        p.error("--worker-messages must be at least 8 (enough user messages to be due)")
    if min(args.worker_conversations, args.worker_slow_conversations) < 1:
        p.error("the worker benchmark needs at least 1 conversation per run")
    return args


def _in_database(args: argparse.Namespace, work: Callable[[str], Coroutine[Any, Any, T]]) -> T:
    """``work(url)`` on a new throwaway database, dropped afterwards whatever happens."""
    name = db.new_database_name()
    try:
        asyncio.run(db.create_database(args.url, name))
        print(f"bench: database {name}", file=sys.stderr)
        return asyncio.run(work(db.database_url(args.url, name)))
    finally:
        # Nothing may stop the drop: ignore further Ctrl-C / SIGTERM while it runs.
        previous = (
            signal.signal(signal.SIGINT, signal.SIG_IGN),
            signal.signal(signal.SIGTERM, signal.SIG_IGN),
        )
        try:
            asyncio.run(db.drop_database(args.url, name))
            print(f"bench: dropped {name}", file=sys.stderr)
        except Exception as exc:  # report, and say what to clean up by hand
            print(f"bench: could not drop {name}: {exc!r}", file=sys.stderr)
            raise DropFailed(name) from exc
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])


class DropFailed(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, terminate)
    from bench.report import document, sections, table, with_section

    command = command_line("bench", argv)
    if args.citus:
        return citus_bench.main(args, command)
    if args.http:
        return http_bench.main(args, command)
    previous = args.output.read_text() if args.output.exists() else ""
    text = previous
    code = 0
    try:
        if args.only != "worker":
            started = time.perf_counter()
            report, postgres = _in_database(args, lambda url: run(args, url))
            meta = {
                **db.machine(),
                "postgres": postgres,
                "command": command,
                "episodic": episodic_source(),
                "runtime": f"{time.perf_counter() - started:.0f} s",
            }
            print(table(report))
            # The "## " sections after the core table (the worker's, notes on profiles) stay.
            kept = sections(previous)
            text = document(report, meta).rstrip("\n") + ("\n\n" + kept if kept else "\n")
            args.output.write_text(text)
        if args.only != "core":
            started = time.perf_counter()

            async def work(url: str) -> tuple[list[worker_bench.Result], str]:
                return await worker_bench.run(args, url), await db.server_version(url)

            results, postgres = _in_database(args, work)
            meta = {
                **db.machine(),
                "postgres": postgres,
                "command": command,
                "episodic": episodic_source(),
                "runtime": f"{time.perf_counter() - started:.0f} s",
            }
            print(("\n" if args.only != "worker" else "") + worker_bench.table(results))
            text = with_section(text, "Worker", worker_bench.section(results, meta))
            if not all(r.ok for r in results):
                print("bench: a worker correctness check failed", file=sys.stderr)
                code = 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except DropFailed:
        return 1
    args.output.write_text(text)
    print(f"\nwritten to {args.output}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
