"""``python -m bench.peers.adk_sessions``: ``get_session`` and ``append_event`` of episodic's
``EpisodicSessionService`` and Google ADK's ``DatabaseSessionService``, on one PostgreSQL, in
one run.

For each history length, each service gets its own session, grown one ``append_event`` at a
time (ADK has no batch append) with the events of ``bench.peers.sequence`` (user and model
turns, every fifth turn a function call and its response). episodic's session then gets a
boundary through the last safe cut (a worker's, as ``store.write_boundary`` writes it) and a
tail of ``--tail`` more events; ADK's session the same tail, without a boundary (its
``DatabaseSessionService`` has none: its compaction is an event, and ``get_session`` still
reads every event). Each database is then vacuumed, analyzed and checkpointed, and
``get_session`` timed ``--loads`` times per length, rotating over the lengths, the median
reported; ``append_event`` is the median of the growth's last 200
calls. Each service runs on its own throwaway database, dropped at the end. Results are
printed and written to ``bench/PEERS_ADK.md``. Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import db
from bench.peers.stores import BOUNDARY_SUMMARY, POOL
from bench.peers.stores import adk_event as peer_event
from bench.provenance import command_line, episodic_source, terminate

HERE = Path(__file__).resolve().parent.parent
OUTPUT = HERE / "PEERS_ADK.md"
APP, USER = "bench", "bench-user"
_T0 = time.perf_counter()


def log(what: str) -> None:
    print(f"adk: [{time.perf_counter() - _T0:6.1f} s] {what}", file=sys.stderr, flush=True)


def adk_event(i: int) -> Any:
    """Message ``i`` of the peers' sequence as an ADK event, stamped by its index."""
    return peer_event(i, timestamp=1_700_000_000.0 + i)


@dataclass
class Point:
    size: int
    events_returned: int = 0
    loads: list[float] = field(default_factory=list)
    appends: list[float] = field(default_factory=list)

    @property
    def load_ms(self) -> float:
        return statistics.median(self.loads) * 1000

    @property
    def append_ms(self) -> float:
        return statistics.median(self.appends[-200:]) * 1000


@dataclass
class Result:
    key: str
    label: str
    points: list[Point] = field(default_factory=list)
    seconds: float = 0.0


async def _grow(service: Any, session: Any, start: int, n: int, point: Point) -> None:
    for i in range(start, start + n):
        began = time.perf_counter()
        await service.append_event(session, adk_event(i))
        point.appends.append(time.perf_counter() - began)


async def _episodic(url: str, args: argparse.Namespace, result: Result) -> None:
    from episodic import BoundaryRequest, EpisodicStore
    from episodic.integrations.adk import EpisodicSessionService, session_conversation_id
    from episodic.settings import EpisodicSettings

    store = await EpisodicStore.open(url, settings=EpisodicSettings(_env_file=None))
    await store.migrate()
    service = EpisodicSessionService(store)
    try:
        sessions = []
        for size in args.size_list:
            point = Point(size)
            session = await service.create_session(app_name=APP, user_id=USER)
            await _grow(service, session, 0, size, point)
            cid = session_conversation_id(APP, USER, session.id)
            head = await store.get_conversation(cid)
            events = await store.read_events(cid, after_seq=max(0, head.last_seq - 100), limit=100)
            last = max(e.seq for e in events if _safe_after(e))
            await store.write_boundary(
                cid,
                BoundaryRequest(
                    summary=BOUNDARY_SUMMARY,
                    covers_through_seq=last,
                    reason="context_pressure",
                    expected_boundary_seq=None,
                ),
            )
            await _grow(service, session, size, args.tail, point)
            sessions.append((point, session.id))
            log(f"episodic: {size:,} events + boundary + {args.tail} tail")

        await _timed_loads(url, sessions, _loader(service), args)
        result.points = [p for p, _ in sessions]
    finally:
        await store.close()


def _safe_after(event: Any) -> bool:
    """A cut after this event separates no call from its response (in this sequence a
    response always follows its call at once)."""
    from episodic import MessageEvent

    return isinstance(event, MessageEvent) and not event.message.tool_calls


async def _adk(url: str, args: argparse.Namespace, result: Result) -> None:
    from google.adk.sessions import DatabaseSessionService

    service = DatabaseSessionService(
        db_url=url.replace("postgresql://", "postgresql+asyncpg://", 1), pool_size=POOL
    )
    try:
        sessions = []
        for size in args.size_list:
            point = Point(size)
            session = await service.create_session(app_name=APP, user_id=USER)
            began = time.perf_counter()
            await _grow(service, session, 0, size + args.tail, point)
            sessions.append((point, session.id))
            log(f"adk: {size + args.tail:,} events in {time.perf_counter() - began:.1f} s")

        await _timed_loads(url, sessions, _loader(service), args)
        result.points = [p for p, _ in sessions]
    finally:
        await service.close()


def _loader(service: Any) -> Callable[[str], Awaitable[int]]:
    """``get_session`` of a session by id, through either service: how many events came."""

    async def load(sid: str) -> int:
        got = await service.get_session(app_name=APP, user_id=USER, session_id=sid)
        assert got is not None
        return len(got.events)

    return load


async def _settle(url: str) -> None:
    """The same quiet start for both services' loads: the growth's dead rows vacuumed, its
    statistics taken and its dirty pages written, not left to autovacuum and the
    checkpointer during the timed calls."""
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        await connection.execute("VACUUM (ANALYZE)")
        await connection.execute("CHECKPOINT")
    finally:
        await connection.close()


