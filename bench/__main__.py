"""``python -m bench``: raw asyncpg and episodic, the same workloads, one PostgreSQL, one run.

A throwaway database ``episodic_bench_<random>`` is created and always dropped (also on
Ctrl-C or SIGTERM). Results are printed and written to ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from bench import db
from bench.run import run

RESULTS = Path(__file__).with_name("RESULTS.md")


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
        "--output",
        type=Path,
        default=RESULTS,
        help="markdown file to write (default: bench/RESULTS.md)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.max_events = 10_000
    if args.max_events < 1_000:
        p.error("--max-events must be at least 1000")
    return args


def _command(argv: list[str] | None) -> str:
    """The command line, run from the current directory."""
    python = sys.executable or "python"
    if not os.path.relpath(python).startswith(".."):
        python = os.path.relpath(python)
    args = shlex.join([python, "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    return f"cd {shlex.quote(os.getcwd())} && {args}"


def _episodic_source() -> str:
    """Where ``episodic`` was imported from, and its git commit when that is a checkout."""
    import episodic

    root = Path(episodic.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "episodic", "migrations"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return f"{root} at {commit}{' with uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return str(root)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    name = db.new_database_name()
    signal.signal(signal.SIGTERM, _terminate)
    started = time.perf_counter()
    code = 0
    try:
        asyncio.run(db.create_database(args.url, name))
        print(f"bench: database {name}", file=sys.stderr)
        report, postgres = asyncio.run(run(args, db.database_url(args.url, name)))
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        code = 130
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
            code = code or 1
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
    if code:
        return code

    from bench.report import document, table

    meta = {
        **db.machine(),
        "postgres": postgres,
        "command": _command(argv),
        "episodic": _episodic_source(),
        "runtime": f"{time.perf_counter() - started:.0f} s",
    }
    print(table(report))
    args.output.write_text(document(report, meta))
    print(f"\nwritten to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
