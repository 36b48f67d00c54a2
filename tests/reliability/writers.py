"""Child processes for the reliability battery (T1, T2, T5) and the checks they feed.

:class:`Children` starts long-lived processes with ``forkserver`` (forks of a clean server
process, so no event loop, pool or thread of the test process is ever inherited) that share
one :class:`multiprocessing.Barrier` and one stop :class:`multiprocessing.Event`, then runs
jobs in them: a T1 writer (one store, one connection), a reader (``load_context`` /
``read_events`` in a loop), a T2 batch writer, and a compaction worker with an instant fake
summarizer. The processes are reused from one seed to the next.

Every job returns plain data (records of what was asked and what came back); the parent checks
it against the final log with :func:`check_log`. Reads are reported as a SHA-256 digest of their
events (seq, kind, role, text), so a read of thousands of messages costs a few bytes to report
and is still compared exactly.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import itertools
import logging
import multiprocessing
import os
import random
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any
from uuid import UUID

CTX = multiprocessing.get_context("forkserver")
# The fork server imports these once; each child is a fork of it (no event loop, no pool, no
# thread of pytest's is ever inherited), which starts a child in milliseconds, not a second.
CTX.set_forkserver_preload(["asyncpg", "episodic", "episodic.worker", __name__])
#: how long a party waits at the barrier before the round is declared broken
BARRIER_TIMEOUT = 90.0
#: fraction of T1 appends that pass a deliberately stale ``expected_seq`` (and as many a fresh one)
STALE_FRACTION = 0.05
#: how many times a T5 writer re-sends one keyed append after TransientDatabaseError
KEYED_TRIES = 200


# ---- tokens and digests: what a read saw, compared exactly -------------------------------------


def message_token(seq: int, role: str, text: str) -> str:
    return f"{seq}|m|{role}|{text}"


def event_token(event: Any) -> str:
    """One stored event as a line: seq, kind and what identifies its content."""
    kind = event.kind
    if kind == "message":
        return message_token(event.seq, event.message.role, event.message.text)
    if kind == "boundary":
        return f"{event.seq}|b|{event.covers_through_seq}"
    return f"{event.seq}|{kind}"


def digest(tokens: Iterable[str]) -> str:
    h = hashlib.sha256()
    for token in tokens:
        h.update(token.encode())
        h.update(b"\n")
    return h.hexdigest()


def prefix_digests(tokens: Sequence[str]) -> list[str]:
    """``out[k] == digest(tokens[:k])`` for every k."""
    h = hashlib.sha256()
    out = [h.hexdigest()]
    for token in tokens:
        h.update(token.encode())
        h.update(b"\n")
        out.append(h.hexdigest())
    return out


# ---- the process pool --------------------------------------------------------------------------


def _serve(conn: Connection, barrier: Any, stop: Any) -> None:
    """A child's main loop: run each job it is sent, send back its result (or a traceback)."""
    for name in list(os.environ):
        if name.startswith("EPISODIC_"):
            del os.environ[name]
    logging.basicConfig(level=logging.WARNING)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            result: dict[str, Any] = asyncio.run(JOBS[job["kind"]](job, barrier, stop))
        except BaseException:
            result = {"crash": traceback.format_exc()}
        conn.send(result)


