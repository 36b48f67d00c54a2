"""The load half of ``python -m bench --http``: wrk drives ``episodic serve`` and the minimal
server (``bench/minimal_server.py``) side by side, then the log is checked.

wrk, not a Python client: a Python load generator would spend the same 2 cores the server
and PostgreSQL need, in one interpreter, and its own latency would be in every figure. wrk
is C on an event loop (epoll), a thread per core at most; with ``-t1``/``-t2`` its threads
keep up with many connections while using a small share of a core at these rates, so the
figures are the server's. It keeps each connection busy (one request in flight per
connection, the next sent when the answer is in): a closed loop, so latency is what a
client waiting on its answer sees (no coordinated-omission correction, as wrk2 would add).

Every cell (server × processes × workload × connections) is one wrk run of ``seconds``; the
two servers' runs of a cell follow each other, which goes first alternating, so both see
the same machine. During each run ``pg_stat_activity`` is sampled for the server's
connections to the bench database. After each append run, the log is checked against what
wrk was told: every append answered 2xx is in the log once (``lost``: answered 2xx but not
there; ``doubled``: a message or Idempotency-Key there more than once), and what is there
without a 2xx seen (the requests still in flight when wrk stopped) is counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import re
import secrets
import shutil
import subprocess
import tempfile
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx

from bench import minimal_server
from bench.http_servers import Server, serve_has_workers, serving, serving_minimal
from bench.run import log
from bench.stats import ratio
from bench.workload import TEXTS

SCRIPT = Path(__file__).with_name("wrk") / "requests.lua"
CONNECTIONS = (8, 32, 128)
PROCESSES = (1, 2)
#: "head": GET the conversation (episodic's head, the minimal server's last seq), the
#: lightest authenticated read: the floor of every /v1 route on each server
WORKLOADS = ("append", "load", "head")
SERVERS = ("episodic", "minimal")
#: seconds per run (--http-load-seconds; --quick: QUICK_SECONDS)
SECONDS = 10.0
QUICK_SECONDS = 2.0
#: wrk threads (-t): at most one per core of a 2-core machine, and never more than connections
THREADS = 2
#: wrk's --timeout: a request unanswered this long counts as a timeout (a socket error)
TIMEOUT_S = 10
#: untimed wrk run per server and workload when the servers have started
WARMUP_S = 1.0
SAMPLE_EVERY_S = 0.05
#: after an append run, the log is counted until it stops growing, at most this long
SETTLE_S = 30.0

EPISODIC_ROWS = """
SELECT idempotency_key, payload FROM episodic_events
WHERE conversation_id = ANY($1::uuid[]) AND kind = 'message'
"""
MINIMAL_ROWS = (
    "SELECT idempotency_key, payload FROM bench_minimal WHERE conversation_id = ANY($1::uuid[])"
)
EPISODIC_COUNT = "SELECT count(*) FROM episodic_events WHERE conversation_id = ANY($1::uuid[])"
MINIMAL_COUNT = "SELECT count(*) FROM bench_minimal WHERE conversation_id = ANY($1::uuid[])"
#: the server's connections to this database: the minimal server's by its application_name,
#: episodic's as every other client backend but the sampler's own
HELD = """
SELECT count(*) FILTER (WHERE application_name = $1),
       count(*) FILTER (WHERE application_name IS DISTINCT FROM $1)
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
"""


def add_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--http-load-seconds",
        type=float,
        default=None,
        help=f"seconds per wrk run (default: {SECONDS:g}; with --quick {QUICK_SECONDS:g})",
    )
    g.add_argument(
        "--http-load-connections",
        default=",".join(map(str, CONNECTIONS)),
        help="wrk connections per run, comma-separated (default: %(default)s)",
    )
    g.add_argument(
        "--http-load-processes",
        default=",".join(map(str, PROCESSES)),
        help="server processes (uvicorn workers), comma-separated (default: %(default)s)",
    )
    g.add_argument(
        "--http-load-threads",
        type=int,
        default=THREADS,
        help="wrk threads, -t (default: %(default)s)",
    )
    g.add_argument(
        "--http-skip-load",
        action="store_true",
        help="measure only the sequential calls, not the load runs with wrk",
    )
    g.add_argument(
        "--http-skip-load-if-no-wrk",
        action="store_true",
        help="without wrk on PATH, skip the load runs (saying so) instead of failing",
    )


def _counts(p: argparse.ArgumentParser, text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        p.error(f"{flag}: comma-separated whole numbers, not {text!r}")
    if not values or min(values) < 1:
        p.error(f"{flag}: at least one, each at least 1")
    return values


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.http_load_seconds is None:
        args.http_load_seconds = QUICK_SECONDS if args.quick else SECONDS
    if args.http_load_seconds < 1:
        p.error("--http-load-seconds must be at least 1")
    args.http_load_connections = _counts(p, args.http_load_connections, "--http-load-connections")
    args.http_load_processes = _counts(p, args.http_load_processes, "--http-load-processes")
    if args.http_load_threads < 1:
        p.error("--http-load-threads must be at least 1")


def find_wrk() -> str | None:
    """wrk's path when it is on PATH and runs (``wrk --version`` prints its name)."""
    found = shutil.which("wrk")
    if found is None:
        return None
    try:
        shown = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (shown.stdout + shown.stderr).strip().splitlines()
    return found if first and first[0].startswith("wrk") else None


