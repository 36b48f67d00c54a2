"""``python -m bench --http``: the HTTP API (``episodic serve``) beside the direct API and
beside a minimal server on the same stack, in one run; then the two servers under load.

One throwaway database, created and always dropped (also on Ctrl-C or SIGTERM): migrated, an
API key made for one tenant, a few conversations written through the library, and the same
200 messages written to the minimal server's one table. Then the real server, as a person
runs it: ``episodic serve --port <free>`` in a subprocess (uvicorn, one worker, the default
settings) with ``EPISODIC_DATABASE_URL`` pointing at that database, and beside it the limit
to measure against: ``python -m bench.minimal_server`` (``bench/minimal_server.py``: Starlette
on the same uvicorn, loop and parser, one raw asyncpg INSERT per append, one SELECT of 200
rows per load), both always stopped with SIGTERM (``bench/http_servers.py``).

First one call at a time (this module): the same calls over HTTP with one keep-alive
``httpx.AsyncClient`` connection, directly with ``EpisodicStore.open(url).for_tenant(...)``
on the same database (as the server scopes each request to its key's tenant), and to the
minimal server. Single-message appends and ``load_context`` (a 200-message conversation in
two formats, and one behind a boundary), in rotating rounds after a warm-up; also ``GET
/healthz`` (the HTTP and framework floor: no key, no database) and ``KeyStore.verify``
alone (the database read every ``/v1`` request makes for its key). The server's access log
gives each request's time inside the app.

Then under load (``bench/http_load.py``): wrk appends and loads from 8, 32 and 128
connections against both servers at one and two processes, and after every append run the
log is checked for lost and doubled appends. The results go to the "## HTTP" section of
bench/RESULTS.md (or ``--output``), the only part of the file this rewrites.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import signal
import statistics
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx
import orjson

from bench import db, http_load, minimal_server
from bench.http_load_report import findings, load_section, load_table, ratio_table
from bench.http_servers import ServerFailed, serving, serving_minimal
from bench.provenance import episodic_source, run_facts
from bench.report import with_section
from bench.run import log
from bench.stats import ratio, split
from bench.workload import TEXTS, History, text
from episodic import BoundaryRequest, Context, EpisodicStore, Message
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
REQUEST_ID = "X-Request-ID"
#: what KeyStore.verify selects, as one raw statement
KEY_ROW = "SELECT * FROM episodic_api_keys WHERE key_id = $1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP (--http; not run by default)")
    g.add_argument(
        "--http",
        action="store_true",
        help="run only the HTTP benchmark (sequential, then under load with wrk) and rewrite "
        "only the '## HTTP' section (--quick: a tenth of the calls, 2 s load runs)",
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
    http_load.add_arguments(g)


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
    http_load.check_arguments(p, args)


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
    #: the minimal server's copy of ``plain``'s messages
    minimal_plain: UUID


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
        append_to = {side: await tenant.create_conversation() for side in ("direct", "HTTP")}
        append_to["minimal"] = uuid4()
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
        minimal_plain = await copy_to_minimal(url, await tenant.load_context(plain))
        return Setup(secret, key.key_id, append_to, plain, bounded, minimal_plain)
    finally:
        await keys.close()
        await store.close()


async def copy_to_minimal(url: str, context: Context) -> UUID:
    """The minimal server's table, and a conversation in it holding ``context``'s messages as
    the JSON an append sends."""
    conversation = uuid4()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(minimal_server.CREATE)
        for message in context.messages:
            payload = orjson.dumps(message.model_dump(mode="json", exclude_none=True)).decode()
            await conn.fetchval(minimal_server.INSERT, conversation, payload, None)
    finally:
        await conn.close()
    return conversation


# ---- the measurements -------------------------------------------------------------------

#: the library in the bench process, episodic over HTTP, the minimal server over HTTP
SIDES = ("direct", "HTTP", "minimal")
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
    minimal: httpx.AsyncClient,
) -> list[Workload]:
    messages = [Message.user(t) for t in TEXTS]
    bodies = [{"messages": [m.model_dump(mode="json", exclude_none=True)]} for m in messages]
    direct_to, http_to = setup.append_to["direct"], setup.append_to["HTTP"]
    minimal_to = setup.append_to["minimal"]
    plain, bounded = setup.plain, setup.bounded
    parse: dict[str, list[float]] = {
        k: [] for k in ("healthz", "append", "load", "openai", "bounded")
    }

    async def healthz(i: int) -> object:
        return _json(await client.get("/healthz"), 200, parse["healthz"])

    async def healthz_minimal(i: int) -> object:
        return _json(await minimal.get("/healthz"), 200)

    async def verify(i: int) -> object:
        return await keys.verify(setup.secret)

    async def select_key(i: int) -> object:
        return await raw.fetchrow(KEY_ROW, setup.key_id)

    async def append_direct(i: int) -> object:
        return await store.append(direct_to, [messages[i % len(messages)]])

    async def append_http(i: int) -> object:
        path = f"/v1/conversations/{http_to}/messages"
        return _json(await client.post(path, json=bodies[i % len(bodies)]), 201, parse["append"])

    async def append_minimal(i: int) -> object:
        path = f"/v1/conversations/{minimal_to}/messages"
        return _json(await minimal.post(path, json=bodies[i % len(bodies)]), 201)

    async def load_minimal(i: int) -> object:
        return _json(await minimal.get(f"/v1/conversations/{setup.minimal_plain}/context"), 200)

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
            {"HTTP": healthz, "minimal": healthz_minimal},
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
            {"direct": append_direct, "HTTP": append_http, "minimal": append_minimal},
            parse=parse["append"],
        ),
        Workload(
            "load",
            f"load_context, {HISTORY} messages, format=episodic vs store.load_context",
            loads,
            {
                "direct": load_direct(plain, False),
                "HTTP": load_http(plain, "episodic", parse["load"]),
                "minimal": load_minimal,
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


async def check_same(
    setup: Setup, store: EpisodicStore, client: httpx.AsyncClient, minimal: httpx.AsyncClient
) -> None:
    """The sides load the same context (message count, last seq, boundary; the minimal
    server the same messages)."""
    for conv in (setup.plain, setup.bounded):
        context = await store.load_context(conv)
        body = _json(await client.get(f"/v1/conversations/{conv}/context"), 200)
        got = (len(body["messages"]), body["last_seq"], body["boundary_seq"])
        want = (len(context.messages), context.last_seq, context.boundary_seq)
        if got != want:
            raise RuntimeError(f"HTTP and direct load_context differ on {conv}: {got} != {want}")
    plain = await store.load_context(setup.plain)
    listed = _json(await minimal.get(f"/v1/conversations/{setup.minimal_plain}/context"), 200)
    if listed != [m.model_dump(mode="json", exclude_none=True) for m in plain.messages]:
        raise RuntimeError("the minimal server's 200 messages are not episodic's")


async def _block(call: Call, first: int, count: int, into: list[float]) -> None:
    for i in range(first, first + count):
        t0 = time.perf_counter()
        await call(i)
        into.append(time.perf_counter() - t0)


def _client(base: str, secret: str) -> httpx.AsyncClient:
    """One keep-alive connection, the key in every request."""
    return httpx.AsyncClient(
        base_url=base,
        headers={"Authorization": f"Bearer {secret}"},
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=60.0,
    )


async def measure(
    args: argparse.Namespace, url: str, base: str, minimal_base: str, setup: Setup
) -> list[Workload]:
    store = await EpisodicStore.open(url, settings=_settings())
    keys = KeyStore.open(url)
    raw = await asyncpg.connect(url)
    client = _client(base, setup.secret)
    minimal = _client(minimal_base, setup.secret)
    try:
        tenant = store.for_tenant(TENANT)
        await check_same(setup, tenant, client, minimal)
        works = workloads(args, setup, tenant, keys, raw, client, minimal)
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
                # Rotate which side goes first, so none always follows another.
                sides = list(work.sides)
                order = sides[r % len(sides) :] + sides[: r % len(sides)]
                for side in order:
                    client.headers[REQUEST_ID] = f"bench-{work.key}"
                    first = WARMUP + done[work.key]
                    await _block(work.sides[side], first, count, work.samples[side])
                done[work.key] += count
        return works
    finally:
        await minimal.aclose()
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
    minimal: str
    load: http_load.LoadResult


def main(args: argparse.Namespace, command: str) -> int:
    """The whole ``--http`` run: the database created, the servers started, the sides
    measured one call at a time, then under load, the servers stopped and the database
    dropped whatever happens; the section written to ``args.output``. The exit status (1
    when a load run lost or doubled an append)."""
    skip_load = args.http_skip_load
    if not skip_load and http_load.find_wrk() is None:
        if not args.http_skip_load_if_no_wrk:
            print(
                "bench: the load runs need wrk, which is not on PATH (Debian: apt-get install "
                "-y wrk); --http-skip-load-if-no-wrk runs the rest without them, "
                "--http-skip-load never runs them",
                file=sys.stderr,
            )
            return 2
        print("bench: wrk is not on PATH: the load runs are skipped", file=sys.stderr)
    name = db.new_database_name()
    started = time.perf_counter()
    try:
        try:
            asyncio.run(db.create_database(args.url, name))
            print(f"bench: database {name}", file=sys.stderr)
            url = db.database_url(args.url, name)
            setup = asyncio.run(prepare(url))
            with serving(url) as server, serving_minimal(url, setup.secret) as minimal:
                works = asyncio.run(measure(args, url, server.base, minimal.base, setup))
                postgres = asyncio.run(db.server_version(url))
            lines = server.log_lines()
            read_access_log(lines, works)
            if skip_load:
                load = http_load.LoadResult(skipped=["--http-skip-load was given"])
            else:
                load = http_load.measure_load(
                    args, url, setup.secret, setup.plain, setup.minimal_plain
                )
            result = Result(
                works, server.command, postgres, len(lines), http_stack(), minimal.command, load
            )
        finally:
            dropped = _drop(args.url, name)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except (ServerFailed, http_load.LoadUnavailable) as exc:
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
    if result.load.runs:
        print("\n" + ratio_table(result.load) + "\n\n" + load_table(result.load))
        print("\n".join(["", *findings(result.load)]))
    output: Path = args.output
    previous = output.read_text() if output.exists() else ""
    output.write_text(with_section(previous, "HTTP", section(result, meta)))
    print(f"\nwritten to {output}", file=sys.stderr)
    broken = [r for r in result.load.runs if r.lost or r.doubled]
    if broken:
        print(f"bench: {len(broken)} load run(s) lost or doubled appends", file=sys.stderr)
        return 1
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
        "| HTTP p95 µs | HTTP calls/s | minimal median µs | minimal p95 µs | minimal calls/s "
        "| episodic / minimal (throughput) | overhead per call, µs (HTTP − direct, medians) "
        "| HTTP / direct (medians) | in the app, median µs (access log) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in result.works:
        d, h = w.samples.get("direct", []), w.samples.get("HTTP", [])
        m = w.samples.get("minimal", [])
        dm, hm, mm = _median(d), _median(h), _median(m)
        overhead = hm - dm if d and h else math.nan
        versus = ratio(_per_second(h), _per_second(m)) if h and m else math.nan
        lines.append(
            f"| {w.label} | {_us(dm)} | {_us(_p95(d))} | {_n(_per_second(d))} "
            f"| {_us(hm)} | {_us(_p95(h))} | {_n(_per_second(h))} "
            f"| {_us(mm)} | {_us(_p95(m))} | {_n(_per_second(m))} | {_n(versus, 2)} "
            f"| {_us(overhead)} | {_n(ratio(hm, dm) if d and h else math.nan, 2)} "
            f"| {_us(_median(w.server))} |"
        )
    return "\n".join(lines)


def breakdown(result: Result) -> list[str]:
    """Where a /v1 call's overhead goes, from the medians: inside the app beyond the direct
    call (the key's database read among it) and outside it (uvicorn, the loopback
    connection, httpx; the client's JSON parse among it). Then the floor and the key's
    read against one raw round trip."""
    works = _by_key(result)
    floor = _median(works["healthz"].samples.get("HTTP", []))
    verify = _median(works["verify"].samples.get("direct", []))
    select = _median(works["select"].samples.get("direct", []))
    out = [
        "| call | overhead µs | in the app beyond the direct call, µs | of which "
        "KeyStore.verify (its median alone) | outside the app (uvicorn, loopback, httpx), µs "
        "| of which the client's JSON parse |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for w in result.works:
        if not {"direct", "HTTP"} <= set(w.sides):
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
            f"`GET /healthz` takes {_us(floor)} µs a round trip: it is answered ahead of the "
            "app's middlewares (neither logged nor counted), so it is the floor of uvicorn, "
            "the loopback connection and httpx, which every call pays. `KeyStore.verify` takes "
            f"{_us(verify)} µs a call: one prepared SELECT on the key store's own asyncpg "
            "connections, checked out of their pool; the same row by raw asyncpg on a "
            f"connection held throughout takes {_us(select)} µs.",
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
        "response's JSON: the HTTP side includes httpx's own cost. The minimal side is "
        f"`{result.minimal}` (`bench/minimal_server.py`, started beside the server and "
        "called the same way, with its own client): Starlette on the same uvicorn, loop and "
        "parser, a raw asyncpg pool of at most 10 connections, no key read (the bearer token "
        "compared in memory), no access log; an append is one INSERT of the message's JSON "
        "with the next per-conversation seq computed in the statement, a load one SELECT of "
        f"the last {HISTORY} rows of a copy of the {HISTORY}-message conversation, answered "
        "as a JSON list of those messages (checked equal to episodic's) without decoding "
        "them. *episodic / minimal (throughput)* is episodic's HTTP calls/s over the minimal "
        "server's: the share of the limit on this stack that episodic reaches (1 is the "
        "limit). The direct side is "
        "`EpisodicStore.open(url).for_tenant(tenant)` in the bench process (the same scoping "
        "the server gives each request), with the same messages; its openai load includes "
        f"`to_openai()`. After {WARMUP} untimed calls per side and workload, the calls "
        f"({counts} per side) rotate between the "
        f"sides in {ROUNDS} rounds, which side goes first rotating. *calls/s* is 1 / the "
        "mean latency; p95 is the 95th percentile. *in the app* is the server's access log's "
        "`ms` for the measured requests (to 10 µs): from its outermost HTTP middleware in, so "
        "without uvicorn's parsing and the connection; the client's time minus it is uvicorn, "
        "the loopback connection and httpx."
    )
    if not any(w.server for w in result.works):
        notes += " (The access log gave no times in this run: that column is empty.)"
    return "\n".join(
        [
            "## HTTP",
            "",
            "The HTTP API (`episodic serve`) beside the direct API and beside a minimal server",
            "on the same stack (the limit), on the same database, in one run (`bench/http.py`,",
            "run by `python -m bench --http`, not in CI): the overhead HTTP adds to each call,",
            "how close episodic comes to the minimal server one call at a time, and both",
            "servers under load from wrk, with the log checked for lost and doubled appends.",
            "",
            "**Machine note:** the servers, the benchmark client (or wrk) and PostgreSQL share",
            "the same 2 cores, and the HTTP sides include the client's own httpx cost (see the",
            "`GET /healthz` row for the HTTP + framework floor); the sides rotate in rounds and",
            "the servers' load runs of a cell follow each other, so noise hits all of them, but",
            "read the overheads and ratios rather than absolute times.",
            "",
            *run_facts(meta),
            f"- server: `{result.server}`, one worker: {result.stack}; {result.log_lines:,} "
            "lines of log",
            f"- minimal server: `{result.minimal}`, the same uvicorn, loop and parser",
            "",
            "### One call at a time",
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
            *load_section(result.load),
        ]
    )


__all__ = ["add_arguments", "check_arguments", "main"]
