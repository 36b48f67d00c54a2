"""The servers ``python -m bench --http`` measures, each a subprocess as a person runs it:
``episodic serve`` and the minimal server (``bench/minimal_server.py``), on a free port of
127.0.0.1, in their own session, always stopped with SIGTERM (SIGKILL to the whole session
if they have not exited in STOP_TIMEOUT_S), their output kept in a temporary file."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from bench import minimal_server
from bench.run import log

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
#: how long the rest of a stopped server's session may take to follow it
LINGER_S = 5.0
#: where ``python -m bench.minimal_server`` is imported from (the repository's root)
ROOT = Path(__file__).resolve().parent.parent


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


@functools.cache
def serve_has_workers() -> bool:
    """Whether this ``episodic serve`` takes ``--workers`` (issue 35 adds it)."""
    try:
        shown = subprocess.run(
            [*_episodic_command(), "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("EPISODIC_")},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--workers" in shown.stdout


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


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPISODIC_", "BENCH_"))}
    env.update(extra)
    return env


@contextmanager
def _running(argv: list[str], env: dict[str, str], command: str, port: int) -> Iterator[Server]:
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
        server = Server(f"http://127.0.0.1:{port}", command, output)
        try:
            log(f"started `{server.command}` (pid {process.pid})")
            _wait_ready(process, server)
            yield server
        finally:
            _stop(process, server)
            server.lines = server.log_lines()


@contextmanager
def serving(url: str, workers: int = 1) -> Iterator[Server]:
    """``episodic serve --port <free>`` on ``url`` (with ``--workers N`` when ``workers`` is
    above 1), the library's default settings, until the block ends."""
    port = _free_port()
    flags = ["--port", str(port)] + (["--workers", str(workers)] if workers > 1 else [])
    argv = [*_episodic_command(), "serve", *flags]
    env = _environment(EPISODIC_DATABASE_URL=url)
    with _running(argv, env, f"episodic serve {' '.join(flags)}", port) as server:
        yield server


@contextmanager
def serving_minimal(url: str, token: str, workers: int = 1) -> Iterator[Server]:
    """``python -m bench.minimal_server --port <free> --workers N`` on ``url``, taking
    ``token`` as its bearer token, until the block ends."""
    port = _free_port()
    flags = ["--port", str(port), "--workers", str(workers)]
    argv = [sys.executable, "-m", "bench.minimal_server", *flags]
    env = _environment(
        **{minimal_server.DATABASE_URL_ENV: url, minimal_server.TOKEN_ENV: token},
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    with _running(argv, env, f"python -m bench.minimal_server {' '.join(flags)}", port) as server:
        yield server


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
    """SIGTERM, wait, SIGKILL to its session (its worker processes too) if need be; Ctrl-C
    and SIGTERM ignored meanwhile."""
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
                    f"bench: `{server.command}` did not stop in {STOP_TIMEOUT_S:g} s: SIGKILL",
                    file=sys.stderr,
                )
                # the session is the server's own (start_new_session): its pid is its id
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        _reap_session(process.pid, server)
        log(f"stopped `{server.command}` (exit status {process.returncode})")
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def _reap_session(session: int, server: Server) -> None:
    """Wait a little for the rest of the server's session (uvicorn's workers, the
    multiprocessing resource tracker) to exit after it, then SIGKILL what is left."""
    deadline = time.monotonic() + LINGER_S
    while True:
        try:
            os.killpg(session, 0)  # the session's process group: its id is the server's pid
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print(f"bench: `{server.command}` left processes behind: SIGKILL", file=sys.stderr)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session, signal.SIGKILL)


class ServerFailed(Exception):
    def __init__(self, message: str, server: Server) -> None:
        tail = "\n".join(server.log_lines()[-30:])
        super().__init__(f"{server.command}: {message}; its last output:\n{tail}")


__all__ = ["Server", "ServerFailed", "serve_has_workers", "serving", "serving_minimal"]
