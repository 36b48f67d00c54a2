"""``python -m bench --citus``: episodic on a Citus cluster beside plain PostgreSQL, in one run.

Two throwaway databases, created and always dropped (also on Ctrl-C or SIGTERM): one on the
plain server (``--url``) and one distributed over the cluster (``--citus-url``, its
coordinator; 32 shards). Each gets the same history through the public API (10,000
conversations x 100 messages, batch appends from several tasks; a boundary on every tenth),
then the same workloads, alternating between the two stores in rounds: single-message
appends to random conversations and ``load_context`` of random conversations, at concurrency
1 and 16. Then the size of the log on each. The results go to the "## Citus" section of
bench/RESULTS.md, the only part of the file this rewrites.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import signal
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import asyncpg
from sqlalchemy.engine import make_url

from bench import db
from bench.provenance import episodic_source, run_facts
from bench.report import with_section
from bench.run import log
from bench.stats import Latency, ratio, split
from bench.workload import History, text
from episodic import BoundaryRequest, EpisodicStore, Message
from episodic.settings import EpisodicSettings
from tests.support_citus import create_distributed_database, drop_distributed_database

DEFAULT_CITUS_URL = "postgresql://postgres@127.0.0.1:9700/postgres"
SHARDS = 32
#: every BOUNDARY_EVERY-th conversation gets a boundary after its first BOUNDARY_AT messages
BOUNDARY_EVERY = 10
TAIL = 20
#: the build and the measurements alternate between the stores in this many rounds
ROUNDS = 4
SUMMARY = "Handoff: " + " ".join(text(i) for i in range(5))
STORES = ("PostgreSQL", "Citus")
DROP_ATTEMPTS = 12
DROP_RETRY_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Citus (--citus; not run by default or in CI)")
    g.add_argument(
        "--citus",
        action="store_true",
        help="run only the Citus comparison and rewrite only the '## Citus' section",
    )
    g.add_argument(
        "--citus-url",
        default=DEFAULT_CITUS_URL,
        help="the cluster's coordinator, and a database on it to connect to for "
        "CREATE/DROP DATABASE (default: %(default)s)",
    )
    g.add_argument(
        "--citus-conversations",
        type=int,
        default=10_000,
        help="conversations in each store's history (default: %(default)s)",
    )
    g.add_argument(
        "--citus-events",
        type=int,
        default=100,
        help="messages per conversation, one batch append each (default: %(default)s)",
    )
    g.add_argument(
        "--citus-build-tasks",
        type=int,
        default=8,
        help="concurrent tasks building the history (default: %(default)s)",
    )
    g.add_argument(
        "--citus-concurrency",
        type=int,
        default=16,
        help="the higher concurrency measured besides 1 (default: %(default)s)",
    )
    g.add_argument(
        "--citus-seconds",
        type=float,
        default=20.0,
        help="seconds of each workload on each store, over the rounds (default: %(default)s)",
    )


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.citus:
        return
    if args.citus_conversations < BOUNDARY_EVERY:
        p.error(f"--citus-conversations must be at least {BOUNDARY_EVERY}")
    if args.citus_events < 2 * TAIL:
        p.error(f"--citus-events must be at least {2 * TAIL}")
    if min(args.citus_build_tasks, args.citus_concurrency) < 1 or args.citus_seconds <= 0:
        p.error("--citus-build-tasks, --citus-concurrency and --citus-seconds must be positive")


# ---- the history ------------------------------------------------------------------------


@dataclass
class Build:
    conversations: int = 0
    messages: int = 0
    boundaries: int = 0
    create_s: float = 0.0
    append_s: float = 0.0
    boundary_s: float = 0.0
    plain: list[UUID] = field(default_factory=list)
    bounded: list[UUID] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.create_s + self.append_s + self.boundary_s


def history_batch(events: int) -> tuple[list[Message], int]:
    """The batch every conversation is built with, and the seq (from 1) of its last message
    before the tail, a safe cut for a boundary."""
    h = History("bulk")
    head = h.take(events - TAIL)
    return head + h.take(TAIL), len(head)


async def _each(tasks: int, items: list[int], work: Callable[[int], Awaitable[None]]) -> float:
    """``work(item)`` for every item, ``tasks`` at a time; the wall time."""
    queue = iter(items)

    async def worker() -> None:
        for item in queue:
            await work(item)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return time.perf_counter() - start


async def build_part(
    store: EpisodicStore, build: Build, first: int, count: int, events: int, tasks: int
) -> None:
    """Conversations ``first`` .. ``first + count - 1``: created, one batch append of
    ``events`` messages each, then a boundary on every BOUNDARY_EVERY-th (covering all but
    the last TAIL messages); each step timed over all of them."""
    batch, cut = history_batch(events)
    convs: dict[int, UUID] = {}
    cut_seq: dict[int, int] = {}
    indices = list(range(first, first + count))

    async def create(i: int) -> None:
        convs[i] = await store.create_conversation(tenant_id="bench")

    async def append(i: int) -> None:
        stored = await store.append(convs[i], batch)
        cut_seq[i] = stored[cut - 1].seq

    async def boundary(i: int) -> None:
        await store.write_boundary(
            convs[i],
            BoundaryRequest(
                summary=SUMMARY,
                covers_through_seq=cut_seq[i],
                retained=[text(1), text(2)],
                reason="context_pressure",
                expected_boundary_seq=None,
            ),
        )

    build.create_s += await _each(tasks, indices, create)
    build.append_s += await _each(tasks, indices, append)
    bounded = [i for i in indices if i % BOUNDARY_EVERY == 0]
    build.boundary_s += await _each(tasks, bounded, boundary)
    build.conversations += count
    build.messages += count * len(batch)
    build.boundaries += len(bounded)
    build.bounded += [convs[i] for i in bounded]
    build.plain += [convs[i] for i in indices if i % BOUNDARY_EVERY]


# ---- the workloads ----------------------------------------------------------------------


@dataclass
class Timed:
    calls: int = 0
    seconds: float = 0.0
    samples: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return ratio(self.calls, self.seconds)

    @property
    def latency(self) -> Latency:
        return Latency(tuple(self.samples))


Call = Callable[[EpisodicStore, UUID, int], Awaitable[object]]


async def _append(store: EpisodicStore, conv: UUID, i: int) -> object:
    return await store.append(conv, [Message.user(text(i))])


async def _load(store: EpisodicStore, conv: UUID, i: int) -> object:
    return await store.load_context(conv)


async def timed(
    store: EpisodicStore,
    call: Call,
    convs: list[UUID],
    concurrency: int,
    seconds: float,
    seed: int,
    into: Timed,
) -> None:
    """``concurrency`` tasks calling ``call`` on random conversations back to back for
    ``seconds``; the calls, wall time and per-call latencies added to ``into``."""
    deadline = time.perf_counter() + seconds

    async def task(k: int) -> None:
        rng = random.Random(seed * 1_000 + k)
        samples = into.samples
        i = 0
        while time.perf_counter() < deadline:
            conv = rng.choice(convs)
            t0 = time.perf_counter()
            await call(store, conv, i)
            samples.append(time.perf_counter() - t0)
            i += 1

    start = time.perf_counter()
    before = len(into.samples)
    await asyncio.gather(*(task(k) for k in range(concurrency)))
    into.seconds += time.perf_counter() - start
    into.calls += len(into.samples) - before


async def warm(store: EpisodicStore, call: Call, convs: list[UUID], concurrency: int) -> None:
    """Every connection the workload will use opened (and, on Citus, the coordinator's to the
    workers), untimed."""
    rng = random.Random(0)
    for _ in range(3):
        await asyncio.gather(*(call(store, rng.choice(convs), 0) for _ in range(concurrency)))


@dataclass
class Row:
    workload: str
    concurrency: int
    results: dict[str, Timed]


async def workloads(
    stores: dict[str, EpisodicStore], builds: dict[str, Build], args: argparse.Namespace
) -> list[Row]:
    rows: list[Row] = []
    tail = f"~{TAIL} messages behind a boundary"
    kinds: list[tuple[str, Call, Callable[[Build], list[UUID]]]] = [
        (f"load_context, no boundary ({args.citus_events} messages)", _load, lambda b: b.plain),
        (f"load_context, {tail}", _load, lambda b: b.bounded),
        ("append 1 message to a random conversation", _append, lambda b: b.plain + b.bounded),
    ]
    levels = sorted({1, args.citus_concurrency})
    for what, call, pick in kinds:
        for concurrency in levels:
            log(f"{what}, concurrency {concurrency}: {args.citus_seconds:g} s on each store")
            results = {name: Timed() for name in stores}
            for name, store in stores.items():
                await warm(store, call, pick(builds[name]), concurrency)
            for r in range(ROUNDS):
                # Alternate which store goes first, so neither always follows the other.
                order = list(stores) if r % 2 == 0 else list(reversed(stores))
                for name in order:
                    await timed(
                        stores[name],
                        call,
                        pick(builds[name]),
                        concurrency,
                        args.citus_seconds / ROUNDS,
                        seed=r,
                        into=results[name],
                    )
            rows.append(Row(what, concurrency, results))
    return rows


# ---- storage ----------------------------------------------------------------------------


@dataclass
class Storage:
    events: int
    conversations: int
    events_table: int  # heap + TOAST
    events_indexes: int
    heads: int  # episodic_conversations, with its indexes
    #: Citus: (node, shards, bytes of episodic_events' shards) per node
    nodes: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def events_total(self) -> int:
        return self.events_table + self.events_indexes


PLAIN_SIZES = """
SELECT (SELECT count(*) FROM episodic_events) AS events,
       (SELECT count(*) FROM episodic_conversations) AS conversations,
       pg_table_size('episodic_events') AS events_table,
       pg_indexes_size('episodic_events') AS events_indexes,
       pg_total_relation_size('episodic_conversations') AS heads
