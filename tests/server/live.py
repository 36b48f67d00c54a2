"""``episodic serve`` as a person runs it, for the tests that need a real server: started on
a free port, waited for, stopped with SIGTERM, and required to exit 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.acceptance.test_cli import EPISODIC

STARTUP_SECONDS = 20


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Served:
    base: str
    #: where the server's output goes
    log: Path
    #: what the server printed, once it has stopped
    output: str = ""


@contextmanager
def serving(cwd: Path, env: dict[str, str], options: Sequence[str] = ()) -> Iterator[Served]:
    """A running ``episodic serve`` (with ``options``); on leaving, SIGTERM, then its exit
    code must be 0."""
    port = free_port()
    # a file, not a pipe: the server logs every request, more than a pipe holds unread
    log = cwd / "serve.log"
    with log.open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(
            [str(EPISODIC), "serve", "--port", str(port), *options],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            encoding="utf-8",
        )
    served = Served(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                if httpx.get(f"{served.base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log.read_text(encoding="utf-8")
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        served.output = log.read_text(encoding="utf-8")
    assert process.returncode == 0, served.output
