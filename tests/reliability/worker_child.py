"""Compaction workers in child processes, for the reliability battery (T4, T6, T7).

Child side. ``python -m tests.reliability.worker_child --zygote`` imports episodic once and
then forks one worker process per JSON spec line it reads on stdin (a fork costs milliseconds,
a fresh interpreter about a second: T4 respawns dozens of workers). Each child runs a real
:class:`CompactionWorker` on PostgreSQL with a fake summarizer, and reports what it does as
JSON lines on the zygote's stdout (one ``os.write`` per line, atomic on a pipe): ``ready``,
``claimed``, ``llm_enter``/``llm_exit``, ``written``/``write_error``, ``ended``, and
``paused`` when it reaches the crash point its spec names, where it then blocks until the
test kills it. Times are ``time.monotonic()``, one clock for every process on Linux.

The library has no fault-injection hooks, so the child wraps, in its own process only,
``EpisodicStore.claim_due`` / ``load_context_and_tail`` / ``write_boundary`` /
``end_attempt`` and ``PostgresBackend.write_boundary`` (class attributes, so the tenant-scoped
store the worker derives per claim is wrapped too). The crash points:

- ``after_claim``: the claim is committed; nothing else done.
- ``during_llm``: inside the summarizer call.
- ``after_llm``: the summary is back, ``store.write_boundary`` not yet entered.
- ``during_write``: inside the boundary write. Variant ``planned``: the head and the tail are
  read and the boundary planned (inside the write's transaction where the backend opens one),
  the conditional write not yet sent. Variant ``in_flight``: the write statement has been sent
  and waits at the server on a row lock the child holds from a second connection, so it is
  executing, uncommitted, when the process dies.
- ``after_write``: ``store.write_boundary`` returned (committed), the attempt not yet
  acknowledged to the worker loop.

The fake summarizer's behaviour comes from the spec: ``fixed`` (answer after a delay),
``gate`` (answer once a release file exists, for SIGSTOP tests), ``script`` (per conversation
and attempt: ok, transient or permanent failure raised the way the adapters raise them, through
``episodic.summarizers.classify.summarizer_error``, or a hang past the timeout).

Parent side: :class:`Fleet` starts the zygote, spawns children, collects their reports, and
kills (by pid) every child it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import logging
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
from sqlalchemy.engine import make_url

from episodic import EpisodicStore
from episodic.settings import EpisodicSettings
from episodic.store.backend import BoundaryPlanner
from episodic.store.postgres.backend import PostgresBackend
from episodic.store.postgres.citus import CITUS_INSTALLED
from episodic.summarizers import SummarizerError, SummaryResult
from episodic.summarizers.classify import summarizer_error
from episodic.worker import CompactionOptions, CompactionWorker

REPO = Path(__file__).resolve().parents[2]
POINTS = ("after_claim", "during_llm", "after_llm", "during_write", "after_write")
WRITE_VARIANTS = ("planned", "in_flight")
WAITING_ON_LOCK = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name = $1 AND wait_event_type = 'Lock'"
)
#: On Citus the delegated write waits on the worker node holding the head, in a backend that
#: shares the global pid of the child's coordinator session.
WAITING_ON_LOCK_CITUS = (
    "SELECT pid FROM citus_stat_activity WHERE wait_event_type = 'Lock' AND global_pid IN "
    "(SELECT global_pid FROM citus_stat_activity WHERE datname = current_database() "
    "AND application_name = $1 AND NOT is_worker_query)"
)


def with_application_name(url: str, application_name: str) -> str:
    """``url`` with ``?application_name=...``: asyncpg passes it to the server, so every
    session of one child is recognisable in pg_stat_activity."""
    parsed = make_url(url).update_query_dict({"application_name": application_name})
    return parsed.render_as_string(hide_password=False)


def plain_dsn(url: str) -> str:
    """The asyncpg DSN of ``url`` without its query string."""
    parsed = make_url(url).set(drivername="postgresql", query={})
    return parsed.render_as_string(hide_password=False)


# ==== child side ==============================================================================

_REPORT_FD = 1
_CHILD: Child | None = None
CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("current", default=None)


def report(ev: str, **fields: Any) -> None:
    """One JSON line to the parent (kept under PIPE_BUF so concurrent writes never mix)."""
    fields.update(ev=ev, name=_CHILD.name if _CHILD else "zygote", pid=os.getpid())
    fields["t"] = time.monotonic()
    line = json.dumps(fields, default=str)
    if len(line) > 3500:
        line = json.dumps(
            {k: (str(v)[:300] if isinstance(v, str) else v) for k, v in fields.items()}
        )
    os.write(_REPORT_FD, (line + "\n").encode())


class HTTPError(Exception):
    """A provider SDK's status error, as classify.py reads it (a ``status_code``)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.response = None