def wrk_version(wrk: str) -> str:
    shown = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=10)
    first = (shown.stdout + shown.stderr).strip().splitlines()[0]
    return first.split(" Copyright")[0]


# ---- one wrk run ------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One server under load: which, how many processes, where, what it loads."""

    server: str
    processes: int
    base: str
    #: the 200-message conversation's context path
    load_path: str
    #: the same conversation's own path (the "head" workload)
    head_path: str


@dataclass
class LoadRun:
    server: str
    processes: int
    workload: str
    connections: int
    #: wrk's own figures: its duration (s), responses, latencies (ms)
    seconds: float = math.nan
    requests: int = 0
    p50: float = math.nan
    p99: float = math.nan
    p999: float = math.nan
    statuses: Counter[str] = field(default_factory=Counter)
    #: wrk's socket errors: connect, read, write, timeout
    socket: Counter[str] = field(default_factory=Counter)
    max_pg: int = 0
    #: the check of an append run's log (None for loads)
    lost: int | None = None
    doubled: int | None = None
    #: in the log without a 2xx seen by wrk (in flight when it stopped)
    unanswered: int | None = None
    retry_after: str = ""
    first_error: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return ratio(self.requests, self.seconds)

    @property
    def ok_per_second(self) -> float:
        return ratio(self.statuses["2xx"], self.seconds)

    @property
    def socket_errors(self) -> int:
        return sum(self.socket.values())

    @property
    def key(self) -> tuple[int, str, int]:
        return self.processes, self.workload, self.connections


def _lua(value: str) -> str:
    """``value`` as a Lua string literal (printable ASCII only: all the bench sends)."""
    if not value.isascii() or not value.isprintable():
        raise ValueError(f"not printable ASCII: {value[:40]!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _data(
    mode: str, run: str, threads: int, authorization: str, paths: list[str], texts: list[str]
) -> str:
    for text in texts:  # pasted into the JSON body as they are
        if '"' in text or "\\" in text:
            raise ValueError(f"a text the Lua script cannot paste into JSON: {text[:40]!r}")
    return "\n".join(
        [
            "return {",
            f"  mode = {_lua(mode)}, run = {_lua(run)}, threads = {threads},",
            f"  authorization = {_lua(authorization)},",
            "  paths = {" + ", ".join(map(_lua, paths)) + "},",
            "  texts = {" + ", ".join(map(_lua, texts)) + "},",
            "}",
            "",
        ]
    )