"""
CITUS_SIZES = """
SELECT (SELECT count(*) FROM episodic_events) AS events,
       (SELECT count(*) FROM episodic_conversations) AS conversations,
       citus_table_size('episodic_events') AS events_table,
       citus_total_relation_size('episodic_events') - citus_table_size('episodic_events')
           AS events_indexes,
       citus_total_relation_size('episodic_conversations') AS heads
"""
CITUS_NODES = """
SELECT nodename || ':' || nodeport AS node, count(*) AS shards, sum(shard_size) AS bytes
  FROM citus_shards WHERE table_name = 'episodic_events'::regclass
 GROUP BY nodename, nodeport ORDER BY nodeport
"""


async def vacuum(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM (ANALYZE) episodic_events, episodic_conversations")
    finally:
        await conn.close()


async def storage(url: str, distributed: bool) -> Storage:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(CITUS_SIZES if distributed else PLAIN_SIZES)
        nodes = await conn.fetch(CITUS_NODES) if distributed else []
    finally:
        await conn.close()
    return Storage(
        **{k: int(v) for k, v in row.items()},
        nodes=[(n["node"], int(n["shards"]), int(n["bytes"])) for n in nodes],
    )


async def citus_version(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SELECT citus_version()"))
    finally:
        await conn.close()


# ---- the run ----------------------------------------------------------------------------


@dataclass
class Result:
    builds: dict[str, Build]
    rows: list[Row]
    storage: dict[str, Storage]
    postgres: str
    citus: str


async def run(args: argparse.Namespace, urls: dict[str, str]) -> Result:
    pool = max(args.citus_build_tasks, args.citus_concurrency)
    stores: dict[str, EpisodicStore] = {}
    try:
        for name, url in urls.items():
            # The shard count is ignored on plain PostgreSQL.
            settings = EpisodicSettings(
                _env_file=None, pool_max_size=pool, citus_shard_count=SHARDS
            )
            stores[name] = await EpisodicStore.open(url, settings=settings)
            log(f"{name}: migrating")
            await stores[name].migrate()
        n, events = args.citus_conversations, args.citus_events
        log(
            f"building {n:,} conversations x {events} messages on each store, "
            f"{args.citus_build_tasks} tasks, in {ROUNDS} alternating parts"
        )
        builds = {name: Build() for name in stores}
        first = 0
        for count in split(n, ROUNDS):
            for name, store in stores.items():
                t0 = time.perf_counter()
                await build_part(store, builds[name], first, count, events, args.citus_build_tasks)
                log(f"{name}: {count:,} conversations in {time.perf_counter() - t0:.1f} s")
            first += count
        sizes: dict[str, Storage] = {}
        for name, url in urls.items():
            log(f"{name}: VACUUM ANALYZE, then the log's size")
            await vacuum(url)
            sizes[name] = await storage(url, distributed=name == "Citus")
        rows = await workloads(stores, builds, args)
        log("done")
        return Result(
            builds,
            rows,
            sizes,
            await db.server_version(urls["PostgreSQL"]),
            await citus_version(urls["Citus"]),
        )
    finally:
        for store in stores.values():
            await store.close()


def main(args: argparse.Namespace, command: str) -> int:
    """The whole ``--citus`` run: both databases created, measured, always dropped; the
    section written to ``args.output``. The exit status."""
    names = {"PostgreSQL": db.new_database_name(), "Citus": db.new_database_name()}
    servers = {"PostgreSQL": args.url, "Citus": args.citus_url}
    started = time.perf_counter()
    failed: list[str] = []
    try:
        try:
            asyncio.run(db.create_database(args.url, names["PostgreSQL"]))
            print(f"bench: database {names['PostgreSQL']} on {args.url}", file=sys.stderr)
            asyncio.run(create_distributed_database(args.citus_url, names["Citus"]))
            print(f"bench: database {names['Citus']} on {args.citus_url}", file=sys.stderr)
            urls = {k: db.database_url(servers[k], names[k]) for k in names}
            result = asyncio.run(run(args, urls))
        finally:
            failed = _drop(servers, names)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    if failed:
        return 1
    meta = {
        **db.machine(),
        "postgres": result.postgres,
        "command": command,
        "episodic": episodic_source(),
        "runtime": f"{time.perf_counter() - started:.0f} s",
    }
    print(table(result))
    output: Path = args.output
    previous = output.read_text() if output.exists() else ""
    output.write_text(with_section(previous, "Citus", section(result, meta, args)))
    print(f"\nwritten to {output}", file=sys.stderr)
    return 0


def _drop(servers: dict[str, str], names: dict[str, str]) -> list[str]:
    """Drop both databases whatever happened, ignoring Ctrl-C / SIGTERM meanwhile; the names
    of those that could not be dropped. A server that is restarting (a crashed backend
    takes every session down, "the database system is in recovery mode") is waited for."""
    previous = (
        signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    failed = []
    try:
        for key, drop in (
            ("PostgreSQL", db.drop_database),
            ("Citus", drop_distributed_database),
        ):
            for attempt in range(1, DROP_ATTEMPTS + 1):
                try:
                    asyncio.run(drop(servers[key], names[key]))
                    print(f"bench: dropped {names[key]}", file=sys.stderr)
                    break
                except Exception as exc:  # e.g. a server restarting: retry, then report
                    print(
                        f"bench: could not drop {names[key]} on {servers[key]} "
                        f"(attempt {attempt} of {DROP_ATTEMPTS}): {exc!r}",
                        file=sys.stderr,
                    )
                    if attempt == DROP_ATTEMPTS:
                        failed.append(names[key])
                    else:
                        time.sleep(DROP_RETRY_S)
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    return failed


# ---- the report -------------------------------------------------------------------------


def _n(value: float, digits: int = 0) -> str:
    return "" if math.isnan(value) else f"{value:,.{digits}f}"


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f}"


def table(result: Result) -> str:
    pg, ct = (result.builds[s] for s in STORES)
    lines = [
        "| history build | PostgreSQL | Citus | Citus / PostgreSQL |",
        "|---|---:|---:|---:|",
    ]
    rates: list[tuple[str, Callable[[Build], float]]] = [
        ("conversations created per s", lambda b: b.conversations / b.create_s),
        (
            "**bulk append throughput**, messages/s (batches of "
            f"{pg.messages // pg.conversations})",
            lambda b: b.messages / b.append_s,
        ),
        ("boundaries written per s", lambda b: b.boundaries / b.boundary_s),
    ]
    for what, rate in rates:
        a, b = rate(pg), rate(ct)
        lines.append(f"| {what} | {_n(a)} | {_n(b)} | {_n(ratio(b, a), 2)} |")
    lines.append(
        f"| build wall time, s ({pg.conversations:,} conversations, {pg.messages:,} messages, "
        f"{pg.boundaries:,} boundaries) | {pg.seconds:,.1f} | {ct.seconds:,.1f} "
        f"| {_n(ratio(ct.seconds, pg.seconds), 2)} |"
    )
    lines += [
        "",
        "| workload | concurrency | PostgreSQL calls/s | p50 ms | p99 ms | Citus calls/s "
        "| p50 ms | p99 ms | Citus / PostgreSQL calls/s | Citus / PostgreSQL p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result.rows:
        p, c = row.results["PostgreSQL"], row.results["Citus"]
        pl, cl = p.latency, c.latency
        lines.append(
            f"| {row.workload} | {row.concurrency} | {_n(p.per_second)} | {pl.median_ms:.2f} "
            f"| {pl.p99_ms:.2f} | {_n(c.per_second)} | {cl.median_ms:.2f} | {cl.p99_ms:.2f} "
            f"| {_n(ratio(c.per_second, p.per_second), 2)} "
            f"| {_n(ratio(cl.median_ms, pl.median_ms), 2)} |"
        )
    lines += [
        "",
        "| storage (after the build, VACUUM ANALYZE) | PostgreSQL | Citus |",
        "|---|---:|---:|",
    ]
    sp, sc = (result.storage[s] for s in STORES)
    figures: list[tuple[str, Callable[[Storage], str]]] = [
        ("episodic_events rows", lambda s: f"{s.events:,}"),
        ("episodic_events heap + TOAST, MiB", lambda s: _mib(s.events_table)),
        ("episodic_events indexes, MiB", lambda s: _mib(s.events_indexes)),
        ("episodic_events total, MiB", lambda s: _mib(s.events_total)),
        ("bytes per event (total / rows)", lambda s: _n(s.events_total / s.events)),
        ("episodic_conversations (heads) total, MiB", lambda s: _mib(s.heads)),
        (
            "bytes per conversation (events + head)",
            lambda s: _n((s.events_total + s.heads) / s.conversations),
        ),
    ]
    for what, get in figures:
        lines.append(f"| {what} | {get(sp)} | {get(sc)} |")
    nodes = ", ".join(
        f"{node}: {shards} shards, {_mib(size)} MiB" for node, shards, size in sc.nodes
    )
    lines.append(f"| Citus: episodic_events per node | | {nodes} |")
    return "\n".join(lines)


def section(result: Result, meta: dict[str, str], args: argparse.Namespace) -> str:
    b = result.builds["PostgreSQL"]
    per = b.messages // b.conversations
    notes = (
        f"The history: {b.conversations:,} conversations, created one call each, then one "
        f"batch append of {per} messages each (~400-character texts, a tool call/result pair "
        f"every fifth turn), then on every {BOUNDARY_EVERY}th a boundary covering all but the "
        f"last {TAIL} messages; {args.citus_build_tasks} tasks, through EpisodicStore's "
        f"public API, each step timed over its calls. The build alternates between the two "
        f"stores in {ROUNDS} parts (PostgreSQL's first) and every workload in {ROUNDS} rounds "
        "(which store goes first alternating), so both see the same machine; VACUUM ANALYZE "
        "runs on both after the build. Each workload runs "
        f"{args.citus_seconds:g} s per store. Workloads pick a random conversation per call "
        "(a seeded RNG per task): appends among all of them, loads among those with no "
        "boundary or those with one (the handoff summary, 2 retained user messages and the "
        "tail, growing slightly as the append workload runs last). *calls/s* is calls over "
        "wall time with that many tasks calling back to back; p50/p99 are per-call "
        "latencies. Both stores use the library's defaults (pool of "
        f"{max(args.citus_build_tasks, args.citus_concurrency)} connections), so concurrent "
        "appends on plain PostgreSQL are coalesced into shared calls (append_calls = 2), "
        "while on Citus each append is its own call, delegated to the worker holding its "
        f"conversation. The cluster's database has {SHARDS} shards per distributed table. "
        "Storage: pg_table_size / pg_indexes_size / pg_total_relation_size on PostgreSQL, "
        "citus_table_size / citus_total_relation_size (the shards' sums) on Citus; "
        "*bytes per conversation* includes its head row. All four servers (PostgreSQL 15 "
        "on :5432, the Citus coordinator and 2 workers) run with the same settings "
        "(shared_buffers 128 MB, fsync and synchronous_commit on)."
    )
    return "\n".join(
        [
            "## Citus",
            "",
            "episodic on a 3-node Citus cluster (coordinator + 2 workers) beside plain",
            "PostgreSQL, the same history and workloads on each (`bench/citus.py`, run by",
            "`python -m bench --citus`, not in CI).",
            "",
            "**Machine note:** the coordinator, both workers, plain PostgreSQL and the",
            "benchmark client all run on the same 2-core machine, so every Citus call pays",
            "the coordinator-to-worker hop and an extra backend on the same two cores, with",
            "none of the capacity extra machines would add. The Citus figures are a lower",
            "bound, not a projection of a real cluster.",
            "",
            *run_facts(meta),
            f"- Citus: {result.citus} (coordinator {_where(args.citus_url)}, workers on the "
            "same machine)",
            "",
            table(result),
            "",
            textwrap.fill(notes, 92, break_on_hyphens=False),
            "",
        ]
    )


def _where(url: str) -> str:
    u = make_url(url)
    return f"{u.host}:{u.port}"


__all__ = ["add_arguments", "check_arguments", "main"]
