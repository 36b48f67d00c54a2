"""The compaction worker's throughput: compactions per second per process.

Each scenario seeds its own due conversations (``--worker-conversations`` of
``--worker-messages`` messages each, one batch append per conversation, made due by the
store's trigger), then starts worker processes (``bench/worker_process.py``, each running
``CompactionWorker(...).run()``), releases them at once, and stops them when nothing is due.
Throughput is counted from the release to the last attempt that ended (every process notes
when each of its attempts ended, on the machine's monotonic clock); the correctness check
then counts boundaries with SQL: every conversation must have exactly one.

Scenarios: an instant summarizer at concurrency 1, 4 and 16 with 1 and 2 processes, then a
2 s summarizer (``asyncio.sleep(2)``) at concurrency 16 with 1 and 2 processes, where the
peak number of attempts in flight is sampled in the worker (``worker.in_flight``) and in the
database (rows holding a lease).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pstats
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import asyncpg

from bench.provenance import run_facts
from bench.report import Summary
from bench.workload import History
from episodic import EpisodicStore
from episodic.policy import EpisodicCompactionConfig
from episodic.settings import EpisodicSettings

ROOT = Path(__file__).resolve().parent.parent
#: user messages since the last completed run that make a conversation due (20 messages of
#: the bench history hold 9 user messages)
UNFINISHED_TURNS = 4
#: messages per due conversation (the default of --worker-messages)
MESSAGES = 20
#: tasks creating conversations
SEED_TASKS = 8
#: how often the driver looks for due and leased rows, seconds
POLL_S = 0.05
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
TARGET = 500.0
_T0 = time.perf_counter()


def log(what: str) -> None:
    print(f"bench: [{time.perf_counter() - _T0:6.1f} s] {what}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Scenario:
    processes: int
    concurrency: int
    conversations: int
    delay: float = 0.0

    @property
    def summarizer(self) -> str:
        return f"{self.delay:g} s summarizer" if self.delay else "instant summarizer"

    @property
    def label(self) -> str:
        procs = "1 process" if self.processes == 1 else f"{self.processes} processes"
        return f"{self.summarizer}, {procs} x concurrency {self.concurrency}"


@dataclass
class Process:
    """What one worker process reported."""

    start: float
    last: float
    stopped: float
    finished: int
    outcomes: dict[str, int]
    peak_in_flight: int
    cpu_seconds: float
    pool: int

    @property
    def succeeded(self) -> int:
        return self.outcomes.get("succeeded", 0)

    @property
    def seconds(self) -> float:
        return self.last - self.start

    @property
    def rate(self) -> float:
        return self.succeeded / self.seconds if self.seconds > 0 else math.nan

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time from release to stop (1.0 = one core busy all along)."""
        wall = self.stopped - self.start
        return self.cpu_seconds / wall if wall > 0 else math.nan


@dataclass
class Result:
    scenario: Scenario
    processes: list[Process] = field(default_factory=list)
    peak_leased: int = 0
    #: share of all CPUs busy (user, system, ...) from the release until nothing was due
    machine_cpu: float = math.nan
    #: CPU time of the backends serving the workers over the same span (1.0 = one core busy)
    postgres_cpu: float = math.nan
    ok: bool = False
    check: str = ""

    @property
    def seconds(self) -> float:
        if not self.processes:
            return math.nan
        return max(p.last for p in self.processes) - min(p.start for p in self.processes)

    @property
    def rate(self) -> float:
        done = sum(p.succeeded for p in self.processes)
        return done / self.seconds if self.seconds > 0 else math.nan


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    n, slow = args.worker_conversations, args.worker_slow_conversations
    instant = [Scenario(p, c, n) for p in (1, 2) for c in (1, 4, 16)]
    return instant + [Scenario(p, 16, slow, args.worker_slow_delay) for p in (1, 2)]


async def seed(store: EpisodicStore, count: int, messages: int, name: str) -> list[UUID]:
    """``count`` conversations of ``messages`` messages, each written with one batch append,
    due once written (the store's trigger)."""
    created: list[UUID] = []

    async def create(task: int) -> None:
        for i in range(task, count, SEED_TASKS):
            conv = await store.create_conversation(tenant_id="bench")
            await store.append(conv, History(f"{name}-{i}").take(messages))
            created.append(conv)

    await asyncio.gather(*(create(t) for t in range(SEED_TASKS)))
    return created