async def _wrk(
    wrk: str, base: str, data: str, threads: int, connections: int, seconds: float
) -> tuple[dict[str, Any], list[str]]:
    """One wrk run: its ``done()`` line and the markers of the appends it saw answered 2xx."""
    with tempfile.TemporaryDirectory(prefix="episodic-bench-wrk-") as tmp:
        data_path, keys_path = Path(tmp, "data.lua"), Path(tmp, "acked.txt")
        await asyncio.to_thread(data_path.write_text, data, encoding="ascii")
        argv = [
            wrk,
            f"-t{min(threads, connections)}",
            f"-c{connections}",
            f"-d{seconds:g}s",
            f"--timeout={TIMEOUT_S}s",
            "-s",
            str(SCRIPT),
            base,
            "--",
            str(data_path),
            str(keys_path),
        ]
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), seconds + 60)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        lines = [line for line in out.decode().splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            raise RuntimeError(
                f"wrk exited with {process.returncode}: {err.decode()[-2000:]}"
                f"{out.decode()[-2000:]}"
            )
        acked = await asyncio.to_thread(_markers, keys_path)
        figures: dict[str, Any] = json.loads(lines[-1])
        return figures, acked


def _markers(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def _sample(conn: asyncpg.Connection, server: str, stop: asyncio.Event) -> int:
    """The most connections ``server`` held to the bench database while ``stop`` is unset."""
    most = 0
    while not stop.is_set():
        minimal, others = await conn.fetchrow(HELD, minimal_server.APPLICATION_NAME)
        most = max(most, minimal if server == "minimal" else others)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
    return int(most)


async def _settle(conn: asyncpg.Connection, count: str, conversations: list[UUID]) -> None:
    """Wait until the conversations' rows stop growing (the appends in flight when wrk
    stopped are answered into the void, but written)."""
    last, steady = -1, 0
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while steady < 3 and asyncio.get_running_loop().time() < deadline:
        now = await conn.fetchval(count, conversations)
        steady = steady + 1 if now == last else 0
        last = now
        await asyncio.sleep(0.2)


async def check_log(
    conn: asyncpg.Connection, run: LoadRun, tag: str, conversations: list[UUID], acked: list[str]
) -> None:
    """Every acknowledged append once in the log, nothing twice."""
    episodic = run.server == "episodic"
    await _settle(conn, EPISODIC_COUNT if episodic else MINIMAL_COUNT, conversations)
    rows = await conn.fetch(EPISODIC_ROWS if episodic else MINIMAL_ROWS, conversations)
    marker = re.compile(re.escape(tag) + r"-\d+-\d+")
    texts: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    strangers: list[str] = []
    mismatched: list[str] = []
    for key, payload in rows:
        found = marker.search(payload)
        if found is None:
            strangers.append(payload[:120])
            continue
        texts[found.group()] += 1
        if key is not None:
            # the store keeps a caller's Idempotency-Key as "k:<key>" (a client id as "m:")
            key = key.removeprefix("k:") if episodic else key
            keys[key] += 1
            if key != found.group():
                mismatched.append(f"{key} with {found.group()}")
    if strangers:
        run.problems.append(f"{len(strangers)} rows without this run's marker: {strangers[0]!r}")
    if mismatched:
        run.problems.append(
            f"{len(mismatched)} Idempotency-Keys stored with another message: {mismatched[0]}"
        )
    if episodic and sum(keys.values()) != len(rows):
        run.problems.append(f"{len(rows) - sum(keys.values())} rows stored without their key")
    seen = set(acked)
    if len(seen) != len(acked):
        run.problems.append(f"wrk saw {len(acked) - len(seen)} markers answered twice")
    if len(acked) != run.statuses["2xx"]:
        run.problems.append(
            f"{run.statuses['2xx']} answered 2xx, {len(acked)} with their marker in the body"
        )
    run.lost = len(seen - texts.keys())
    run.doubled = max(sum(n - 1 for n in texts.values()), sum(n - 1 for n in keys.values()))
    run.unanswered = len(texts.keys() - seen)
    if run.unanswered > run.connections:
        # at most one request per connection is in flight when wrk stops: more in the log
        # without a 2xx means an append answered otherwise (a 503, a 5xx) was written
        run.problems.append(
            f"{run.unanswered} appends in the log without a 2xx, more than the "
            f"{run.connections} that can be in flight when wrk stops"
        )


async def _conversations(side: Side, secret: str, count: int) -> list[UUID]:
    """``count`` new conversations: made through episodic's API (so the bench holds no
    connection to the database meanwhile), or just new ids for the minimal server's table."""
    if side.server != "episodic":
        return [uuid4() for _ in range(count)]
    out = []
    async with httpx.AsyncClient(
        base_url=side.base, headers={"Authorization": f"Bearer {secret}"}, timeout=60.0
    ) as client:
        for _ in range(count):
            response = await client.post("/v1/conversations", json={})
            if response.status_code != 201:
                raise RuntimeError(f"POST /v1/conversations: {response.status_code}")
            out.append(UUID(response.json()["conversation"]["conversation_id"]))
    return out


async def load_run(
    wrk: str,
    conn: asyncpg.Connection,
    side: Side,
    secret: str,
    workload: str,
    connections: int,
    threads: int,
    seconds: float,
    warmup: bool = False,
) -> LoadRun:
    """One cell: wrk for ``seconds`` against ``side``, the database sampled, the log checked."""
    run = LoadRun(side.server, side.processes, workload, connections)
    tag = secrets.token_hex(4)
    if workload == "append":
        # One conversation per connection, each wrk thread its own share, round robin: every
        # append takes its conversation's head row lock, and 128 connections on one head
        # would measure that lock's queue; with as many conversations as connections, two
        # appends meet on a head only when one connection overtakes another.
        conversations = await _conversations(side, secret, connections)
        paths = [f"/v1/conversations/{c}/messages" for c in conversations]
    else:
        conversations = []
        paths = [side.load_path if workload == "load" else side.head_path]
    data = _data(workload, tag, min(threads, connections), f"Bearer {secret}", paths, TEXTS)
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(conn, side.server, stop))
    try:
        figures, acked = await _wrk(wrk, side.base, data, threads, connections, seconds)
    finally:
        stop.set()
        run.max_pg = await sampler
    run.seconds = figures["duration_us"] / 1e6
    run.requests = figures["requests"]
    run.p50, run.p99, run.p999 = (figures[k] / 1000 for k in ("p50_us", "p99_us", "p999_us"))
    run.statuses.update(
        {k: figures["s" + k] for k in ("2xx", "503", "5xx", "4xx")} | {"other": figures["sother"]}
    )
    run.socket.update({k: figures[k] for k in ("connect", "read", "write", "timeout")})
    run.retry_after, run.first_error = figures["retry_after"], figures["first_error"]
    if workload == "append":
        await check_log(conn, run, tag, conversations, acked)
    log(
        f"  {'(warm-up) ' if warmup else ''}{side.server} ×{side.processes} {workload} "
        f"c={connections}: "
        f"{run.per_second:,.0f} req/s, p99 {run.p99:,.1f} ms, {dict(run.statuses)}"
        + (f", lost {run.lost}, doubled {run.doubled}" if run.lost is not None else "")
    )
    return run


# ---- the whole load half ----------------------------------------------------------------


@dataclass
class LoadResult:
    runs: list[LoadRun] = field(default_factory=list)
    wrk: str = ""
    threads: int = THREADS
    seconds: float = SECONDS
    #: why a part was not run
    skipped: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    #: what each server's log says went wrong, by server command
    logs: dict[str, LogErrors] = field(default_factory=dict)


@dataclass
class LogErrors:
    """The ERROR lines of a server's log: how many, how many tracebacks, the exceptions
    episodic's error handler named (``request <id> failed: <Exception>``), the first line."""

    errors: int = 0
    tracebacks: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    first: str = ""


FAILED = re.compile(r"request \S+ failed: (\w+)")


def scan_log(lines: list[str]) -> LogErrors:
    found = LogErrors()
    for line in lines:
        if line.startswith("Traceback"):
            found.tracebacks += 1
        if " ERROR " not in line and not line.startswith("ERROR"):
            continue
        found.errors += 1
        found.first = found.first or line
        failed = FAILED.search(line)
        if failed:
            found.failed[failed.group(1)] += 1
    return found


async def _cells(
    args: argparse.Namespace, wrk: str, url: str, sides: list[Side], secret: str
) -> list[LoadRun]:
    conn = await asyncpg.connect(url, server_settings={"application_name": "bench-load"})
    runs: list[LoadRun] = []
    try:
        log(f"warming up: {WARMUP_S:g} s of each workload per server")
        for side in sides:
            for workload in WORKLOADS:
                await load_run(wrk, conn, side, secret, workload, 8, 1, WARMUP_S, warmup=True)
        cell = 0
        for workload in WORKLOADS:
            for connections in args.http_load_connections:
                # the two servers back to back, which goes first alternating
                order = sides if cell % 2 == 0 else list(reversed(sides))
                for side in order:
                    runs.append(
                        await load_run(
                            wrk,
                            conn,
                            side,
                            secret,
                            workload,
                            connections,
                            args.http_load_threads,
                            args.http_load_seconds,
                        )
                    )
                cell += 1
        return runs
    finally:
        await conn.close()


def measure_load(
    args: argparse.Namespace, url: str, secret: str, plain: UUID, minimal_plain: UUID
) -> LoadResult:
    """Every cell, server processes by server processes (both servers up at once, so their
    runs of a cell can follow each other)."""
    result = LoadResult(threads=args.http_load_threads, seconds=args.http_load_seconds)
    wrk = find_wrk()
    if wrk is None:
        message = "wrk is not installed (apt-get install -y wrk): no load runs"
        if not args.http_skip_load_if_no_wrk:
            raise LoadUnavailable(message + "; --http-skip-load-if-no-wrk goes on without")
        log(message)
        result.skipped.append(message)
        return result
    result.wrk = wrk_version(wrk)
    for processes in args.http_load_processes:
        with ExitStack() as stack:
            servers: list[tuple[str, Server, UUID]] = []
            if processes == 1 or serve_has_workers():
                servers.append(("episodic", stack.enter_context(serving(url, processes)), plain))
            else:
                result.skipped.append(
                    f"episodic serve at {processes} processes: this `episodic serve` has no "
                    "--workers option yet"
                )
                log(result.skipped[-1])
            minimal = stack.enter_context(serving_minimal(url, secret, processes))
            servers.append(("minimal", minimal, minimal_plain))
            result.commands += [running.command for _, running, _ in servers]
            sides = [_side(name, processes, running, conv) for name, running, conv in servers]
            log(f"load at {processes} process(es): {args.http_load_seconds:g} s per run")
            result.runs += asyncio.run(_cells(args, wrk, url, sides, secret))
        # stopped: their whole logs are in
        result.logs.update({running.command: scan_log(running.lines) for _, running, _ in servers})
    return result


def _side(server: str, processes: int, running: Server, conversation: UUID) -> Side:
    path = f"/v1/conversations/{conversation}"
    return Side(server, processes, running.base, f"{path}/context", path)


class LoadUnavailable(Exception):
    pass