class Children:
    """``count`` spawned processes sharing ``barrier`` (``parties`` of them, the parent
    included when it takes part) and ``stop``."""

    def __init__(self, count: int, *, parties: int) -> None:
        self.barrier = CTX.Barrier(parties)
        self.stop = CTX.Event()
        self.processes: list[Any] = []
        self.pipes: list[Connection] = []
        for n in range(count):
            parent_end, child_end = CTX.Pipe()
            process = CTX.Process(
                target=_serve,
                args=(child_end, self.barrier, self.stop),
                name=f"battery-child-{n}",
                daemon=True,
            )
            process.start()
            child_end.close()
            self.processes.append(process)
            self.pipes.append(parent_end)
        self.outstanding = [0] * count

    def submit(self, index: int, job: dict[str, Any]) -> None:
        self.pipes[index].send(job)
        self.outstanding[index] += 1

    async def result(self, index: int, *, within: float = 300.0) -> dict[str, Any]:
        """The next result of child ``index``, without blocking the event loop."""
        pipe, process = self.pipes[index], self.processes[index]
        deadline = time.monotonic() + within
        while not pipe.poll():
            if not process.is_alive():
                raise AssertionError(f"child {index} died (exit code {process.exitcode})")
            if time.monotonic() > deadline:
                raise AssertionError(f"child {index} gave no result within {within:g} s")
            await asyncio.sleep(0.02)
        result: dict[str, Any] = pipe.recv()
        self.outstanding[index] -= 1
        if "crash" in result:
            raise AssertionError(f"child {index} crashed:\n{result['crash']}")
        return result

    async def wait_barrier(self) -> None:
        """The parent's turn at the barrier (in a thread: the event loop stays free)."""
        await asyncio.to_thread(self.barrier.wait, BARRIER_TIMEOUT)

    async def settle(self) -> None:
        """After a round, however it ended: stop every job, drop results nobody collected
        (a failed round's), and make the barrier usable again."""
        self.stop.set()
        try:
            for index, count in enumerate(self.outstanding):
                for _ in range(count):
                    with contextlib.suppress(AssertionError):
                        await self.result(index, within=BARRIER_TIMEOUT + 30)
        finally:
            self.stop.clear()
            if self.barrier.broken:
                self.barrier.reset()

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()  # this child only, by its own handle
                process.join(timeout=5)
        for pipe in self.pipes:
            pipe.close()


# ---- jobs (run in the children) ---------------------------------------------------------------


async def _open_store(url: str, *, pool_max: int = 1, trigger_turns: int | None = None) -> Any:
    from episodic import EpisodicStore
    from episodic.policy import EpisodicCompactionConfig
    from episodic.settings import EpisodicSettings

    settings = EpisodicSettings(_env_file=None, pool_min_size=1, pool_max_size=pool_max)
    store = await EpisodicStore.open(url, settings=settings)
    if trigger_turns is not None:
        store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=trigger_turns)
    return store


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:500]


def _where(exc: BaseException) -> str:
    """Where an unexpected exception came from: its innermost frames in episodic and asyncpg."""
    frames = traceback.extract_tb(exc.__traceback__)
    shown = [f for f in frames if "/episodic/" in f.filename][-4:] + frames[-2:]
    return " <- ".join(
        f"{f.filename.rsplit('/site-packages/', 1)[-1].rsplit('/main/', 1)[-1]}:{f.lineno} {f.name}"
        for f in reversed(shown)
    )