async def _timed_loads(
    url: str,
    sessions: list[tuple[Point, str]],
    load: Callable[[str], Awaitable[int]],
    args: argparse.Namespace,
) -> None:
    await _settle(url)
    for point, sid in sessions:
        point.events_returned = await load(sid)  # warm
    for _ in range(args.loads):
        for point, sid in sessions:
            began = time.perf_counter()
            await load(sid)
            point.loads.append(time.perf_counter() - began)


def run(key: str, label: str, body_: Any, args: argparse.Namespace) -> Result:
    result = Result(key, label)
    name = f"bench_adk_{secrets.token_hex(4)}"
    started = time.perf_counter()
    asyncio.run(db.create_database(args.url, name))
    try:
        asyncio.run(body_(db.database_url(args.url, name), args, result))
    finally:
        asyncio.run(db.drop_database(args.url, name))
        result.seconds = time.perf_counter() - started
    return result


def report(ours: Result, theirs: Result, args: argparse.Namespace, command: str) -> str:
    machine = db.machine()
    postgres = asyncio.run(db.server_version(args.url))
    packages = ", ".join(
        f"{d} {metadata.version(d)}" for d in ("google-adk", "asyncpg", "SQLAlchemy")
    )
    rows = []
    for mine, peer in zip(ours.points, theirs.points, strict=True):
        rows.append(
            f"| {mine.size:,} | {mine.events_returned:,} | {mine.load_ms:.2f} | "
            f"{mine.load_ms / ours.points[0].load_ms:.2f} | {peer.events_returned:,} | "
            f"{peer.load_ms:.2f} | {peer.load_ms / theirs.points[0].load_ms:.2f} | "
            f"{peer.load_ms / mine.load_ms:.1f}x | {mine.append_ms:.2f} | {peer.append_ms:.2f} |"
        )
    first, last = ours.points[0], ours.points[-1]
    peer_first, peer_last = theirs.points[0], theirs.points[-1]
    columns = [
        "events before the boundary",
        "episodic: events returned",
        "episodic `get_session` median (ms)",
        f"vs @{first.size:,}",
        "ADK: events returned",
        "ADK `get_session` median (ms)",
        f"vs @{peer_first.size:,}",
        "episodic faster by",
        "episodic `append_event` median (ms)",
        "ADK `append_event` median (ms)",
    ]
    header = "| " + " | ".join(columns) + " |\n|" + "---:|" * len(columns)
    python = platform.python_version()
    return f"""# Google ADK sessions: EpisodicSessionService and ADK's DatabaseSessionService

Measured by `python -m bench.peers.adk_sessions` in one process and one run, on one PostgreSQL
server, each service on its own throwaway database. The machine is shared and noisy: read the
ratios, not the absolute times.

- date: {machine["date"]}
- machine: {machine["nproc"]} CPUs (nproc), {machine["memory"]} memory, Python {python}
- PostgreSQL: {postgres}
- episodic: {episodic_source()} (when the run started)
- packages: {packages}
- command: `{command}`
- runtime: episodic {ours.seconds:.0f} s, ADK {theirs.seconds:.0f} s

{header}
{chr(10).join(rows)}

`get_session` at {last.size:,} over {first.size:,} events: episodic
**{last.load_ms / first.load_ms:.2f}** ({last.load_ms:.2f} vs {first.load_ms:.2f} ms; 1.00 =
flat), ADK's DatabaseSessionService **{peer_last.load_ms / peer_first.load_ms:.2f}**
({peer_last.load_ms:.2f} vs {peer_first.load_ms:.2f} ms).

Each length is its own session, grown by `append_event` one event at a time with the peers'
sequence of ~400-character messages (every fifth turn a function call and its response), then
{args.tail} more events. episodic's has a boundary before those {args.tail} (a ~2,000-character
summary through the last safe cut, as the compaction worker writes it), so its `get_session`
returns ADK's compaction event carrying the handoff and the {args.tail}-event tail; ADK's
returns every event. After the growth, each database is vacuumed, analyzed and checkpointed;
then `get_session` is timed {args.loads} times per length after one warm call, rotating over
the lengths; `append_event` is the median of the growth's last 200 calls (the
largest session's, for the longest row). *vs @* is a latency ratio (above 1 is slower);
*episodic faster by* is ADK's latency over episodic's.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers.adk_sessions", description=__doc__)
    p.add_argument("--url", default=os.environ.get("EPISODIC_BENCH_URL", db.DEFAULT_ADMIN_URL))
    p.add_argument("--sizes", default="100,1000,10000", help="events before the boundary")
    p.add_argument("--tail", type=int, default=20, help="events after it (%(default)s)")
    p.add_argument("--loads", type=int, default=30, help="timed loads per length (%(default)s)")
    p.add_argument("--output", type=Path, default=OUTPUT)
    args = p.parse_args(argv)
    args.size_list = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    return args


def main(argv: list[str] | None = None) -> int:
    import signal

    args = parse_args(argv)
    signal.signal(signal.SIGTERM, terminate)
    command = command_line("bench.peers.adk_sessions", argv)
    ours = run("episodic", "EpisodicSessionService", _episodic, args)
    theirs = run("adk", "DatabaseSessionService", _adk, args)
    text = report(ours, theirs, args, command)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
