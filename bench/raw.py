"""The limit: raw asyncpg, one INSERT per message into a minimal table."""

from __future__ import annotations

import asyncio
import time
from uuid import UUID, uuid4

import asyncpg
import orjson

from bench.stats import Latency, Throughput
from bench.workload import text

CREATE = """
CREATE TABLE bench_raw (
    conversation_id uuid NOT NULL,
    seq bigint NOT NULL,
    payload jsonb NOT NULL,
    PRIMARY KEY (conversation_id, seq)
)
"""
INSERT = "INSERT INTO bench_raw (conversation_id, seq, payload) VALUES ($1, $2, $3)"
TAIL = "SELECT seq, payload FROM bench_raw WHERE conversation_id = $1 AND seq > $2 ORDER BY seq"


def _payload(i: int) -> str:
    return orjson.dumps({"role": "user", "content": text(i)}).decode()


async def setup(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(CREATE)
    finally:
        await conn.close()


class Sequential:
    """Single-message appends to one conversation from one connection, run in blocks so they
    can alternate with episodic's and share the machine's noise."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self.conversation = uuid4()
        self.samples: list[float] = []
        self.seconds = 0.0

    @classmethod
    async def open(cls, url: str, warmup: int = 20) -> Sequential:
        conn = await asyncpg.connect(url)
        spare = uuid4()
        for i in range(warmup):
            await conn.execute(INSERT, spare, i + 1, _payload(i))
        return cls(conn)

    async def block(self, n: int) -> None:
        conn, conv, samples = self._conn, self.conversation, self.samples
        first = len(samples)
        start = time.perf_counter()
        for i in range(first, first + n):
            t0 = time.perf_counter()
            await conn.execute(INSERT, conv, i + 1, _payload(i))
            samples.append(time.perf_counter() - t0)
        self.seconds += time.perf_counter() - start

    def result(self) -> tuple[Throughput, Latency]:
        return Throughput(len(self.samples), self.seconds), Latency(tuple(self.samples))

    async def close(self) -> None:
        await self._conn.close()


async def concurrent(url: str, tasks: int, conversations: int, per_task: int) -> Throughput:
    """``tasks`` connections, each appending round-robin to its own ``conversations``."""
    conns = [await asyncpg.connect(url) for _ in range(tasks)]
    try:
        for conn in conns:  # prepare the statement on every connection, untimed
            await conn.execute(INSERT, uuid4(), 1, _payload(0))

        async def run(conn: asyncpg.Connection) -> None:
            convs = [uuid4() for _ in range(conversations)]
            seqs = [0] * conversations
            for i in range(per_task):
                k = i % conversations
                seqs[k] += 1
                await conn.execute(INSERT, convs[k], seqs[k], _payload(i))

        start = time.perf_counter()
        await asyncio.gather(*(run(conn) for conn in conns))
        return Throughput(tasks * per_task, time.perf_counter() - start)
    finally:
        for conn in conns:
            await conn.close()


class Loader:
    """Reference for loads, run in blocks like ``ours.Loader`` so that the two alternate:
    fetch the rows after ``after_seq`` and decode their JSON."""

    def __init__(self, conn: asyncpg.Connection, conv: UUID, after_seq: int) -> None:
        self._conn = conn
        self._conv = conv
        self._after = after_seq
        self.samples: list[float] = []
        self.loaded = 0

    async def block(self, n: int, budget_s: float, min_calls: int = 10) -> None:
        if not self.samples:
            await self._conn.fetch(TAIL, self._conv, self._after)  # warm
        for _ in range(n):
            if len(self.samples) >= min_calls and sum(self.samples) >= budget_s:
                return
            t0 = time.perf_counter()
            fetched = await self._conn.fetch(TAIL, self._conv, self._after)
            decoded = [orjson.loads(r["payload"]) for r in fetched]
            self.samples.append(time.perf_counter() - t0)
            self.loaded = len(decoded)

    def result(self) -> tuple[int, Latency]:
        return self.loaded, Latency(tuple(self.samples))


async def fill(url: str, conv: UUID, payloads: list[str]) -> None:
    """Store ``payloads`` as seqs 1..n of ``conv`` in one COPY (setup for the load reference)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.copy_records_to_table(
            "bench_raw",
            records=[(conv, i + 1, p) for i, p in enumerate(payloads)],
            columns=["conversation_id", "seq", "payload"],
        )
    finally:
        await conn.close()