async def t1_writer(job: dict[str, Any], barrier: Any, stop: Any) -> dict[str, Any]:
    """Appends to random conversations of the round, ``appends`` times (or, with ``timed``,
    until ``stop``). About 5% pass a deliberately stale ``expected_seq``, 5% the head just
    read. With ``keyed``, every append carries an idempotency key or client ids and is re-sent
    unchanged after a TransientDatabaseError until it is answered."""
    from episodic import ConflictError, EpisodicError, Message, TransientDatabaseError

    writer, seed = job["writer"], job["seed"]
    conversations = [UUID(c) for c in job["conversations"]]
    keyed, timed = job.get("keyed", False), job.get("timed", False)
    rng = random.Random(f"t1:{seed}:{writer}")
    owner = await _open_store(job["url"], trigger_turns=job.get("trigger_turns"))
    # ``scoped``: through ``store.for_tenant``, as a multi-tenant server would
    store = owner.for_tenant(job["tenant"]) if job.get("scoped") else owner
    records: list[dict[str, Any]] = []
    calls: list[tuple[float, bool]] = []  # (start, answered without a transient error)
    unexpected: list[str] = []
    replays = {"checked": 0, "mismatched": []}
    try:
        barrier.wait(BARRIER_TIMEOUT)
        i = 0
        while (not stop.is_set()) if timed else i < job["appends"]:
            conv = rng.randrange(len(conversations))
            cid = conversations[conv]
            size = rng.choice((1, 1, 1, 2, 3))
            texts = [f"s{seed}w{writer}i{i}m{j}" for j in range(size)]
            roles = [rng.choice(("user", "assistant")) for _ in range(size)]
            draw = rng.random()
            mode = "plain"
            if draw < 2 * STALE_FRACTION:
                mode = "stale" if draw < STALE_FRACTION else "fresh"
            keying = rng.choice(("key", "client_id")) if keyed else None
            key = f"s{seed}w{writer}i{i}" if keying == "key" else None
            messages = [
                Message(
                    role=role,
                    content=text,
                    client_id=text if keying == "client_id" else None,
                )
                for role, text in zip(roles, texts, strict=True)
            ]
            record: dict[str, Any] = {
                "i": i,
                "conv": conv,
                "texts": texts,
                "roles": roles,
                "mode": mode,
                "key": key,
                "keying": keying,
                "head": None,
                "expected": None,
                "outcome": None,
                "seqs": None,
                "actual": None,
                "transients": 0,
            }
            for _ in range(KEYED_TRIES if keyed else 1):
                started = time.monotonic()
                try:
                    if mode != "plain" and record["expected"] is None:
                        head = (await store.get_conversation(cid)).last_seq
                        record["head"] = head
                        # seqs only grow, so anything below the head just read is stale
                        record["expected"] = head if mode == "fresh" else rng.randrange(head)
                    events = await store.append(
                        cid, messages, idempotency_key=key, expected_seq=record["expected"]
                    )
                    record["outcome"] = "ok"
                    record["seqs"] = [event.seq for event in events]
                except ConflictError as exc:
                    record["outcome"] = "conflict"
                    record["actual"] = exc.actual_seq
                except TransientDatabaseError as exc:
                    record["transients"] += 1
                    calls.append((started, False))
                    if not keyed:
                        record["outcome"] = "error"
                        unexpected.append(f"append {i}: {_describe(exc)} at {_where(exc)}")
                        break
                    await asyncio.sleep(0.01)
                    continue
                except Exception as exc:
                    unexpected.append(f"append {i}: {_describe(exc)} at {_where(exc)}")
                    if keyed and not isinstance(exc, EpisodicError):
                        # A driver error that should have been a TransientDatabaseError: the
                        # outcome is unknown, so re-send the keyed append as for one.
                        record["untyped"] = record.get("untyped", 0) + 1
                        calls.append((started, False))
                        await asyncio.sleep(0.01)
                        continue
                    record["outcome"] = "error"
                calls.append((started, record["outcome"] != "error"))
                break
            else:
                record["outcome"] = "error"
                unexpected.append(f"append {i}: still failing after {KEYED_TRIES} tries")
            records.append(record)
            i += 1
        if keyed:
            await _replay(store, conversations, records, rng, replays, unexpected)
    finally:
        await owner.close()
    return {
        "writer": writer,
        "records": records,
        "calls": calls,
        "unexpected": unexpected,
        "replays": replays,
    }


