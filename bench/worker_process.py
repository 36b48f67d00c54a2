"""One compaction worker process, for the worker benchmark (``bench/worker.py``).

Runs ``CompactionWorker(...).run()`` (the production loop: SKIP LOCKED claims, a fixed number
of attempts in flight) with a fake summarizer that returns a fixed summary after ``--delay``
seconds (0: at once). It notes when each attempt finished, the peak of ``worker.in_flight``
and its own CPU time, and prints them as one JSON line on stdout when it stops.

Driven by ``bench/worker.py``: it prints ``ready`` once its pool is open, starts on a ``go``
line on stdin and stops on a ``stop`` line (or end of input). Alone, with ``--until-idle``,
it starts at once and stops when no conversation is due, e.g. to profile a run on a scratch
database (``--seed N`` migrates it and creates N due conversations, then exits)::

    createdb -h 127.0.0.1 -U postgres worker_profile
    URL=postgresql://postgres@127.0.0.1/worker_profile
    .venv/bin/python -m bench.worker_process $URL --seed 3000
    .venv/bin/py-spy record --rate 250 --format raw -o /tmp/worker.txt -- \\
        .venv/bin/python -m bench.worker_process $URL --concurrency 16 --until-idle
    dropdb -h 127.0.0.1 -U postgres worker_profile

(or ``--profile /tmp/worker.prof`` instead of py-spy, for cProfile).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import sys
import time
from collections import Counter

from bench.ours import SUMMARY
from episodic import EpisodicStore
from episodic.compaction import CompactionRequest
from episodic.policy import EpisodicCompactionConfig
from episodic.settings import EpisodicSettings
from episodic.summarizers import SummaryResult
from episodic.worker import CompactionOptions, CompactionWorker, JobResult, WorkerMetrics

#: how often ``worker.in_flight`` is sampled, seconds
SAMPLE_S = 0.005


class FixedSummarizer:
    """The same summary every time: at once (``delay=0``, never yielding to the event loop),
    or after ``asyncio.sleep(delay)``, like a model call that takes that long."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.name = f"bench-sleep-{delay:g}s" if delay else "bench-instant"

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        if self.delay:
            await asyncio.sleep(self.delay)
        return SummaryResult(text=SUMMARY, model=self.name)


class Finishes(WorkerMetrics):
    """Records when each attempt ended and how (and nothing else: no Prometheus work on the
    measured path; ``episodic worker`` observes metrics only with ``--metrics-port``)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.ended: Counter[str] = Counter()

    def observe(self, result: JobResult) -> None:
        self.times.append(time.monotonic())
        self.ended[result.outcome] += 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.worker_process", description=__doc__)
    p.add_argument("url", help="the PostgreSQL database, with due conversations in it")
    p.add_argument("--concurrency", type=int, default=4, help="attempts in flight")
    p.add_argument("--delay", type=float, default=0.0, help="summarizer latency, seconds")
    p.add_argument(
        "--pool",
        type=int,
        default=None,
        help="connections in the pool, all opened up front (default: EPISODIC_POOL_MAX_SIZE, 10)",
    )
    p.add_argument(
        "--until-idle", action="store_true", help="start at once; stop when nothing is due"
    )
    p.add_argument("--profile", help="write a cProfile of the run (from go to stop) here")
    p.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="instead of working: migrate the database, create N due conversations, exit",
    )
    return p.parse_args(argv)


async def _line() -> str:
    return await asyncio.to_thread(sys.stdin.readline)


async def _until_idle(store: EpisodicStore, worker: CompactionWorker) -> None:
    while True:
        await asyncio.sleep(0.1)
        status = await store.compaction_status(recent=1)
        if status.due == 0 and worker.in_flight == 0:
            return


async def seed(args: argparse.Namespace) -> dict[str, object]:
    from bench import worker

    store = await EpisodicStore.open(
        args.url,
        settings=EpisodicSettings(_env_file=None),
        trigger=EpisodicCompactionConfig(trigger_unfinished_turns=worker.UNFINISHED_TURNS),
    )
    try:
        await store.migrate()
        created = await worker.seed(store, args.seed, worker.MESSAGES, "s")
        return {"seeded": len(created)}
    finally:
        await store.close()


async def main(args: argparse.Namespace) -> dict[str, object]:
    if args.seed:
        return await seed(args)
    size = args.pool or EpisodicSettings(_env_file=None).pool_max_size
    settings = EpisodicSettings(_env_file=None, pool_min_size=size, pool_max_size=size)
    store = await EpisodicStore.open(args.url, settings=settings)
    try:
        finishes = Finishes()
        worker = CompactionWorker(
            store,
            FixedSummarizer(args.delay),
            concurrency=args.concurrency,
            options=CompactionOptions(summarizer_timeout=max(30.0, args.delay * 10)),
            metrics=finishes,
        )
        if not args.until_idle:
            print("ready", flush=True)
            if (await _line()).strip() != "go":
                return {"error": "no go"}
        profile = cProfile.Profile() if args.profile else None
        peak = 0
        cpu0, start = time.process_time(), time.monotonic()
        if profile is not None:
            profile.enable()
        running = asyncio.create_task(worker.run())

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, worker.in_flight)
                await asyncio.sleep(SAMPLE_S)

        sampler = asyncio.create_task(sample())
        if args.until_idle:
            await _until_idle(store, worker)
        else:
            await _line()  # "stop", or end of input
        worker.stop()
        await running
        sampler.cancel()
        stopped, cpu = time.monotonic(), time.process_time() - cpu0
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue(), file=sys.stderr)
        return {
            "worker": worker.worker_id,
            "start": start,
            "stopped": stopped,
            "finished": len(finishes.times),
            "last": max(finishes.times, default=start),
            "outcomes": dict(finishes.ended),
            "peak_in_flight": peak,
            "cpu_seconds": cpu,
            "pool": size,
        }
    finally:
        await store.close()


if __name__ == "__main__":
    result = asyncio.run(main(parse_args(None)))
    print(json.dumps(result), flush=True)
