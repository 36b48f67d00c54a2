"""``python -m bench --http``: the HTTP API (``episodic serve``) beside the direct API, in one run.

One throwaway database, created and always dropped (also on Ctrl-C or SIGTERM): migrated, an
API key made for one tenant, a few conversations written through the library. Then the real
server, as a person runs it: ``episodic serve --port <free>`` in a subprocess (uvicorn, one
worker, the default settings) with ``EPISODIC_DATABASE_URL`` pointing at that database,
always stopped with SIGTERM. The bench process measures the same calls both ways, one at a
time: over HTTP with one keep-alive ``httpx.AsyncClient`` connection, and directly with
``EpisodicStore.open(url).for_tenant(...)`` on the same database (as the server scopes each
request to its key's tenant). Single-message appends and ``load_context`` (a 200-message
conversation in two formats, and one behind a boundary), in alternating rounds after a
warm-up; also ``GET /healthz`` (the HTTP and framework floor: no key, no database) and
``KeyStore.verify`` alone (the database read every ``/v1`` request makes for its key). The
server's access log gives each request's time inside the app. The results go to the
"## HTTP" section of bench/RESULTS.md, the only part of the file this rewrites.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from uuid import UUID

import asyncpg
import httpx

from bench import db
from bench.provenance import episodic_source, run_facts
from bench.report import with_section
from bench.run import log
from bench.stats import ratio, split
from bench.workload import TEXTS, History, text
from episodic import BoundaryRequest, EpisodicStore, Message
from episodic.server.keys import KeyStore
from episodic.settings import EpisodicSettings

TENANT = "bench"
#: messages in the conversations loaded (and in the tail behind the boundary)
HISTORY = 200
#: the calls alternate between the two sides in this many rounds
ROUNDS = 10
#: untimed calls per side and workload before the rounds
WARMUP = 50
#: --quick divides the call counts by this
QUICK = 10
SUMMARY = "Handoff: " + " ".join(text(i) for i in range(5))
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
REQUEST_ID = "X-Request-ID"
#: what KeyStore.verify selects, as one raw statement
KEY_ROW = "SELECT * FROM episodic_api_keys WHERE key_id = $1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP (--http; not run by default)")
    g.add_argument(
        "--http",
        action="store_true",
        help="run only the HTTP-vs-direct comparison and rewrite only the '## HTTP' section "
        "(--quick: a tenth of the calls)",
    )
    g.add_argument(
        "--http-appends",
        type=int,
        default=2_000,
        help="single-message appends per side (default: %(default)s)",
    )
    g.add_argument(
        "--http-loads",
        type=int,
        default=1_000,
        help="load_context calls per side and kind of load (default: %(default)s)",
    )
    g.add_argument(
        "--http-probes",
        type=int,
        default=2_000,
        help="GET /healthz round trips, and KeyStore.verify calls (default: %(default)s)",
    )


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.http:
        return
    if getattr(args, "citus", False):
        p.error("--http and --citus are separate runs: give one of them")
    if args.quick:
        args.http_appends = max(1, args.http_appends // QUICK)
        args.http_loads = max(1, args.http_loads // QUICK)
        args.http_probes = max(1, args.http_probes // QUICK)
    if min(args.http_appends, args.http_loads, args.http_probes) < ROUNDS:
        p.error(f"--http-appends, --http-loads and --http-probes must be at least {ROUNDS}")


# ---- the database and the server --------------------------------------------------------


@dataclass
class Setup:
    secret: str
    key_id: str
    #: the conversation each side appends to
    append_to: dict[str, UUID]
    #: HISTORY messages, no boundary
    plain: UUID
    #: HISTORY messages behind a boundary (which covers HISTORY more before them)
    bounded: UUID


def _settings() -> EpisodicSettings:
    """The library's defaults, as the server has them (no .env, no EPISODIC_* variables)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("EPISODIC_")}
    try:
        return EpisodicSettings(_env_file=None)
    finally:
        os.environ.update(saved)