async def _replay(
    store: Any,
    conversations: list[UUID],
    records: list[dict[str, Any]],
    rng: random.Random,
    replays: dict[str, Any],
    unexpected: list[str],
) -> None:
    """Re-send, with the same key and the same batch, every acknowledged append that met an
    error on the way (and was re-sent then) and a sample of 20 others: each must return its
    original seqs."""
    from episodic import Message, TransientDatabaseError

    acknowledged = [r for r in records if r["outcome"] == "ok"]
    chosen = [r for r in acknowledged if r["transients"] or r.get("untyped")]
    others = [r for r in acknowledged if not (r["transients"] or r.get("untyped"))]
    chosen += rng.sample(others, min(20, len(others)))
    for record in chosen:
        messages = [
            Message(
                role=role,
                content=text,
                client_id=text if record["keying"] == "client_id" else None,
            )
            for role, text in zip(record["roles"], record["texts"], strict=True)
        ]
        for _ in range(20):
            try:
                events = await store.append(
                    conversations[record["conv"]],
                    messages,
                    idempotency_key=record["key"],
                    expected_seq=record["expected"],
                )
            except TransientDatabaseError:
                await asyncio.sleep(0.05)
                continue
            except Exception as exc:
                unexpected.append(
                    f"replay of append {record['i']}: {_describe(exc)} at {_where(exc)}"
                )
                break
            replays["checked"] += 1
            seqs = [event.seq for event in events]
            if seqs != record["seqs"]:
                replays["mismatched"].append((record["i"], record["seqs"], seqs))
            break


async def reader(job: dict[str, Any], barrier: Any, stop: Any) -> dict[str, Any]:
    """Until ``stop``: ``load_context`` and ``read_events`` (paged to the end) of random
    conversations, alternately; each read reported as a digest of what it returned."""
    from episodic import TransientDatabaseError

    conversations = [UUID(c) for c in job["conversations"]]
    rng = random.Random(f"reader:{job['seed']}:{job['reader']}")
    owner = await _open_store(job["url"])
    # with ``tenant``, every other read goes through ``store.for_tenant``
    scoped = owner.for_tenant(job["tenant"]) if job.get("tenant") else owner
    reads: list[dict[str, Any]] = []
    calls: list[tuple[float, bool]] = []
    unexpected: list[str] = []
    try:
        barrier.wait(BARRIER_TIMEOUT)
        n = 0
        while not stop.is_set():
            conv = rng.randrange(len(conversations))
            cid = conversations[conv]
            op = "context" if n % 2 == 0 else "events"
            store = scoped if n % 4 >= 2 else owner
            n += 1
            started = time.monotonic()
            try:
                if op == "context":
                    ctx = await store.load_context(cid)
                    boundary = ctx.boundary
                    messages = list(ctx.messages)
                    handoff = messages.pop(0) if boundary is not None else None
                    # the handoff carries the boundary's seq; the tail is in seq order
                    stored = [m for m in messages if m.seq is not None]
                    tokens = [message_token(m.seq, m.role, m.text) for m in stored]
                    read = {
                        "last_seq": ctx.last_seq,
                        "synthetic": len(messages) - len(stored),
                        "boundary": None if boundary is None else boundary.seq,
                        "covers": None if boundary is None else boundary.covers_through_seq,
                        "summary": None if boundary is None else boundary.summary,
                        "handoff": None if handoff is None else (handoff.seq, handoff.text),
                        "ordered": all(a.seq < b.seq for a, b in itertools.pairwise(stored)),
                    }
                else:
                    events: list[Any] = []
                    while True:
                        after = events[-1].seq if events else 0
                        page = await store.read_events(cid, after_seq=after, limit=10_000)
                        events += page
                        if len(page) < 10_000:
                            break
                    tokens = [event_token(e) for e in events]
                    read = {}
            except TransientDatabaseError:
                calls.append((started, False))
                continue
            except Exception as exc:
                calls.append((started, False))
                unexpected.append(f"{op}: {_describe(exc)} at {_where(exc)}")
                continue
            calls.append((started, True))
            reads.append(
                {"conv": conv, "op": op, "n": len(tokens), "digest": digest(tokens), **read}
            )
    finally:
        await store.close()
    return {"reads": reads, "calls": calls, "unexpected": unexpected}