DUE_AND_LEASED = """
SELECT count(*) FILTER (WHERE due_since IS NOT NULL AND dead_since IS NULL) AS due,
       count(*) FILTER (WHERE lease_expires_at > now()) AS leased
  FROM episodic_conversations
"""

BOUNDARIES = """
SELECT count(*) FILTER (WHERE n = 1) AS one, count(*) FILTER (WHERE n = 0) AS none,
       count(*) FILTER (WHERE n > 1) AS more
  FROM (SELECT c.id, count(e.seq) AS n
          FROM unnest($1::uuid[]) AS c(id)
          LEFT JOIN episodic_events e ON e.conversation_id = c.id AND e.kind = 'boundary'
         GROUP BY c.id) AS t
"""

ATTEMPTS = """
SELECT outcome, count(*) AS n FROM episodic_compaction_attempts
 WHERE conversation_id = ANY($1::uuid[]) GROUP BY outcome
"""


async def check(conn: asyncpg.Connection, convs: list[UUID], result: Result) -> None:
    """Every conversation got exactly one boundary, and every attempt succeeded."""
    row = await conn.fetchrow(BOUNDARIES, convs)
    attempts = {r["outcome"]: r["n"] for r in await conn.fetch(ATTEMPTS, convs)}
    due = (await conn.fetchrow(DUE_AND_LEASED))["due"]
    n = len(convs)
    problems = []
    if row["one"] != n:
        problems.append(f"{row['one']:,} of {n:,} with one boundary")
    if row["none"]:
        problems.append(f"{row['none']:,} with none")
    if row["more"]:
        problems.append(f"{row['more']:,} with more than one")
    if due:
        problems.append(f"{due:,} still due")
    if attempts != {"succeeded": n}:
        problems.append("attempts " + ", ".join(f"{k} {v:,}" for k, v in sorted(attempts.items())))
    reported = sum(p.succeeded for p in result.processes)
    if reported != n:
        problems.append(f"workers report {reported:,} succeeded")
    result.ok = not problems
    result.check = (
        f"ok: {n:,} of {n:,} with one boundary" if result.ok else "FAILED: " + "; ".join(problems)
    )


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat; (0, 0) where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # without guest time, already counted in user
    return total - idle, total


def process_cpu(pids: list[int]) -> dict[int, int]:
    """CPU jiffies (user + system) used so far by each of ``pids`` that still runs, from
    /proc (empty where there is none)."""
    used = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        used[pid] = int(fields[11]) + int(fields[12])
    return used