async def prepare(url: str) -> Setup:
    """Migrate, make the tenant's key, write the conversations (through the library)."""
    store = await EpisodicStore.open(url, settings=_settings())
    keys = KeyStore.open(url)
    try:
        log("migrating")
        await store.migrate()
        key, secret = await keys.create(TENANT, label="bench --http")
        tenant = store.for_tenant(TENANT)
        append_to = {side: await tenant.create_conversation() for side in SIDES}
        history = History("http")
        plain = await tenant.create_conversation()
        await tenant.append(plain, history.take(HISTORY))
        bounded = await tenant.create_conversation()
        head = await tenant.append(bounded, history.take(HISTORY))
        await tenant.append(bounded, history.take(HISTORY))
        await tenant.write_boundary(
            bounded,
            BoundaryRequest(
                summary=SUMMARY,
                covers_through_seq=head[-1].seq,
                retained=[text(1), text(2)],
                reason="context_pressure",
                expected_boundary_seq=None,
            ),
        )
        return Setup(secret, key.key_id, append_to, plain, bounded)
    finally:
        await keys.close()
        await store.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _episodic_command() -> list[str]:
    """The ``episodic`` console script of this interpreter's environment (else on PATH, else
    its entry point run by this interpreter)."""
    beside = Path(sys.executable).with_name("episodic")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("episodic")
    if found:
        return [found]
    return [sys.executable, "-c", "from episodic.cli import main; main()"]


@dataclass
class Server:
    base: str
    command: str
    output: IO[str]
    #: its whole output, once it has stopped
    lines: list[str] = field(default_factory=list)

    def log_lines(self) -> list[str]:
        if self.output.closed:
            return self.lines
        self.output.flush()
        self.output.seek(0)
        return self.output.read().splitlines()