async def batch_writer(job: dict[str, Any], barrier: Any, stop: Any) -> dict[str, Any]:
    """T2: for each conversation of ``conversations``, wait at the barrier, then append one
    batch of ``items`` small messages to it."""
    from episodic import Message

    writer = job["writer"]
    store = await _open_store(job["url"])
    rounds: list[dict[str, Any]] = []
    try:
        for repeat, conversation in enumerate(job["conversations"]):
            texts = [f"b{writer}r{repeat}k{k}" for k in range(job["items"])]
            messages = [Message.user(text) for text in texts]
            barrier.wait(BARRIER_TIMEOUT)
            started = time.monotonic()
            events = await store.append(UUID(conversation), messages)
            rounds.append(
                {
                    "texts": texts,
                    "seqs": [event.seq for event in events],
                    "started": started,
                    "ended": time.monotonic(),
                }
            )
    finally:
        await store.close()
    return {"writer": writer, "rounds": rounds}


class InstantSummarizer:
    """The fake LLM: answers at once with a non-empty summary."""

    name = "instant"

    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, request: Any) -> Any:
        from episodic import Usage
        from episodic.summarizers import SummaryResult

        self.calls += 1
        return SummaryResult(
            text=f"summary #{self.calls}", usage=Usage(input_tokens=10, output_tokens=3), model="m"
        )