BACKENDS = """
SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


async def backend_cpu(conn: asyncpg.Connection) -> dict[int, int]:
    """CPU jiffies of the server processes serving the benchmark's database (the workers'
    connections), when the server runs on this machine."""
    return process_cpu([row["pid"] for row in await conn.fetch(BACKENDS)])


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None and proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.write(b"stop\n")
            proc.stdin.close()


async def run_scenario(
    args: argparse.Namespace,
    url: str,
    conn: asyncpg.Connection,
    scenario: Scenario,
    logs: Path,
    profile: Path | None = None,
) -> Result:
    result = Result(scenario)
    command = [
        sys.executable,
        "-m",
        "bench.worker_process",
        url,
        "--concurrency",
        str(scenario.concurrency),
        "--delay",
        str(scenario.delay),
    ]
    if args.worker_pool:
        command += ["--pool", str(args.worker_pool)]
    procs: list[asyncio.subprocess.Process] = []
    stderr = [(logs / f"worker-{i}.log").open("wb") for i in range(scenario.processes)]
    try:
        for i in range(scenario.processes):
            extra = ["--profile", str(profile)] if profile is not None and i == 0 else []
            procs.append(
                await asyncio.create_subprocess_exec(
                    *command,
                    *extra,
                    cwd=ROOT,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr[i],
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            if line.strip() != b"ready":
                raise RuntimeError(f"worker process did not start: {line!r}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
        for proc in procs:
            assert proc.stdin is not None
            await proc.stdin.drain()
        busy0, total0 = cpu_times()
        pg0, t0 = await backend_cpu(conn), time.monotonic()

        expected = scenario.conversations * (scenario.delay + 0.01) / scenario.concurrency
        deadline = time.monotonic() + 60 + 10 * expected
        while True:
            await asyncio.sleep(POLL_S)
            row = await conn.fetchrow(DUE_AND_LEASED)
            result.peak_leased = max(result.peak_leased, row["leased"])
            if row["due"] == 0:
                break
            if any(proc.returncode is not None for proc in procs):
                log("a worker process exited early")
                break
            if time.monotonic() > deadline:
                log(f"timed out with {row['due']:,} conversations still due")
                break
        busy1, total1 = cpu_times()
        pg1, t1 = await backend_cpu(conn), time.monotonic()
        if pg1:
            used = sum(j - pg0.get(pid, 0) for pid, j in pg1.items()) / TICK
            result.postgres_cpu = used / (t1 - t0)
        if total1 > total0:
            result.machine_cpu = (busy1 - busy0) / (total1 - total0)
        await _stop(procs)
        for proc in procs:
            assert proc.stdout is not None
            out = await asyncio.wait_for(proc.stdout.read(), timeout=120)
            await proc.wait()
            lines = out.decode().strip().splitlines()
            if proc.returncode or not lines:
                tails = "\n".join(f.name + ":\n" + _tail(Path(f.name)) for f in stderr)
                raise RuntimeError(f"worker process failed (exit {proc.returncode})\n{tails}")
            reported = json.loads(lines[-1])
            reported.pop("worker", None)
            result.processes.append(Process(**reported))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        for f in stderr:
            f.close()
    return result


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def run(args: argparse.Namespace, url: str) -> list[Result]:
    """Every scenario, in order; then, with ``--worker-profile PATH``, one more run of the
    instant summarizer at concurrency 16 in 1 process under cProfile (not in the table)."""
    with tempfile.TemporaryDirectory(prefix="episodic-bench-worker-") as logs:
        return await _run(args, url, Path(logs))


async def _run(args: argparse.Namespace, url: str, logs: Path) -> list[Result]:
    store = await EpisodicStore.open(
        url,
        settings=EpisodicSettings(_env_file=None),
        trigger=EpisodicCompactionConfig(trigger_unfinished_turns=UNFINISHED_TURNS),
    )
    conn = await asyncpg.connect(url)
    try:
        await store.migrate()
        results = []
        for i, scenario in enumerate(scenarios(args)):
            log(f"worker: seeding {scenario.conversations:,} due conversations")
            convs = await seed(store, scenario.conversations, args.worker_messages, f"w{i}")
            due = (await conn.fetchrow(DUE_AND_LEASED))["due"]
            if due != len(convs):
                raise RuntimeError(f"{due:,} conversations due, expected {len(convs):,}")
            log(f"worker: {scenario.label}")
            result = await run_scenario(args, url, conn, scenario, logs)
            await check(conn, convs, result)
            log(
                f"worker: {result.rate:,.1f} compactions/s in {result.seconds:.2f} s; "
                f"{result.check}"
            )
            results.append(result)
        if args.worker_profile:
            scenario = Scenario(1, 16, args.worker_conversations)
            log(f"worker: seeding {scenario.conversations:,} due conversations")
            convs = await seed(store, scenario.conversations, args.worker_messages, "wp")
            log(f"worker: {scenario.label}, under cProfile (not in the table)")
            path = args.worker_profile.resolve()
            result = await run_scenario(args, url, conn, scenario, logs, profile=path)
            await check(conn, convs, result)
            log(f"worker: profiled: {result.rate:,.1f} compactions/s; {result.check}")
            print_profile(path)
        return results
    finally:
        await conn.close()
        await store.close()


def print_profile(path: Path, top: int = 30) -> None:
    """The profiled process's hot spots: own time, then cumulative time, on stderr."""
    stats = pstats.Stats(str(path), stream=sys.stderr)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(
        f"\nbench: cProfile of one worker process ({total:.2f} s profiled), {path}", file=sys.stderr
    )
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


# ---- the report -----------------------------------------------------------------------------


