"""``python -m bench.profile``: where each microsecond of the request path goes.

For raw asyncpg and for episodic, on one throwaway database with ``synchronous_commit = off``
(so the durable commit, which is the disk's, does not hide the logic): per call, the client's
CPU (``time.process_time``), the server's CPU (the backend's ``utime + stime`` from
``/proc/<pid>/stat``, summed over many calls: a tick is 10 ms) and the wall time. Then the
client's part of the episodic calls split by phase, and the top functions of a ``cProfile``
of each. Prints markdown; ``--write`` puts it into ``bench/PROFILE.md`` under a heading.

The server must run on this machine for the server's CPU (``/proc``); elsewhere it says n/a.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import orjson

from bench import buildup, db, ours, raw
from bench.buildup import FLOOR, FLOOR_APPEND
from bench.provenance import command_line, episodic_source
from bench.workload import History, text
from episodic import BoundaryRequest, EpisodicStore, Message
from episodic.context import compose_context
from episodic.settings import EpisodicSettings
from episodic.store.batch import prepare_batch
from episodic.store.codec import decode_tail
from episodic.store.postgres.queries import LOAD_TAIL

PROFILE = Path(__file__).with_name("PROFILE.md")

TICK_US = 1_000_000 / os.sysconf("SC_CLK_TCK")


def server_cpu(pid: int) -> float | None:
    """The backend's CPU time so far, in microseconds (None when it is not on this machine)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_US  # utime, stime (fields 14, 15)


@dataclass(frozen=True)
class Cost:
    """Per-call costs of ``calls`` calls, in microseconds (``server`` None when unknown)."""

    what: str
    calls: int
    wall: float
    client: float
    server: float | None
    per: str = "call"

    def row(self) -> str:
        digits = 0 if self.per == "call" else 1  # a loaded message costs a few µs
        server = f"{self.server:,.{digits}f}" if self.server is not None else "n/a"
        return (
            f"| {self.what} | {self.calls:,} | {self.wall:,.{digits}f} | "
            f"{self.client:,.{digits}f} | {server} | per {self.per} |"
        )


async def measure(
    what: str,
    calls: int,
    pid: int,
    call: Callable[[int], Awaitable[object]],
    *,
    per: int = 1,
    unit: str = "call",
) -> Cost:
    """Run ``call(i)`` ``calls`` times on the connection whose backend is ``pid``; costs are
    divided by ``calls * per`` (``per`` items handled per call: messages loaded)."""
    for i in range(calls, calls + min(20, calls)):  # prepared statements, caches (own indices)
        await call(i)
    server0, cpu0, wall0 = server_cpu(pid), time.process_time(), time.perf_counter()
    for i in range(calls):
        await call(i)
    wall, cpu, server1 = time.perf_counter() - wall0, time.process_time() - cpu0, server_cpu(pid)
    n = calls * per
    server = (server1 - server0) / n if server0 is not None and server1 is not None else None
    return Cost(what, calls, wall * 1e6 / n, cpu * 1e6 / n, server, unit)


def top_functions(profile: cProfile.Profile, limit: int = 14) -> str:
    """The functions with the most own time, as a markdown list."""
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime")
    rows = []
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, tottime, _, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:limit]:
        where = f"{Path(file).name}:{line}" if file != "~" else "builtin"
        rows.append(
            f"| `{name}` | {where} | {calls:,} | {tottime * 1e3:,.1f} | {tottime / total:.0%} |"
        )
    header = "| function | where | calls | own ms | share |\n|---|---|---:|---:|---:|\n"
    return header + "\n".join(rows)


async def profiled(call: Callable[[int], Awaitable[object]], calls: int) -> cProfile.Profile:
    profile = cProfile.Profile()
    profile.enable()
    for i in range(calls):
        await call(i)
    profile.disable()
    return profile


def server_total_cpu() -> float | None:
    """The CPU time so far of every PostgreSQL process on this machine (backends, WAL writer,
    checkpointer...), in microseconds; None when the server is not on this machine."""
    total = 0.0
    found = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name, rest = stat.split(" (", 1)[1].rsplit(")", 1)
        if name.startswith("postgres"):
            found = True
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) * TICK_US
    return total if found else None