class APITimeoutError(Exception):
    """Named like the SDKs' timeout error, which classify.py takes as transient."""


def provider_error(kind: str) -> BaseException:
    """The provider-side exception a scripted failure raises before classification."""
    match kind:
        case "connection":
            return ConnectionResetError(104, "Connection reset by peer")
        case "http503":
            return HTTPError(503, "Service Unavailable: overloaded")
        case "http429":
            return HTTPError(429, "Too Many Requests")
        case "api_timeout":
            return APITimeoutError("Request timed out.")
        case "http400":
            return HTTPError(400, "Bad Request: context_length_exceeded")
        case "http401":
            return HTTPError(401, "Unauthorized: invalid api key")
        case "bug":
            return KeyError("choices")
    raise ValueError(f"unknown failure kind {kind!r}")


class Child:
    """One worker process's state: its spec, the jobs it claimed, the pause it is headed for."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.pause: dict[str, Any] | None = spec.get("pause")
        self.jobs: dict[str, int] = {}
        self.claims: dict[str, Any] = {}
        self.next_job = 0
        self.script: dict[str, list[dict[str, Any]]] = {}
        llm = spec.get("llm", {"mode": "fixed", "delay": 0.0})
        self.llm = llm
        if llm["mode"] == "script":
            self.script = json.loads(Path(llm["script"]).read_text())
        self.probe: asyncpg.Connection | None = None

    def is_target(self, point: str, cid: str) -> bool:
        pause = self.pause
        return (
            pause is not None
            and pause["point"] == point
            and self.jobs.get(cid) == pause.get("job", 0)
        )

    async def checkpoint(self, point: str, cid: str) -> None:
        if self.is_target(point, cid):
            report("paused", point=point, cid=cid, variant=None)
            await asyncio.Event().wait()  # until SIGKILL


class FakeSummarizer:
    """The fake LLM. It knows the conversation it summarizes from the context variable the
    wrapped ``load_context_and_tail`` sets, and the attempt from the claim."""

    name = "fake-llm"

    def __init__(self, child: Child) -> None:
        self.child = child

    def summarize(self, request: Any) -> Coroutine[Any, Any, SummaryResult]:
        # Not ``async def``: the clock is read when the worker calls summarize(), before
        # ``asyncio.wait_for`` arms its timeout and schedules the call as a task. A call's
        # ``elapsed`` then starts no later than the timeout's own origin, so a hung call's
        # cancellation is measured against the quantity the worker guarantees, not shortened
        # by the wait (under load, arbitrarily long) for the task's first step.
        return self._summarize(request, time.monotonic())

    async def _summarize(self, request: Any, started: float) -> SummaryResult:
        child = self.child
        cid = CURRENT.get() or "?"
        claim = child.claims.get(cid)
        attempt = claim.attempt if claim is not None else 0
        report("llm_enter", cid=cid, attempt=attempt)
        how = "ok"
        try:
            await child.checkpoint("during_llm", cid)
            mode = child.llm["mode"]
            if mode == "fixed":
                await asyncio.sleep(float(child.llm.get("delay", 0.0)))
            elif mode == "gate":
                gate = Path(child.llm["dir"])
                while not (gate / f"release-{cid}").exists():  # noqa: ASYNC110 - a file gate
                    await asyncio.sleep(0.01)
            elif mode == "script":
                step = child.script[cid][attempt - 1]
                await asyncio.sleep(float(step["seconds"]))
                how = step["kind"]
                if how == "hang":
                    await asyncio.sleep(3600)
                if how != "ok":
                    exc = provider_error(step["error"])
                    raise summarizer_error(exc, summarizer=self.name) from exc
            else:
                raise ValueError(f"unknown llm mode {mode!r}")
        except asyncio.CancelledError:
            report("llm_exit", cid=cid, attempt=attempt, how="cancelled", elapsed=_since(started))
            raise
        except SummarizerError as exc:
            report(
                "llm_exit",
                cid=cid,
                attempt=attempt,
                how=how,
                retryable=exc.retryable,
                error=str(exc)[:200],
                elapsed=_since(started),
            )
            raise
        report("llm_exit", cid=cid, attempt=attempt, how="ok", elapsed=_since(started))
        return SummaryResult(
            text=f"Handoff of {cid} written by {child.name} on attempt {attempt}.",
            model="fake-llm-1",
        )


def _since(started: float) -> float:
    return time.monotonic() - started


def _install_wrappers(child: Child) -> None:
    """Wrap the store and backend methods the crash points sit in (this process only)."""
    claim_due = EpisodicStore.claim_due
    load_context_and_tail = EpisodicStore.load_context_and_tail
    write_boundary = EpisodicStore.write_boundary
    end_attempt = EpisodicStore.end_attempt
    backend_write_boundary = PostgresBackend.write_boundary

    async def claim_due_wrapper(self: EpisodicStore, *args: Any, **kwargs: Any) -> Any:
        claims = await claim_due(self, *args, **kwargs)
        for claim in claims:
            cid = str(claim.conversation_id)
            child.jobs[cid] = child.next_job
            child.claims[cid] = claim
            child.next_job += 1
            report(
                "claimed",
                cid=cid,
                attempt=claim.attempt,
                job=child.jobs[cid],
                claimed_at=claim.claimed_at.isoformat(),
                lease_expires_at=claim.lease_expires_at.isoformat(),
            )
        for claim in claims:
            await child.checkpoint("after_claim", str(claim.conversation_id))
        return claims

    async def load_wrapper(self: EpisodicStore, conversation_id: Any, *a: Any, **kw: Any) -> Any:
        CURRENT.set(str(conversation_id))
        return await load_context_and_tail(self, conversation_id, *a, **kw)

    async def write_wrapper(self: EpisodicStore, conversation_id: Any, *a: Any, **kw: Any) -> Any:
        cid = str(conversation_id)
        await child.checkpoint("after_llm", cid)
        try:
            event = await write_boundary(self, conversation_id, *a, **kw)
        except Exception as exc:
            report("write_error", cid=cid, error=type(exc).__name__, detail=str(exc)[:200])
            raise
        report("written", cid=cid, seq=event.seq, covers=event.covers_through_seq)
        await child.checkpoint("after_write", cid)
        return event

    async def end_wrapper(self: EpisodicStore, claim: Any, end: Any, attempt: Any) -> Any:
        outcome = await end_attempt(self, claim, end, attempt)
        fields: dict[str, Any] = {
            "cid": str(claim.conversation_id),
            "attempt": claim.attempt,
            "requested": attempt.outcome,
            "recorded": outcome,
            "retry_in": end.retry_in,
            "dead": end.dead,
            "clear_due": end.clear_due,
            "error": (attempt.error or "")[:200],
        }
        if child.probe is not None:
            # next_attempt_at and the ledger's finished_at are both now() of END_ATTEMPT's
            # transaction: their difference is the delay the database scheduled. Nobody can
            # claim the conversation before next_attempt_at, so the head is still ours to read.
            row = await child.probe.fetchrow(
                "SELECT h.next_attempt_at, h.dead_since, a.finished_at "
                "FROM episodic_conversations h JOIN episodic_compaction_attempts a "
                "ON a.conversation_id = h.conversation_id AND a.attempt_id = $2 "
                "WHERE h.conversation_id = $1",
                claim.conversation_id,
                attempt.attempt_id,
            )
            if row is not None and row["next_attempt_at"] is not None:
                delay = row["next_attempt_at"] - row["finished_at"]
                fields["db_delay"] = delay.total_seconds()
                fields["next_attempt_at"] = row["next_attempt_at"].isoformat()
            fields["dead_since"] = row["dead_since"] if row is not None else None
        report("ended", **fields)
        return outcome

    async def backend_write_wrapper(self: PostgresBackend, *args: Any, **kwargs: Any) -> Any:
        cid = str(args[0] if args else kwargs.get("conversation_id"))
        if not child.is_target("during_write", cid):
            return await backend_write_boundary(self, *args, **kwargs)
        assert child.pause is not None
        if child.pause.get("variant") == "in_flight":
            return await _in_flight_write(child, backend_write_boundary, self, cid, args, kwargs)

        def pausing(plan: Callable[..., Any]) -> Callable[..., Any]:
            def planned(*a: Any, **kw: Any) -> Any:
                result = plan(*a, **kw)
                report("paused", point="during_write", variant="planned", cid=cid)
                while True:  # the event loop stays blocked: nothing is sent until SIGKILL
                    time.sleep(3600)
                return result

            return planned

        def paused(value: Any) -> Any:
            if isinstance(value, BoundaryPlanner):
                return dataclasses.replace(value, plan=pausing(value.plan))
            return value

        args = tuple(paused(a) for a in args)
        kwargs = {k: paused(v) for k, v in kwargs.items()}
        return await backend_write_boundary(self, *args, **kwargs)

    EpisodicStore.claim_due = claim_due_wrapper  # type: ignore[method-assign]
    EpisodicStore.load_context_and_tail = load_wrapper  # type: ignore[method-assign]
    EpisodicStore.write_boundary = write_wrapper  # type: ignore[method-assign]
    EpisodicStore.end_attempt = end_wrapper  # type: ignore[method-assign]
    PostgresBackend.write_boundary = backend_write_wrapper  # type: ignore[method-assign]


async def _in_flight_write(
    child: Child,
    original: Callable[..., Any],
    backend: PostgresBackend,
    cid: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Hold the head's row lock from a second connection, send the write, and report the
    pause once pg_stat_activity shows the write statement waiting on that lock."""
    dsn = plain_dsn(child.spec["url"])
    locker = await asyncpg.connect(dsn, server_settings={"application_name": "locker"})
    watcher = await asyncpg.connect(dsn, server_settings={"application_name": "watcher"})
    waiting_on_lock = (
        WAITING_ON_LOCK_CITUS if await watcher.fetchval(CITUS_INSTALLED) else WAITING_ON_LOCK
    )
    transaction = locker.transaction()
    await transaction.start()
    await locker.execute(
        "SELECT 1 FROM episodic_conversations WHERE conversation_id = $1 FOR UPDATE", UUID(cid)
    )
    write = asyncio.ensure_future(original(backend, *args, **kwargs))
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not write.done():
        # Whatever form the write takes (a CTE, a function call), it is the only statement
        # of this child that can wait on the head's row lock.
        waiting = await watcher.fetchrow(waiting_on_lock, child.name)
        if waiting is not None:
            report(
                "paused",
                point="during_write",
                variant="in_flight",
                cid=cid,
                backend_pid=waiting["pid"],
            )
            await asyncio.Event().wait()  # until SIGKILL
        await asyncio.sleep(0.005)
    report("pause_failed", point="during_write", variant="in_flight", cid=cid)
    await transaction.rollback()
    return await write