def _num(value: float, digits: int = 0) -> str:
    return "" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def table(results: list[Result]) -> str:
    lines = [
        "| workload | conversations | seconds | compactions/s, total | compactions/s per process "
        "| peak in flight (worker / leased rows) | worker CPU | PostgreSQL CPU | machine CPU busy "
        "| check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        digits = 1 if r.scenario.delay else 0
        per = " / ".join(_num(p.rate, digits) for p in r.processes)
        peak = " + ".join(str(p.peak_in_flight) for p in r.processes)
        cpu = " / ".join(f"{p.cpu_share:.0%}" for p in r.processes)
        lines.append(
            f"| {r.scenario.label} | {r.scenario.conversations:,} | {_num(r.seconds, 2)} "
            f"| {_num(r.rate, digits)} | {per} | {peak} / {r.peak_leased} "
            f"| {cpu} | {_num(r.postgres_cpu * 100)}% | {_num(r.machine_cpu * 100)}% | {r.check} |"
        )
    summary = summaries(results)
    if summary:
        lines += ["", "| figure | value | target (issues 5, 7) | meets |", "|---|---:|---|---|"]
        for s in summary:
            met = "" if s.target == "" else ("yes" if s.met else "no")
            lines.append(f"| {s.name} | {_num(s.value, 1)} | {s.target} | {met} |")
    return "\n".join(lines)


def summaries(results: list[Result]) -> list[Summary]:
    out = []
    instant = [r for r in results if not r.scenario.delay and r.processes]
    if instant:
        best = max(instant, key=lambda r: min(p.rate for p in r.processes))
        rate = min(p.rate for p in best.processes)
        out.append(
            Summary(
                f"compactions/s per process, instant summarizer (best: {best.scenario.label})",
                rate,
                ">= 500",
                rate >= TARGET,
            )
        )
    for r in results:
        if r.scenario.delay and r.processes:
            d, p, c = r.scenario.delay, r.scenario.processes, r.scenario.concurrency
            out.append(
                Summary(
                    f"{r.scenario.label}: compactions/s (one attempt at a time per process: "
                    f"{p / d:g}/s; {p * c} in flight: {p * c / d:g}/s)",
                    r.rate,
                    "",
                    True,
                )
            )
    return out


def notes(results: list[Result]) -> str:
    pool = ", ".join(map(str, sorted({p.pool for r in results for p in r.processes}))) or "?"
    delays = " or ".join(sorted({f"{r.scenario.delay:g} s" for r in results if r.scenario.delay}))
    return (
        "Notes: each row seeds its own due conversations (one batch append of the bench history "
        "per conversation: ~400-character messages, a tool call/result pair every fifth turn; "
        f"due by `trigger_unfinished_turns={UNFINISHED_TURNS}`), then starts the worker processes "
        "(`python -m bench.worker_process`: `CompactionWorker(...).run()`, a pool of "
        f"{pool} connections opened up front), releases them together and stops them when "
        "nothing is due. *seconds* runs from the release to the last attempt that ended; "
        "*compactions/s per process* is each process's successful attempts over its own span. "
        "The instant summarizer returns a fixed ~2,000-character summary without yielding; the "
        f"slow one sleeps {delays or '2 s'} first. *peak in flight* is the largest "
        "`worker.in_flight` each process saw (sampled every 5 ms) and the most rows holding a "
        "lease at once (sampled every 50 ms). *worker CPU* is each process's CPU time over its "
        "wall time, and *PostgreSQL CPU* the same for the server processes serving this "
        "database, i.e. the workers' connections (1 CPU = 100%), from the release until "
        "nothing was due; *machine CPU busy* is the share of all the machine's CPUs busy over "
        "that span (/proc/stat: the workers, PostgreSQL and anything else, such as other "
        "engineers' test runs). *check* counts boundaries per conversation with SQL (exactly "
        "one each) and the attempts ledger (every attempt succeeded); a failed check makes "
        "`python -m bench` exit 1. Timings are reported, never asserted. `--worker-profile "
        "PATH` adds one more run (instant, 1 process x concurrency 16, not in the table) under "
        "cProfile and prints its hot spots."
    )


def section(results: list[Result], meta: dict[str, str]) -> str:
    return "\n".join(
        [
            "## Worker",
            "",
            "Compactions per second of the compaction worker (`bench/worker.py`), on its own",
            "throwaway database; a shared, noisy machine, so figures are indicative.",
            "",
            *run_facts(meta),
            "",
            table(results),
            "",
            textwrap.fill(notes(results), 92, break_on_hyphens=False),
            "",
        ]
    )