class _Collect(logging.Handler):
    """Keeps every error the worker logs: the logger, the message, and the exception's type."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[dict[str, str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.records.append(
            {
                "logger": record.name,
                "message": record.getMessage()[:300],
                "type": _type_name(exc) if exc is not None else None,
                "error": _describe(exc) if exc is not None else None,
                "at": _where(exc) if exc is not None else None,
            }
        )


def _type_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


async def compaction_worker(job: dict[str, Any], barrier: Any, stop: Any) -> dict[str, Any]:
    """A CompactionWorker (instant summarizer, short lease, fast polling) that runs from the
    barrier until ``stop``; reports its summarizer calls and every error it logged."""
    from episodic.worker import CompactionOptions, CompactionWorker

    collected = _Collect()
    logging.getLogger("episodic").addHandler(collected)
    logging.getLogger("episodic").propagate = False  # counted, not printed
    loop = asyncio.get_running_loop()
    unhandled: list[str] = []  # exceptions nobody awaited, e.g. of an attempt's task
    loop.set_exception_handler(
        lambda _loop, context: unhandled.append(
            f"{context.get('message')}: {_describe(context['exception'])} "
            f"at {_where(context['exception'])}"
            if context.get("exception") is not None
            else str(context.get("message"))
        )
    )
    store = await _open_store(job["url"], pool_max=2)
    summarizer = InstantSummarizer()
    worker = CompactionWorker(
        store,
        summarizer,
        concurrency=2,
        options=CompactionOptions(max_attempts=1_000, backoff_base=0.05, backoff_max=0.2),
        lease_seconds=job["lease_seconds"],
        poll_interval=0.1,
        sweep_interval=3_600,
        shutdown_grace=5,
        worker_id="battery-worker",
    )
    crash: str | None = None
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(0.3)  # listening before the round starts
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT)
        await asyncio.wait(
            [running, asyncio.create_task(asyncio.to_thread(stop.wait))],
            return_when=asyncio.FIRST_COMPLETED,
        )
        worker.stop()
        try:
            await asyncio.wait_for(running, timeout=30)
        except Exception as exc:
            crash = _describe(exc)
    finally:
        await store.close()
    return {
        "summaries": summarizer.calls,
        "errors": collected.records,
        "unhandled": unhandled,
        "run_error": crash,
    }


JOBS: dict[str, Callable[[dict[str, Any], Any, Any], Coroutine[Any, Any, dict[str, Any]]]] = {
    "t1_writer": t1_writer,
    "reader": reader,
    "batch": batch_writer,
    "worker": compaction_worker,
}


# ---- checks (in the parent) -------------------------------------------------------------------


@dataclass
class LogReport:
    """What :func:`check_log` counted, and every violation it found."""

    appends: int = 0
    acknowledged: int = 0
    messages: int = 0
    events: int = 0
    boundaries: int = 0
    gaps: int = 0
    duplicates: int = 0
    conflicts_stale: int = 0
    conflicts_fresh: int = 0
    fresh_ok: int = 0
    reads_context: int = 0
    reads_events: int = 0
    transients: int = 0
    stale_errors: int = 0
    violations: list[str] = field(default_factory=list)
    #: exceptions other than ConflictError (and, for keyed appends, TransientDatabaseError)
    unexpected: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(text)
        elif len(self.violations) == 50:
            self.violations.append("... (more violations not shown)")


def check_log(
    final: Sequence[Sequence[Any]],
    seeded: Sequence[Sequence[tuple[int, str, str]]],
    writers: Sequence[dict[str, Any]],
    readers: Sequence[dict[str, Any]],
) -> LogReport:
    """The T1 invariants, against ``final`` (each conversation's stored events, in seq order).

    ``seeded``: messages the parent appended before the round, (seq, role, text) per
    conversation. ``writers`` / ``readers``: the children's results.
    """
    report = LogReport()
    # -- gapless, duplicate-free seqs
    for conv, events in enumerate(final):
        seqs = [e.seq for e in events]
        report.events += len(seqs)
        if seqs != list(range(1, len(seqs) + 1)):
            gaps = (max(seqs, default=0)) - len(set(seqs))
            report.gaps += max(gaps, 0)
            report.duplicates += len(seqs) - len(set(seqs))
            report.fail(f"conversation {conv}: seqs are not 1..n: {_ranges(seqs)}")
        report.boundaries += sum(e.kind == "boundary" for e in events)

    # -- rows = acknowledged appends, exactly (where, with which role, and how many times)
    stored: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for conv, events in enumerate(final):
        for e in events:
            if e.kind == "message":
                stored[e.message.text].append((conv, e.seq, e.message.role))
                report.messages += 1
            elif e.kind != "boundary":
                report.fail(f"conversation {conv}: unexpected {e.kind} event at seq {e.seq}")
    acknowledged: dict[str, tuple[int, int, str]] = {}
    for conv, rows in enumerate(seeded):
        for seq, role, text in rows:
            acknowledged[text] = (conv, seq, role)
    for result in writers:
        report.unexpected += [f"writer {result['writer']}: {t}" for t in result["unexpected"]]
        for r in result["records"]:
            report.appends += 1
            report.transients += r["transients"]
            if r["outcome"] == "ok":
                report.acknowledged += 1
                for offset, (role, text) in enumerate(zip(r["roles"], r["texts"], strict=True)):
                    acknowledged[text] = (r["conv"], r["seqs"][0] + offset, role)
                if r["seqs"] != list(range(r["seqs"][0], r["seqs"][0] + len(r["texts"]))):
                    report.fail(f"writer {result['writer']} append {r['i']}: seqs {r['seqs']}")
    for text, places in stored.items():
        if len(places) > 1:
            report.duplicates += len(places) - 1
            report.fail(f"message {text!r} stored {len(places)} times: {places}")
        if text not in acknowledged:
            report.fail(f"message {text!r} stored at {places[0]} but never acknowledged")
        elif acknowledged[text] != places[0]:
            report.fail(f"message {text!r} acknowledged as {acknowledged[text]}, stored {places}")
    for text, place in acknowledged.items():
        if text not in stored:
            report.fail(f"acknowledged message {text!r} ({place}) is not in the log")

    # -- program order, expected_seq and conflicts
    for result in writers:
        last: dict[int, int] = {}
        for r in result["records"]:
            where = f"writer {result['writer']} append {r['i']} ({r['mode']})"
            if r["outcome"] == "ok":
                first = r["seqs"][0]
                if first <= last.get(r["conv"], 0):
                    report.fail(f"{where}: seq {first} after {last[r['conv']]}: out of order")
                last[r["conv"]] = r["seqs"][-1]
                if r["mode"] == "stale":
                    report.fail(f"{where}: stale expected_seq {r['expected']} was accepted")
                if r["mode"] == "fresh":
                    report.fresh_ok += 1
                    if first != r["expected"] + 1:
                        report.fail(f"{where}: expected {r['expected']}, written at {first}")
            elif r["outcome"] == "conflict":
                head, expected, actual = r["head"], r["expected"], r["actual"]
                n = len(final[r["conv"]])
                if r["mode"] == "plain" or expected is None or actual is None:
                    report.fail(f"{where}: ConflictError without an expected_seq")
                elif not (expected < actual <= n and head <= actual):
                    # the head only grows: a real change means it moved past what was expected
                    report.fail(
                        f"{where}: ConflictError expected {expected}, head read {head}, "
                        f"actual {actual}, final {n}: not a real change of head"
                    )
                elif r["mode"] == "stale":
                    report.conflicts_stale += 1
                else:
                    report.conflicts_fresh += 1
            elif r["mode"] == "stale":
                report.stale_errors += 1  # an unexpected exception, counted there

    # -- every read is a prefix (read_events) or the context of a prefix (load_context)
    tokens = [[event_token(e) for e in events] for events in final]
    prefixes = [prefix_digests(t) for t in tokens]
    for result in readers:
        report.unexpected += [f"reader: {text}" for text in result["unexpected"]]
        for read in result["reads"]:
            conv, n = read["conv"], read["n"]
            events = final[conv]
            if read["op"] == "events":
                report.reads_events += 1
                if n > len(events) or prefixes[conv][n] != read["digest"]:
                    report.fail(f"read_events of conversation {conv} ({n} events): not a prefix")
                continue
            report.reads_context += 1
            last_seq, covers = read["last_seq"], read["covers"] or 0
            where = f"load_context of conversation {conv} at seq {last_seq}"
            if last_seq > len(events) or not read["ordered"]:
                report.fail(f"{where}: beyond the final log, or out of order")
                continue
            window = events[:last_seq]
            boundaries = [e for e in window if e.kind == "boundary"]
            latest = boundaries[-1] if boundaries else None
            if (None if latest is None else latest.seq) != read["boundary"] or (
                latest is not None and latest.covers_through_seq != covers
            ):
                report.fail(f"{where}: boundary {read['boundary']}, the log has {latest}")
                continue
            if latest is None and read["synthetic"]:
                report.fail(f"{where}: {read['synthetic']} synthetic messages, no boundary")
            if latest is not None and (
                read["summary"] != latest.summary or read["handoff"] != (latest.seq, latest.summary)
            ):
                report.fail(f"{where}: the handoff is not boundary {latest.seq}'s summary")
            start = bisect.bisect_right([e.seq for e in window], covers)
            tail = [
                t
                for e, t in zip(window[start:], tokens[conv][start:], strict=False)
                if e.kind == "message"
            ]
            if digest(tail) != read["digest"] or len(tail) != n:
                report.fail(f"{where}: the messages are not the log's tail after seq {covers}")
    return report


def _ranges(seqs: Sequence[int]) -> str:
    if len(seqs) > 20:
        return f"{len(seqs)} seqs from {min(seqs)} to {max(seqs)}"
    return str(list(seqs))


def recovery(
    calls: Iterable[tuple[float, bool]], since: float, until: float
) -> tuple[int, int, float | None]:
    """Calls started in [since, until): how many, how many answered, and when (seconds after
    ``since``) the last failed one started."""
    window = [(t, ok) for t, ok in calls if since <= t < until]
    failed = [t for t, ok in window if not ok]
    return len(window), len(window) - len(failed), (max(failed) - since) if failed else None


__all__ = [
    "Children",
    "InstantSummarizer",
    "LogReport",
    "check_log",
    "digest",
    "event_token",
    "message_token",
    "prefix_digests",
    "recovery",
]
