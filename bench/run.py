"""One run of every workload, in order, against one migrated database."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from uuid import uuid4

import asyncpg
import orjson

from bench import db, history, ours, placement, raw
from bench.report import Report, Row, Summary
from bench.stats import Latency, Throughput, ratio, split
from bench.workload import History
from episodic import EpisodicStore
from episodic.settings import EpisodicSettings

TASKS = 8
CONVERSATIONS = 50
#: alternating blocks (sequential appends) and rotations (history lengths)
ROUNDS = 10
#: alternating rounds of the concurrent workload
CONCURRENT_ROUNDS = 4
_T0 = time.perf_counter()


def log(what: str) -> None:
    print(f"bench: [{time.perf_counter() - _T0:6.1f} s] {what}", file=sys.stderr, flush=True)


def sizes(max_events: int) -> list[int]:
    return sorted({s for s in (1_000, 10_000, 100_000) if s <= max_events} | {max_events})


def _k(size: int) -> str:
    return f"{size / 1000:g}k" if size % 1000 == 0 else f"{size:,}"


async def run(args: argparse.Namespace, url: str) -> tuple[Report, str]:
    postgres = await db.server_version(url)
    await raw.setup(url)
    store = await EpisodicStore.open(url, settings=EpisodicSettings(_env_file=None))
    try:
        await store.migrate()
        report = Report()
        await _appends(args, url, store, report)
        await _history(args, url, store, report)
        log("done")
        return report, postgres
    finally:
        await store.close()


async def _appends(
    args: argparse.Namespace, url: str, store: EpisodicStore, report: Report
) -> None:
    """Raw asyncpg and episodic alternate in blocks so both see the same (noisy) machine."""
    n = args.appends
    log(f"raw asyncpg and episodic: {n:,} sequential appends each, in {ROUNDS} alternating blocks")
    unpinned = await _sequential(url, store, n)
    assert unpinned is not None
    cores = placement.cores()
    pinned = None
    if cores is not None:
        log("the same, this process on one core and the database's backends on another")
        pinned = await _sequential(url, store, n, cores)
    what = f"{n:,} sequential 1-message appends"
    for (raw_tp, raw_lat), (ep_tp, ep_lat), where in (
        (*unpinned, "placed by the scheduler"),
        *([(*pinned, "client and server on separate cores")] if pinned else []),
    ):
        seq = ratio(ep_tp.per_second, raw_tp.per_second)
        report.add(Row(f"raw asyncpg: {what}, {where}", raw_tp.per_second, raw_lat, vs_raw=1.0))
        report.add(Row(f"episodic: {what}, {where}", ep_tp.per_second, ep_lat, vs_raw=seq))
    # The single-connection latency ratios below compare with the scheduler's placement too.
    report.raw_rate = unpinned[0][0].per_second
    if pinned is None:
        seq = ratio(unpinned[1][0].per_second, unpinned[0][0].per_second)
        target = "single-conversation append, episodic / raw asyncpg (not pinned: see note)"
    else:
        seq = ratio(pinned[1][0].per_second, pinned[0][0].per_second)
        target = "single-conversation append, episodic / raw asyncpg (separate cores)"
    report.summary.append(Summary(target, seq, ">= 0.6", seq >= 0.6))

    per_task = args.concurrent_per_task
    what = f"{TASKS} tasks x {CONVERSATIONS} conversations, {TASKS * per_task:,} appends"
    log(f"raw asyncpg and episodic: {what} each, in {CONCURRENT_ROUNDS} alternating rounds")
    raw_runs: list[Throughput] = []
    ep_runs: list[Throughput] = []
    for part in split(per_task, CONCURRENT_ROUNDS):
        raw_runs.append(await raw.concurrent(url, TASKS, CONVERSATIONS, part))
        ep_runs.append(await ours.concurrent(store, TASKS, CONVERSATIONS, part))
    raw_c, ep_c = Throughput.total(raw_runs), Throughput.total(ep_runs)
    report.add(Row(f"raw asyncpg: {what}", raw_c.per_second, vs_raw=1.0))
    conc = ratio(ep_c.per_second, raw_c.per_second)
    report.add(Row(f"episodic: {what}", ep_c.per_second, vs_raw=conc))
    report.summary.append(
        Summary("concurrent appends, episodic / raw asyncpg", conc, ">= 0.5", conc >= 0.5)
    )


Sequential = tuple[tuple[Throughput, Latency], tuple[Throughput, Latency]]


async def _sequential(
    url: str, store: EpisodicStore, n: int, cores: tuple[set[int], set[int]] | None = None
) -> Sequential | None:
    """Raw asyncpg's and episodic's sequential appends, in alternating blocks, each to a new
    conversation; with ``cores``, this process on the first and the database's backends on
    the second (bench/placement.py), or None where they cannot be pinned."""
    raw_seq = await raw.Sequential.open(url)
    ep_seq = await ours.Sequential.open(store)
    pids = await placement.pin_backends(url, cores[1]) if cores is not None else None
    if cores is not None and pids is None:
        await raw_seq.close()
        return None
    try:
        with placement.client_on(cores[0]) if cores is not None else nullcontext():
            for part in split(n, ROUNDS):
                await raw_seq.block(part)
                await ep_seq.block(part)
    finally:
        await raw_seq.close()
        if pids is not None:
            placement.unpin_backends(pids)
    return raw_seq.result(), ep_seq.result()


async def _history(
    args: argparse.Namespace, url: str, store: EpisodicStore, report: Report
) -> None:
    all_sizes = sizes(args.max_events)
    plain_sizes = [s for s in all_sizes if s <= 10_000]
    top = all_sizes[-1]

    log(f"episodic: growing conversations of {', '.join(_k(s) for s in all_sizes)} events")
    grown = await history.grown(store, all_sizes)
    log("raw asyncpg: the load references' rows")
    conv, biggest = uuid4(), max(plain_sizes)
    encoded = [orjson.dumps(m.stored_fields()).decode() for m in History("ref").take(biggest)]
    await raw.fill(url, conv, encoded)
    ref_conn = await asyncpg.connect(url)
    try:
        ref_loaders = {rows: raw.Loader(ref_conn, conv, biggest - rows) for rows in plain_sizes}
        log(f"episodic: load_context without a boundary @{', @'.join(map(_k, plain_sizes))}")
        mixed: dict[tuple[str, int], history.Timed] = {
            ("raw", rows): loader for rows, loader in ref_loaders.items()
        }
        mixed |= {("plain", s): ours.Loader(store, grown[s]) for s in plain_sizes}
        first_pass = await history.loads(mixed, args.loads, ROUNDS)
        log(f"episodic: {args.window} single appends to each")
        windows = await history.append_windows(store, grown, args.window, ROUNDS)
        log(f"episodic: conversations behind a boundary with a {ours.TAIL}-message tail")
        bounded_convs = await history.behind_boundaries(store, all_sizes)
        log("episodic: load_context behind a boundary")
        mixed = {("raw", ours.TAIL): raw.Loader(ref_conn, conv, biggest - ours.TAIL)}
        mixed |= {("bounded", s): ours.Loader(store, c) for s, c in bounded_convs.items()}
        second_pass = await history.loads(mixed, args.loads, ROUNDS)
    finally:
        await ref_conn.close()
    plain = {size: first_pass[("plain", size)] for size in plain_sizes}
    bounded = {size: second_pass[("bounded", size)] for size in all_sizes}
    fetched_refs = {rows: first_pass[("raw", rows)] for rows in plain_sizes}
    fetched_refs[ours.TAIL] = second_pass[("raw", ours.TAIL)]

    base = windows[all_sizes[0]]
    for size, lat in windows.items():
        report.add(
            Row(
                f"episodic: append latency @{_k(size)} events",
                lat.per_second,
                lat,
                vs_raw=ratio(lat.per_second, report.raw_rate),
                vs_1k=ratio(lat.median_ms, base.median_ms),
            )
        )
    refs: dict[int, Latency] = {}
    for rows in sorted(fetched_refs):
        fetched, refs[rows] = fetched_refs[rows]
        report.add(
            Row(
                f"raw asyncpg: fetch + decode {rows:,} rows",
                None,
                refs[rows],
                vs_raw=1.0,
                note=f"{fetched:,} rows",
            )
        )

    for label, found, same_rows in (
        ("behind a boundary", bounded, False),
        ("no boundary", plain, True),
    ):
        first = found[all_sizes[0]][1]
        for size, (loaded, lat) in found.items():
            report.add(
                Row(
                    f"episodic: load_context @{_k(size)} events, {label}",
                    None,
                    lat,
                    vs_raw=ratio(refs[size if same_rows else ours.TAIL].median_ms, lat.median_ms),
                    vs_1k=ratio(lat.median_ms, first.median_ms),
                    note=f"{loaded:,} messages",
                )
            )

    # The load ratios of issue 14: the median load against the raw fetch + decode of as many
    # rows, behind a boundary at the longest history and without one at each length.
    behind = ratio(refs[ours.TAIL].median_ms, bounded[top][1].median_ms)
    report.summary.append(
        Summary(
            f"load_context behind a boundary @{_k(top)}, episodic / raw fetch + decode",
            behind,
            ">= 0.5",
            behind >= 0.5,
        )
    )
    for size in plain_sizes:
        whole = ratio(refs[size].median_ms, plain[size][1].median_ms)
        report.summary.append(
            Summary(
                f"load_context, no boundary, {size:,} messages, episodic / raw fetch + decode",
                whole,
                ">= 0.5",
                whole >= 0.5,
            )
        )

    growth = ratio(windows[top].median_ms, base.median_ms)
    load_growth = ratio(bounded[top][1].median_ms, bounded[all_sizes[0]][1].median_ms)
    report.summary[1:1] = [
        Summary(f"append median latency @{_k(top)} / @1k", growth, "<= 1.1", growth <= 1.1)
    ]
    report.summary.append(
        Summary(
            f"load_context median behind a boundary @{_k(top)} / @1k",
            load_growth,
            "<= 1.2",
            load_growth <= 1.2,
        )
    )