async def child_main(spec: dict[str, Any]) -> None:
    global _CHILD
    child = _CHILD = Child(spec)
    _install_wrappers(child)
    store = await EpisodicStore.open(
        with_application_name(spec["url"], child.name), settings=EpisodicSettings(_env_file=None)
    )
    if spec.get("probe"):
        child.probe = await asyncpg.connect(
            plain_dsn(spec["url"]), server_settings={"application_name": f"{child.name}-probe"}
        )
    options = CompactionOptions(
        summarizer_timeout=float(spec.get("summarizer_timeout", 30.0)),
        max_attempts=int(spec.get("max_attempts", 5)),
        backoff_base=float(spec.get("backoff_base", 0.1)),
        backoff_max=float(spec.get("backoff_max", 1.0)),
    )
    worker = CompactionWorker(
        store,
        FakeSummarizer(child),
        concurrency=int(spec.get("concurrency", 1)),
        options=options,
        lease_seconds=float(spec["lease"]),
        poll_interval=float(spec.get("poll", 0.1)),
        sweep_interval=3600.0,
        shutdown_grace=0.5,
        worker_id=child.name,
    )
    report("ready")
    await worker.run()


def _run_child(spec: dict[str, Any]) -> None:
    """In a freshly forked child of the zygote: never returns."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # stdin is the zygote's spec pipe: not ours to read
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        random.seed()  # (Python reseeds after fork too; explicit, for the backoff jitter)
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format=f"%(asctime)s {spec['name']}[{os.getpid()}] %(levelname)s %(message)s",
        )
        asyncio.run(child_main(spec))
        code = 0
    except BaseException as exc:
        traceback.print_exc()
        with contextlib.suppress(Exception):
            report("crashed", error=f"{type(exc).__name__}: {exc}"[:300])
    finally:
        sys.stderr.flush()
        os._exit(code)


def zygote() -> None:
    """Read spec lines on stdin; fork a worker child for each."""
    global _REPORT_FD
    _REPORT_FD = os.dup(1)
    os.dup2(2, 1)  # stray prints go to the log, never into the report stream
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped as they die
    report("zygote_ready")
    while line := sys.stdin.readline():
        spec = json.loads(line)
        if os.fork() == 0:
            _run_child(spec)


# ==== parent side =============================================================================


class Fleet:
    """The zygote and the children it forked, with every report they sent."""

    def __init__(self, url: str, directory: Path) -> None:
        self.url = url
        self.log_path = directory / "workers.log"
        self.events: list[dict[str, Any]] = []
        self.pids: dict[str, int] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPISODIC_")}
        env["PYTHONPATH"] = str(REPO)
        env["PYTHONUNBUFFERED"] = "1"
        with self.log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.reliability.worker_child",
                "--zygote",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                cwd=REPO,
                env=env,
                start_new_session=True,  # a Ctrl-C to pytest does not reach the workers
            )
        self._reader = asyncio.create_task(self._read())
        await self.wait_for(lambda e: e["ev"] == "zygote_ready", within=30, what="the zygote")

    async def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        while line := await self._process.stdout.readline():
            self.events.append(json.loads(line))
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "--- worker log tail ---\n" + "\n".join(text.splitlines()[-lines:])

    async def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        *,
        within: float,
        what: str,
        start: int = 0,
    ) -> dict[str, Any]:
        """The first report from index ``start`` on that satisfies ``predicate``."""
        deadline = time.monotonic() + within
        index = start
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if predicate(event):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                crashed = [e for e in self.events if e["ev"] in ("crashed", "pause_failed")]
                raise AssertionError(
                    f"timed out after {within:g} s waiting for {what}; "
                    f"problems: {crashed}\n{self.log_tail()}"
                )
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout=remaining)

    async def spawn(self, spec: dict[str, Any]) -> int:
        """Fork a child for ``spec`` (``url`` filled in) and wait until it runs; its pid."""
        assert self._process is not None
        assert self._process.stdin is not None
        name = spec["name"]
        assert name not in self.pids, f"child names must be unique: {name}"
        mark = len(self.events)
        self._process.stdin.write((json.dumps({"url": self.url, **spec}) + "\n").encode())
        await self._process.stdin.drain()
        event = await self.wait_for(
            lambda e: e["name"] == name and e["ev"] in ("ready", "crashed"),
            within=30,
            what=f"child {name} to start",
            start=mark,
        )
        self.pids[name] = event["pid"]
        assert event["ev"] == "ready", f"child {name} crashed: {event}\n{self.log_tail()}"
        return int(event["pid"])

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.pids[name], sig)

    async def kill(self, name: str, within: float = 5.0) -> None:
        """SIGKILL a child and wait until it is gone (the zygote reaps it)."""
        pid = self.pids[name]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + within
        while self._is_our_child(pid):
            assert time.monotonic() < deadline, f"child {name} ({pid}) survived SIGKILL"
            await asyncio.sleep(0.002)

    def _is_our_child(self, pid: int) -> bool:
        assert self._process is not None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        fields = stat.rsplit(")", 1)[1].split()
        return fields[0] != "Z" and int(fields[1]) == self._process.pid

    @staticmethod
    def report_of(name: str, *evs: str, cid: str | None = None) -> Callable[[dict[str, Any]], bool]:
        """A predicate for :meth:`wait_for`: a report of child ``name`` of one of ``evs``
        (about ``cid`` when given)."""

        def matches(event: dict[str, Any]) -> bool:
            return (
                event["name"] == name
                and event["ev"] in evs
                and (cid is None or event.get("cid") == cid)
            )

        return matches

    def of(self, name: str, *evs: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["name"] == name and (not evs or e["ev"] in evs)]

    def named(self, *evs: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] in evs]

    async def close(self) -> None:
        for pid in self.pids.values():
            if self._process is not None and self._is_our_child(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        process = self._process
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), timeout=5)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


@contextlib.asynccontextmanager
async def fleet(url: str, directory: Path) -> AsyncIterator[Fleet]:
    """A started :class:`Fleet`; every child and the zygote are killed on the way out."""
    started = Fleet(url, directory)
    try:
        await started.start()
        yield started
    finally:
        await started.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        sys.exit("usage: python -m tests.reliability.worker_child --zygote")
