"""Helpers for tests that run real ``episodic worker`` processes against PostgreSQL.

Workers are the installed console script, started with ``subprocess.Popen`` (the test's event
loop stays free to serve the fake OpenAI server while they run), logging to a file each, with
an environment holding no ``EPISODIC_*`` variable but the ones the test sets. Every wait is
bounded; :class:`WorkerProcesses` kills whatever it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from episodic import EpisodicStore, Message
from tests.support import FILE_LISTING, asyncpg_dsn
from tests.support_openai import FakeOpenAIServer, Reply

__all__ = [
    "EPISODIC",
    "EpisodicProcess",
    "TimedOpenAIServer",
    "WorkerProcess",
    "WorkerProcesses",
    "asyncpg_dsn",
    "boundaries_of",
    "create_due_conversation",
    "message_rows",
    "start_episodic",
    "wait_until",
    "worker_environment",
]

EPISODIC = Path(sys.executable).parent / "episodic"
STARTED = re.compile(r"worker (\S+) started")


def worker_environment(database_url: str, settings: Mapping[str, object]) -> dict[str, str]:
    """This process's environment without any ``EPISODIC_*`` variable, plus the database and
    ``settings`` (``lease_seconds=3`` becomes ``EPISODIC_LEASE_SECONDS=3``)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("EPISODIC_")}
    env["EPISODIC_DATABASE_URL"] = database_url
    env["PYTHONUNBUFFERED"] = "1"
    # The fake summarizer listens on 127.0.0.1: never send that through a proxy.
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    for name, value in settings.items():
        env[f"EPISODIC_{name.upper()}"] = str(value)
    return env


async def wait_until(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    within: float,
    what: str,
    interval: float = 0.05,
    describe: Callable[[], str] | None = None,
) -> float:
    """Poll ``condition`` (sync or async) until it holds; return the seconds it took. Fails
    with ``what`` (and ``describe()``, e.g. worker logs) after ``within`` seconds."""
    started = time.monotonic()
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > within:
            detail = f"\n{describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {within:g} s waiting for {what}{detail}")
        await asyncio.sleep(interval)


class EpisodicProcess:
    """An ``episodic`` subcommand running as a process of its own, and its log file."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return f"--- {self.name} (pid {self.pid}) log tail ---\n" + "\n".join(
            self.log().splitlines()[-lines:]
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def wait_exit(self, within: float) -> int:
        await wait_until(
            lambda: not self.alive(),
            within=within,
            what=f"{self.name} to exit",
            describe=self.log_tail,
        )
        code = self.process.returncode
        assert code is not None
        return code

    def stop(self, within: float) -> int | None:
        """SIGTERM, then the exit code (None: still running after ``within`` seconds, then
        killed)."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL (works on a stopped process too) and reap."""
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def start_episodic(
    name: str,
    arguments: Sequence[str],
    *,
    database_url: str,
    settings: Mapping[str, object],
    directory: Path,
) -> subprocess.Popen[bytes]:
    """``episodic ARGUMENTS`` with ``settings`` as its only ``EPISODIC_*`` variables (and the
    database), in ``directory`` (no .env file there), logging to ``directory/NAME.log``: a
    file, since a server logs a line per request, more than a pipe holds unread."""
    with (directory / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [str(EPISODIC), *arguments],
            env=worker_environment(database_url, settings),
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C to pytest does not reach it
        )


class WorkerProcess(EpisodicProcess):
    """One ``episodic worker`` process and its log file."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(name, process, log_path)
        self.worker_id: str | None = None

    async def wait_started(self, within: float = 20.0) -> str:
        """Wait for the "worker ... started" line; return the worker id it names (the value
        of the attempts ledger's ``worker`` column)."""

        def started() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited early\n{self.log_tail()}")
            return STARTED.search(self.log()) is not None

        await wait_until(
            started, within=within, what=f"{self.name} to start", describe=self.log_tail
        )
        match = STARTED.search(self.log())
        assert match is not None
        self.worker_id = match.group(1)
        return self.worker_id


class WorkerProcesses:
    """Starts worker processes for one database and kills all of them in :meth:`kill_all`."""

    def __init__(self, database_url: str, directory: Path) -> None:
        self.database_url = database_url
        self.directory = directory
        self.started: list[WorkerProcess] = []

    def start(self, name: str, **settings: object) -> WorkerProcess:
        process = start_episodic(
            name,
            ["worker"],
            database_url=self.database_url,
            settings=settings,
            directory=self.directory,
        )
        worker = WorkerProcess(name, process, self.directory / f"{name}.log")
        self.started.append(worker)
        return worker

    def logs(self) -> str:
        return "\n".join(worker.log_tail() for worker in self.started)

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


class TimedOpenAIServer(FakeOpenAIServer):
    """The fake OpenAI server, also noting when each request arrived and each answer was sent
    (``time.monotonic()``, the workers' clock too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: list[float] = []
        self.answers: list[float] = []

    def _next_reply(self) -> Reply:
        # Called once per request, right after it is recorded.
        self.arrivals.append(time.monotonic())
        return super()._next_reply()

    def _answering(self, reply: Reply) -> None:
        self.answers.append(time.monotonic())


async def create_due_conversation(store: EpisodicStore, label: str) -> UUID:
    """A conversation of two finished turns, due by the unfinished-turns rule when the store's
    trigger says ``trigger_unfinished_turns=2``."""
    conversation = await store.create_conversation()
    await store.append(
        conversation,
        [
            Message.user(f"{label}: please list the files"),
            Message.assistant(f"{label}: there are three files:\n{FILE_LISTING}"),
            Message.user(f"{label}: now summarise the largest one"),
            Message.assistant(f"{label}: it is a report about quarterly sales"),
        ],
    )
    return conversation


async def boundaries_of(conn: asyncpg.Connection, conversation: UUID) -> list[asyncpg.Record]:
    """The boundary events of ``conversation``: seq, covers_through_seq, summary, created_at."""
    return list(
        await conn.fetch(
            """
            SELECT seq, (payload::jsonb ->> 'covers_through_seq')::bigint AS covers_through_seq,
                   payload::jsonb ->> 'summary' AS summary, created_at
              FROM episodic_events
             WHERE conversation_id = $1 AND kind = 'boundary'
             ORDER BY seq
            """,
            conversation,
        )
    )


async def message_rows(conn: asyncpg.Connection, conversation: UUID) -> list[tuple[Any, ...]]:
    """Every non-boundary event row of ``conversation``, every column: the raw log."""
    rows = await conn.fetch(
        "SELECT * FROM episodic_events WHERE conversation_id = $1 AND kind <> 'boundary' "
        "ORDER BY seq",
        conversation,
    )
    return [tuple(row.values()) for row in rows]