@dataclass(frozen=True)
class Concurrent:
    """The concurrent-append benchmark's workload, with every CPU it used."""

    what: str
    appends: int
    wall: float  # s
    client: float  # µs per append
    server: float | None  # µs per append, all server processes

    def row(self) -> str:
        server = f"{self.server:,.0f}" if self.server is not None else "n/a"
        both = self.client + self.server if self.server is not None else None
        bound = f"{(os.cpu_count() or 1) * 1e6 / both:,.0f}" if both else "n/a"
        return (
            f"| {self.what} | {self.appends:,} | {self.appends / self.wall:,.0f} | "
            f"{self.client:,.0f} | {server} | {bound} |"
        )


async def concurrent_costs(url: str, tasks: int, conversations: int, per_task: int) -> str:
    """``python -m bench``'s concurrent workload (durable commits, as there), raw asyncpg, the
    floor (:data:`FLOOR`) and episodic in turn, with the client's CPU and the whole server's:
    on a machine whose cores the client and the server share, their sum bounds the
    throughput."""
    store = await EpisodicStore.open(
        url, settings=EpisodicSettings(_env_file=None, pool_min_size=tasks, pool_max_size=tasks)
    )
    conns = [await asyncpg.connect(url) for _ in range(tasks)]
    payloads = [orjson.dumps({"role": "user", "content": text(i)}).decode() for i in range(64)]
    owned = [
        [await store.create_conversation(tenant_id="bench") for _ in range(conversations)]
        for _ in range(tasks)
    ]
    seqs = [[0] * conversations for _ in range(tasks)]
    raw_convs = [[uuid4() for _ in range(conversations)] for _ in range(tasks)]

    async def raw_task(t: int, n: int) -> None:
        for i in range(n):
            k = i % conversations
            seqs[t][k] += 1
            await conns[t].execute(raw.INSERT, raw_convs[t][k], seqs[t][k], payloads[i % 64])

    floor_convs = [[uuid4() for _ in range(conversations)] for _ in range(tasks)]
    await conns[0].executemany(
        "INSERT INTO bench_floor_head VALUES ($1, 0, 0)", [(c,) for cs in floor_convs for c in cs]
    )

    async def floor_task(t: int, n: int) -> None:
        for i in range(n):
            conv = floor_convs[t][i % conversations]
            await conns[t].fetchval(FLOOR_APPEND, conv, payloads[i % 64], 12)

    async def ours_task(t: int, n: int) -> None:
        for i in range(n):
            await store.append(owned[t][i % conversations], [Message.user(text(i))])

    workloads = (("raw", raw_task), ("floor", floor_task), ("ours", ours_task))
    totals = {name: [0.0, 0.0, 0.0] for name, _ in workloads}
    try:
        for _name, task in workloads:  # warm, untimed
            await asyncio.gather(*(task(t, 20) for t in range(tasks)))
        rounds = 4
        for _ in range(rounds):
            for name, task in workloads:
                server0, cpu0, wall0 = server_total_cpu(), time.process_time(), time.perf_counter()
                await asyncio.gather(*(task(t, per_task // rounds) for t in range(tasks)))
                wall = time.perf_counter() - wall0
                cpu, server1 = time.process_time() - cpu0, server_total_cpu()
                total = totals[name]
                total[0] += wall
                total[1] += cpu * 1e6
                total[2] += (server1 - server0) if server0 is not None and server1 else 0.0
    finally:
        for conn in conns:
            await conn.close()
        await store.close()
    n = tasks * (per_task // 4 * 4)
    known = server_total_cpu() is not None
    rows = [
        Concurrent(what, n, total[0], total[1] / n, total[2] / n if known else None)
        for what, total in (
            ("raw asyncpg: one INSERT per message", totals["raw"]),
            ("floor: head UPDATE (gapless seq) + INSERT, one call", totals["floor"]),
            ("episodic: store.append, one message", totals["ours"]),
        )
    ]
    return (
        f"{tasks} tasks x {conversations} conversations, {n:,} appends each, durable commits; "
        "CPU per append; *bound*: the appends per second the machine's "
        f"{os.cpu_count()} cores allow at that CPU per append (client + server).\n\n"
        "| workload | appends | appends/s | client CPU µs | server CPU µs (all processes) "
        "| bound, appends/s |\n|---|---:|---:|---:|---:|---:|\n" + "\n".join(r.row() for r in rows)
    )


async def run(url: str, calls: int) -> str:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(raw.CREATE)
        await conn.execute(FLOOR)
    finally:
        await conn.close()
    migrator = await EpisodicStore.open(url, settings=EpisodicSettings(_env_file=None))
    try:
        await migrator.migrate()
    finally:
        await migrator.close()
    # First with durable commits, as python -m bench measures it; then without, for the rest.
    concurrent = await concurrent_costs(url, tasks=8, conversations=50, per_task=500)
    conn = await asyncpg.connect(url)
    try:
        database = await conn.fetchval("SELECT current_database()")
        await conn.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    finally:
        await conn.close()
    settings = EpisodicSettings(_env_file=None, pool_min_size=1, pool_max_size=1)
    store = await EpisodicStore.open(url, settings=settings)
    raw_conn = await asyncpg.connect(url)
    try:
        report = await _report(store, raw_conn, calls)
        steps = await buildup.build_up(store, url, server_cpu, calls=max(calls // 2, 500))
    finally:
        await raw_conn.close()
        await store.close()
    return (
        f"{report}\n### append on the server, from the floor up (bench/buildup.py)\n\n"
        "Each step adds one part of `episodic_append` to the one before; median of 4 "
        f"interleaved rounds.\n\n{buildup.table(steps)}\n\n"
        f"### Concurrent appends: where the CPU goes\n\n{concurrent}\n"
    )


async def _report(store: EpisodicStore, raw_conn: asyncpg.Connection, calls: int) -> str:
    backend = store._backend  # one pooled connection: its backend pid is the one measured
    pid = await backend._pool.fetchval("SELECT pg_backend_pid()")  # type: ignore[attr-defined]
    raw_pid = await raw_conn.fetchval("SELECT pg_backend_pid()")
    costs: list[Cost] = []

    raw_conv = uuid4()
    payloads = [orjson.dumps({"role": "user", "content": text(i)}).decode() for i in range(64)]
    costs.append(
        await measure(
            "raw asyncpg: INSERT one row",
            calls,
            raw_pid,
            lambda i: raw_conn.execute(raw.INSERT, raw_conv, i + 1, payloads[i % 64]),
        )
    )
    floor_conv = uuid4()
    await raw_conn.execute("INSERT INTO bench_floor_head VALUES ($1, 0, 0)", floor_conv)
    costs.append(
        await measure(
            "floor: one function call, head UPDATE (gapless seq) + INSERT",
            calls,
            raw_pid,
            lambda i: raw_conn.fetchval(FLOOR_APPEND, floor_conv, payloads[i % 64], 12),
        )
    )
    conv = await store.create_conversation(tenant_id="bench")
    messages = [Message.user(text(i)) for i in range(64)]

    async def append(i: int) -> object:
        return await store.append(conv, [messages[i % 64]])

    costs.append(await measure("episodic: append one message", calls, pid, append))
    append_profile = await profiled(append, calls)

    # The loads: a whole history, and a 200-message tail behind a boundary.
    loads = max(calls // 20, 20)
    plain = await store.create_conversation(tenant_id="bench")
    await ours.grow(store, plain, History("p"), 0, 1_000)
    tail_rows = 200
    behind = await ours.behind_boundary(store, 1_000, "b")
    filled = uuid4()
    await raw_conn.copy_records_to_table(
        "bench_raw",
        records=[(filled, i + 1, payloads[i % 64]) for i in range(1_000)],
        columns=["conversation_id", "seq", "payload"],
    )
    for what, target, n in (
        ("episodic: load_context, no boundary, 1,000 messages", plain, 1_000),
        ("episodic: load_context behind a boundary, 203 messages", behind, 203),
    ):
        costs.append(
            await measure(
                what, loads, pid, lambda i, t=target: store.load_context(t), per=n, unit="message"
            )
        )
    for n in (tail_rows, 1_000):
        costs.append(
            await measure(
                f"raw asyncpg: fetch + decode {n:,} rows",
                loads,
                raw_pid,
                lambda i, n=n: _raw_load(raw_conn, filled, 1_000 - n),
                per=n,
                unit="message",
            )
        )
    load_profile = await profiled(lambda i: store.load_context(plain), max(loads // 2, 10))

    # The boundary write, on a conversation that keeps growing (the worker's write).
    grown = await store.create_conversation(tenant_id="bench")
    history = History("w")
    state = {"last": await ours.grow(store, grown, history, 0, 10), "boundary": None}

    async def boundary(i: int) -> object:
        written = await store.write_boundary(
            grown,
            BoundaryRequest(
                summary=ours.SUMMARY,
                covers_through_seq=state["last"],  # type: ignore[arg-type]
                reason="context_pressure",
                expected_boundary_seq=state["boundary"],  # type: ignore[arg-type]
            ),
        )
        state["boundary"] = written.seq
        stored = await store.append(grown, history.take(2))
        state["last"] = stored[-1].seq
        return written

    costs.append(
        await measure(
            "episodic: write_boundary (+ a 2-message append)", max(calls // 10, 20), pid, boundary
        )
    )

    phases = await _client_phases(store, plain, messages, calls)
    table = (
        "| operation | calls | wall µs | client CPU µs | server CPU µs | |\n"
        "|---|---:|---:|---:|---:|---|\n" + "\n".join(c.row() for c in costs)
    )
    return (
        f"{table}\n\n### Client time by phase (µs)\n\n{phases}\n\n"
        f"### append: top functions by own time ({calls:,} appends, cProfile)\n\n"
        f"{top_functions(append_profile)}\n\n"
        "### load_context, no boundary, 1,000 messages: top functions by own time\n\n"
        f"{top_functions(load_profile)}\n"
    )


async def _raw_load(conn: asyncpg.Connection, conv: UUID, after: int) -> list[object]:
    return [orjson.loads(r["payload"]) for r in await conn.fetch(raw.TAIL, conv, after)]


async def _client_phases(
    store: EpisodicStore, conv: UUID, messages: list[Message], calls: int
) -> str:
    """The client's work per phase, timed with ``process_time`` over many repetitions."""
    backend = store._backend

    def per_call(work: Callable[[], object], n: int) -> float:
        start = time.process_time()
        for _ in range(n):
            work()
        return (time.process_time() - start) * 1e6 / n

    prepare = per_call(
        lambda: prepare_batch(
            conv,
            [messages[0]],
            estimator=store.estimator,
            max_message_bytes=store.max_message_bytes,
        ),
        calls,
    )
    loaded = await backend.load_tail(conv, with_events=False)
    assert loaded is not None
    pool = backend._pool  # type: ignore[attr-defined]
    rows = await pool.fetch(LOAD_TAIL, conv, None)
    fetch_start = time.process_time()
    for _ in range(20):
        await pool.fetch(LOAD_TAIL, conv, None)
    fetch = (time.process_time() - fetch_start) * 1e6 / 20
    decode = per_call(
        lambda: decode_tail(
            conv, rows, last_seq=loaded.last_seq, boundary_seq=None, with_events=False
        ),
        20,
    )
    boundary = loaded.boundary
    compose = per_call(
        lambda: compose_context(
            conv,
            boundary=boundary,
            tail=loaded.messages,
            last_seq=loaded.last_seq,
            estimator=store.estimator,
        ),
        20,
    )
    n = len(loaded.messages)
    return (
        "| phase | per call | per message |\n|---|---:|---:|\n"
        f"| prepare_batch, one message (validate, encode, estimate) | {prepare:,.1f} | |\n"
        f"| load: fetch {n:,} rows (asyncpg, client side) | {fetch:,.0f} | {fetch / n:,.2f} |\n"
        f"| load: decode rows into messages | {decode:,.0f} | {decode / n:,.2f} |\n"
        f"| load: compose the context | {compose:,.0f} | {compose / n:,.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("--url", default=os.environ.get("EPISODIC_BENCH_URL", db.DEFAULT_ADMIN_URL))
    p.add_argument("--calls", type=int, default=4_000, help="appends measured (default 4,000)")
    p.add_argument("--write", metavar="HEADING", help="write the result to bench/PROFILE.md")
    args = p.parse_args(argv)
    name = db.new_database_name()

    async def go() -> str:
        await db.create_database(args.url, name)
        try:
            return await run(db.database_url(args.url, name), args.calls)
        finally:
            await db.drop_database(args.url, name)

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    body = asyncio.run(go())
    facts = (
        f"- {started}, {os.cpu_count()} CPUs; episodic: {episodic_source()}\n"
        f"- command: `{command_line('bench.profile', argv)}`\n"
    )
    out = f"{facts}\n{body}"
    print(out)
    if args.write:
        text_now = PROFILE.read_text(encoding="utf-8") if PROFILE.exists() else "# Profile\n"
        PROFILE.write_text(f"{text_now.rstrip()}\n\n## {args.write}\n\n{out}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