@contextmanager
def serving(url: str) -> Iterator[Server]:
    """``episodic serve --port <free>`` on ``url`` until the block ends, then SIGTERM (and
    SIGKILL if it has not exited in STOP_TIMEOUT_S), whatever happens; its output (the
    access log) kept in a temporary file."""
    port = _free_port()
    argv = [*_episodic_command(), "serve", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISODIC_")}
    env["EPISODIC_DATABASE_URL"] = url
    with (
        tempfile.TemporaryDirectory(prefix="episodic-bench-http-") as cwd,
        tempfile.TemporaryFile("w+", encoding="utf-8") as output,
    ):
        # Its own session: a Ctrl-C reaches the bench alone, which then stops the server.
        process = subprocess.Popen(
            argv,
            cwd=cwd,  # no .env of the caller's
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        server = Server(f"http://127.0.0.1:{port}", f"episodic serve --port {port}", output)
        try:
            log(f"started `{server.command}` (pid {process.pid})")
            _wait_ready(process, server)
            yield server
        finally:
            _stop(process, server)
            server.lines = server.log_lines()


def _wait_ready(process: subprocess.Popen[bytes], server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise ServerFailed(f"the server exited with {process.returncode}", server)
        try:
            if httpx.get(f"{server.base}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise ServerFailed(f"the server did not answer in {START_TIMEOUT_S:g} s", server)
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes], server: Server) -> None:
    """SIGTERM, wait, SIGKILL if need be; Ctrl-C and SIGTERM ignored meanwhile."""
    previous = (
        signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    try:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(
                    f"bench: the server did not stop in {STOP_TIMEOUT_S:g} s: SIGKILL",
                    file=sys.stderr,
                )
                process.kill()
                process.wait()
        log(f"stopped the server (exit status {process.returncode})")
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


class ServerFailed(Exception):
    def __init__(self, message: str, server: Server) -> None:
        tail = "\n".join(server.log_lines()[-30:])
        super().__init__(f"{message}; its last output:\n{tail}")


# ---- the measurements -------------------------------------------------------------------

SIDES = ("direct", "HTTP")
Call = Callable[[int], Awaitable[object]]


@dataclass
class Workload:
    key: str
    label: str
    calls: int
    #: side -> the call (one side only for the probes)
    sides: dict[str, Call]
    samples: dict[str, list[float]] = field(default_factory=dict)
    #: the app's own time per request from the server's access log, seconds
    server: list[float] = field(default_factory=list)
    #: the client's share of each HTTP call spent parsing the response's JSON, seconds
    parse: list[float] = field(default_factory=list)


def _json(response: httpx.Response, status: int, parse: list[float] | None = None) -> Any:
    if response.status_code != status:
        raise RuntimeError(
            f"{response.request.method} {response.request.url.path}: "
            f"{response.status_code} {response.text[:500]}"
        )
    t0 = time.perf_counter()
    body = response.json()
    if parse is not None:
        parse.append(time.perf_counter() - t0)
    return body


def workloads(
    args: argparse.Namespace,
    setup: Setup,
    store: EpisodicStore,
    keys: KeyStore,
    raw: asyncpg.Connection,
    client: httpx.AsyncClient,
) -> list[Workload]:
    messages = [Message.user(t) for t in TEXTS]
    bodies = [{"messages": [m.model_dump(mode="json", exclude_none=True)]} for m in messages]
    direct_to, http_to = setup.append_to["direct"], setup.append_to["HTTP"]
    plain, bounded = setup.plain, setup.bounded
    parse: dict[str, list[float]] = {
        k: [] for k in ("healthz", "append", "load", "openai", "bounded")
    }

    async def healthz(i: int) -> object:
        return _json(await client.get("/healthz"), 200, parse["healthz"])

    async def verify(i: int) -> object:
        return await keys.verify(setup.secret)

    async def select_key(i: int) -> object:
        return await raw.fetchrow(KEY_ROW, setup.key_id)

    async def append_direct(i: int) -> object:
        return await store.append(direct_to, [messages[i % len(messages)]])

    async def append_http(i: int) -> object:
        path = f"/v1/conversations/{http_to}/messages"
        return _json(await client.post(path, json=bodies[i % len(bodies)]), 201, parse["append"])

    def load_direct(conv: UUID, openai: bool) -> Call:
        async def call(i: int) -> object:
            context = await store.load_context(conv)
            return context.to_openai() if openai else context

        return call

    def load_http(conv: UUID, format: str, into: list[float]) -> Call:
        path = f"/v1/conversations/{conv}/context"
        params = {"format": format}

        async def call(i: int) -> object:
            return _json(await client.get(path, params=params), 200, into)

        return call

    loads = args.http_loads
    tail = f"behind a boundary: summary + 2 retained + {HISTORY} messages"
    return [
        Workload(
            "healthz",
            "GET /healthz (no key, no database: the HTTP + framework floor)",
            args.http_probes,
            {"HTTP": healthz},
            parse=parse["healthz"],
        ),
        Workload(
            "verify",
            "KeyStore.verify alone (the key's database read in every /v1 request)",
            args.http_probes,
            {"direct": verify},
        ),
        Workload(
            "select",
            "for scale: the key's row by raw asyncpg, one prepared SELECT (one round trip)",
            args.http_probes,
            {"direct": select_key},
        ),
        Workload(
            "append",
            "append 1 message: POST /v1/conversations/{id}/messages vs store.append",
            args.http_appends,
            {"direct": append_direct, "HTTP": append_http},
            parse=parse["append"],
        ),
        Workload(
            "load",
            f"load_context, {HISTORY} messages, format=episodic vs store.load_context",
            loads,
            {
                "direct": load_direct(plain, False),
                "HTTP": load_http(plain, "episodic", parse["load"]),
            },
            parse=parse["load"],
        ),
        Workload(
            "load-openai",
            f"load_context, {HISTORY} messages, format=openai vs load_context + to_openai()",
            loads,
            {
                "direct": load_direct(plain, True),
                "HTTP": load_http(plain, "openai", parse["openai"]),
            },
            parse=parse["openai"],
        ),
        Workload(
            "load-bounded",
            f"load_context {tail}, format=episodic",
            loads,
            {
                "direct": load_direct(bounded, False),
                "HTTP": load_http(bounded, "episodic", parse["bounded"]),
            },
            parse=parse["bounded"],
        ),
    ]


async def check_same(setup: Setup, store: EpisodicStore, client: httpx.AsyncClient) -> None:
    """Both sides load the same context (message count, last seq, boundary)."""
    for conv in (setup.plain, setup.bounded):
        context = await store.load_context(conv)
        body = _json(await client.get(f"/v1/conversations/{conv}/context"), 200)
        got = (len(body["messages"]), body["last_seq"], body["boundary_seq"])
        want = (len(context.messages), context.last_seq, context.boundary_seq)
        if got != want:
            raise RuntimeError(f"HTTP and direct load_context differ on {conv}: {got} != {want}")


async def _block(call: Call, first: int, count: int, into: list[float]) -> None:
    for i in range(first, first + count):
        t0 = time.perf_counter()
        await call(i)
        into.append(time.perf_counter() - t0)


async def measure(args: argparse.Namespace, url: str, base: str, setup: Setup) -> list[Workload]:
    store = await EpisodicStore.open(url, settings=_settings())
    keys = KeyStore.open(url)
    raw = await asyncpg.connect(url)
    client = httpx.AsyncClient(
        base_url=base,
        headers={"Authorization": f"Bearer {setup.secret}"},
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=60.0,
    )
    try:
        tenant = store.for_tenant(TENANT)
        await check_same(setup, tenant, client)
        works = workloads(args, setup, tenant, keys, raw, client)
        log(f"warming up: {WARMUP} calls per side and workload")
        client.headers[REQUEST_ID] = "bench-warmup"
        for work in works:
            for side, call in work.sides.items():
                await _block(call, 0, WARMUP, [])
                work.samples[side] = []
            work.parse.clear()
        log(
            "measuring: "
            + ", ".join(f"{w.key} {w.calls:,}" for w in works)
            + f" calls per side, in {ROUNDS} rounds"
        )
        done = {w.key: 0 for w in works}
        for r in range(ROUNDS):
            for work in works:
                count = split(work.calls, ROUNDS)[r]
                # Alternate which side goes first, so neither always follows the other.
                order = list(work.sides) if r % 2 == 0 else list(reversed(work.sides))
                for side in order:
                    client.headers[REQUEST_ID] = f"bench-{work.key}"
                    first = WARMUP + done[work.key]
                    await _block(work.sides[side], first, count, work.samples[side])
                done[work.key] += count
        return works
    finally:
        await client.aclose()
        await raw.close()
        await keys.close()
        await store.close()


def read_access_log(lines: list[str], works: list[Workload]) -> None:
    """Each measured request's time inside the app (the access log's ``ms``, to 10 µs), by
    its request id; nothing when the log says none."""
    by_id = {f"bench-{w.key}": w for w in works}
    for line in lines:
        start = line.find("{")
        if start < 0 or "episodic.access" not in line[:start]:
            continue
        try:
            record = json.loads(line[start:])
            work = by_id.get(record.get("request_id"))
            if work is not None:
                work.server.append(float(record["ms"]) / 1000)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue


def http_stack() -> str:
    """The versions serving and calling, and what uvicorn's "auto" picks here: httptools
    and uvloop when they are installed, else h11 and asyncio's loop (the server runs from
    this interpreter's environment)."""
    import fastapi
    import starlette
    import uvicorn

    def have(module: str) -> bool:
        return importlib.util.find_spec(module) is not None

    parser = "httptools" if have("httptools") else "h11 (httptools not installed)"
    loop = "uvloop" if have("uvloop") else "asyncio's loop (uvloop not installed)"
    return (
        f"uvicorn {uvicorn.__version__} with {parser} and {loop}, FastAPI "
        f"{fastapi.__version__}, Starlette {starlette.__version__}; client httpx "
        f"{httpx.__version__}"
    )


# ---- the run ----------------------------------------------------------------------------


@dataclass
class Result:
    works: list[Workload]
    server: str
    postgres: str
    log_lines: int
    stack: str


def main(args: argparse.Namespace, command: str) -> int:
    """The whole ``--http`` run: the database created, the server started, both sides
    measured, the server stopped and the database dropped whatever happens; the section
    written to ``args.output``. The exit status."""
    name = db.new_database_name()
    started = time.perf_counter()
    try:
        try:
            asyncio.run(db.create_database(args.url, name))
            print(f"bench: database {name}", file=sys.stderr)
            url = db.database_url(args.url, name)
            setup = asyncio.run(prepare(url))
            with serving(url) as server:
                works = asyncio.run(measure(args, url, server.base, setup))
                postgres = asyncio.run(db.server_version(url))
            lines = server.log_lines()
            read_access_log(lines, works)
            result = Result(works, server.command, postgres, len(lines), http_stack())
        finally:
            dropped = _drop(args.url, name)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except ServerFailed as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    if not dropped:
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
    output.write_text(with_section(previous, "HTTP", section(result, meta)))
    print(f"\nwritten to {output}", file=sys.stderr)
    return 0


def _drop(admin_url: str, name: str) -> bool:
    """Drop the database, ignoring Ctrl-C / SIGTERM meanwhile; whether it was."""
    previous = (
        signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    try:
        asyncio.run(db.drop_database(admin_url, name))
        print(f"bench: dropped {name}", file=sys.stderr)
        return True
    except Exception as exc:  # report, and say what to clean up by hand
        print(f"bench: could not drop {name}: {exc!r}", file=sys.stderr)
        return False
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


# ---- the report -------------------------------------------------------------------------


def _median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else math.nan


def _p95(samples: list[float]) -> float:
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _per_second(samples: list[float]) -> float:
    return len(samples) / sum(samples) if samples else math.nan


def _us(seconds: float) -> str:
    return "" if math.isnan(seconds) else f"{seconds * 1e6:,.0f}"


def _n(value: float, digits: int = 0) -> str:
    return "" if math.isnan(value) else f"{value:,.{digits}f}"


def _by_key(result: Result) -> dict[str, Workload]:
    return {w.key: w for w in result.works}


def table(result: Result) -> str:
    lines = [
        "| call | direct median µs | direct p95 µs | direct calls/s | HTTP median µs "
        "| HTTP p95 µs | HTTP calls/s | overhead per call, µs (HTTP − direct, medians) "
        "| HTTP / direct (medians) | in the app, median µs (access log) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in result.works:
        d, h = w.samples.get("direct", []), w.samples.get("HTTP", [])
        dm, hm = _median(d), _median(h)
        overhead = hm - dm if d and h else math.nan
        lines.append(
            f"| {w.label} | {_us(dm)} | {_us(_p95(d))} | {_n(_per_second(d))} "
            f"| {_us(hm)} | {_us(_p95(h))} | {_n(_per_second(h))} | {_us(overhead)} "
            f"| {_n(ratio(hm, dm) if d and h else math.nan, 2)} | {_us(_median(w.server))} |"
        )
    return "\n".join(lines)


def breakdown(result: Result) -> list[str]:
    """Where a /v1 call's overhead goes, from the medians: inside the app beyond the direct
    call (the key's database read among it) and outside it (uvicorn, the loopback
    connection, httpx; the client's JSON parse among it). Then the floor and the key's
    read against one raw round trip."""
    works = _by_key(result)
    floor = _median(works["healthz"].samples.get("HTTP", []))
    floor_app = _median(works["healthz"].server)
    verify = _median(works["verify"].samples.get("direct", []))
    select = _median(works["select"].samples.get("direct", []))
    out = [
        "| call | overhead µs | in the app beyond the direct call, µs | of which "
        "KeyStore.verify (its median alone) | outside the app (uvicorn, loopback, httpx), µs "
        "| of which the client's JSON parse |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for w in result.works:
        if set(w.sides) != set(SIDES):
            continue
        direct, http = _median(w.samples["direct"]), _median(w.samples["HTTP"])
        overhead, app, parse = http - direct, _median(w.server), _median(w.parse)
        inside = app - direct
        out.append(
            f"| {w.key} | {_us(overhead)} | {_us(inside)} "
            f"| {_us(verify)} ({_n(100 * ratio(verify, inside))}%) | {_us(http - app)} "
            f"| {_us(parse)} ({_n(100 * ratio(parse, http - app))}%) |"
        )
    out += [
        "",
        textwrap.fill(
            f"`GET /healthz` takes {_us(floor)} µs a round trip, {_us(floor_app)} µs of it in the "
            "app (its one HTTP middleware, which observes the request for the metrics and the "
            "access log line, and the route): the rest is uvicorn, the loopback connection and "
            "httpx, which "
            f"every call pays. `KeyStore.verify` takes {_us(verify)} µs a call: it checks a "
            "SQLAlchemy connection out of its own pool and runs BEGIN (implicit), the SELECT "
            f"and ROLLBACK; the same row by raw asyncpg, one prepared SELECT, takes {_us(select)} "
            "µs.",
            92,
            break_on_hyphens=False,
        ),
    ]
    return out


def section(result: Result, meta: dict[str, str]) -> str:
    works = _by_key(result)
    counts = (
        f"{works['append'].calls:,} appends, {works['load'].calls:,} loads of each kind and "
        f"{works['healthz'].calls:,} of each probe"
    )
    notes = (
        f"The server is `{result.server}` (the console script, uvicorn, one worker, the "
        "library's default settings: a pool of 10 connections; the access log on, one JSON "
        "line per request to its stderr, as `episodic serve` logs) on a throwaway database, "
        "started after the data was written through the library: the appends go to one "
        f"empty conversation per side, the loads read a {HISTORY}-message conversation (~400-"
        "character texts, a tool call/result pair every fifth turn) and one with "
        f"{2 * HISTORY} messages and a boundary covering the first {HISTORY} (it loads the "
        f"summary, 2 retained user messages and {HISTORY} messages). The client is one "
        "`httpx.AsyncClient` with one keep-alive connection, calling back to back with the "
        "key in `Authorization: Bearer`, sending the append's JSON body and parsing every "
        "response's JSON: the HTTP side includes httpx's own cost. The direct side is "
        "`EpisodicStore.open(url).for_tenant(tenant)` in the bench process (the same scoping "
        "the server gives each request), with the same messages; its openai load includes "
        f"`to_openai()`. After {WARMUP} untimed calls per side and workload, the calls "
        f"({counts} per side) alternate between the "
        f"sides in {ROUNDS} rounds, which side goes first alternating. *calls/s* is 1 / the "
        "mean latency; p95 is the 95th percentile. *in the app* is the server's access log's "
        "`ms` for the measured requests (to 10 µs): from its outermost HTTP middleware in, so "
        "without uvicorn's parsing and the connection; the client's time minus it is uvicorn, "
        "the loopback connection and httpx."
    )
    if not works["healthz"].server:
        notes += " (The access log gave no times in this run: that column is empty.)"
    return "\n".join(
        [
            "## HTTP",
            "",
            "The HTTP API (`episodic serve`) beside the direct API on the same database, in one",
            "run (`bench/http.py`, run by `python -m bench --http`, not in CI): the overhead",
            "HTTP adds to each call.",
            "",
            "**Machine note:** the server, the benchmark client and PostgreSQL share the same",
            "2 cores, and the HTTP side includes the client's own httpx cost (see the",
            "`GET /healthz` row for the HTTP + framework floor); the sides alternate in rounds,",
            "so noise hits both, but read the overheads and ratios rather than absolute times.",
            "",
            *run_facts(meta),
            f"- server: `{result.server}`, one worker: {result.stack}; {result.log_lines:,} "
            "lines of log",
            "",
            table(result),
            "",
            "Where the overhead per call goes (medians; *in the app* from the server's access",
            "log):",
            "",
            *breakdown(result),
            "",
            textwrap.fill(notes, 92, break_on_hyphens=False),
            "",
        ]
    )


__all__ = ["add_arguments", "check_arguments", "main"]
