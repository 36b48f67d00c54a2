"""Helpers for the soak (T19, tests/reliability/test_t19_soak.py): a process's footprint read
from /proc, the flatness verdict over a run's samples, the processes under test, and a slow
scripted summarizer that keeps no record of what it was asked.

A process's PostgreSQL connections are counted from the kernel, not from the database: its
socket inodes (``/proc/PID/fd``) matched against the TCP table (``/proc/PID/net/tcp`` and
``tcp6``) for sockets whose remote port is the database's. No cooperation of the process is
needed (episodic sets no ``application_name``), and a socket the process leaked after the
server closed it (CLOSE_WAIT) still counts, as it should.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.integration.worker_processes import EpisodicProcess, start_episodic
from tests.support_openai import FakeOpenAIServer, Reply

__all__ = [
    "Footprint",
    "Growth",
    "Pace",
    "ScriptedSummarizer",
    "footprint",
    "growth",
    "pace",
    "start_child",
]


# ---- one process's footprint ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Footprint:
    """What one process holds at one instant."""

    #: resident set size, KiB (VmRSS)
    rss_kib: int
    #: open file descriptors (sockets, files, pipes, epoll...)
    fds: int
    #: TCP connections to the database's port
    pg_connections: int


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def _fd_targets(pid: int) -> list[str]:
    directory = f"/proc/{pid}/fd"
    targets: list[str] = []
    for name in os.listdir(directory):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            targets.append(os.readlink(f"{directory}/{name}"))
    return targets


def _remote_port_inodes(pid: int, port: int) -> set[int]:
    """Inodes of the TCP sockets (IPv4 and IPv6) whose remote port is ``port``."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port:
                inodes.add(int(fields[9]))
    return inodes


def footprint(pid: int, pg_port: int) -> Footprint:
    """``pid``'s RSS, open descriptors and connections to PostgreSQL on ``pg_port``."""
    targets = _fd_targets(pid)
    sockets = {
        int(target[len("socket:[") : -1]) for target in targets if target.startswith("socket:[")
    }
    connections = len(sockets & _remote_port_inodes(pid, pg_port))
    return Footprint(rss_kib=_rss_kib(pid), fds=len(targets), pg_connections=connections)


# ---- flatness ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Growth:
    """One figure after the warm-up: the largest value of the last third of the run (``late``)
    against the largest of the middle third (``settled``). ``allowed``: the growth allowed
    (None: not judged, the figure having only a ``ceiling``); ``ceiling``: a bound no sample
    after the warm-up may pass (None: none)."""

    what: str
    settled: float
    late: float
    allowed: float | None
    ceiling: float | None = None
    #: the largest value after the warm-up
    peak: float = 0.0
    unit: str = ""

    @property
    def grew(self) -> float:
        return self.late - self.settled

    @property
    def ok(self) -> bool:
        within = self.ceiling is None or self.peak <= self.ceiling
        return within and (self.allowed is None or self.grew <= self.allowed)

    def describe(self) -> str:
        rules = []
        if self.allowed is not None:
            rules.append(f"allowed {self.allowed:g}{self.unit}")
        if self.ceiling is not None:
            rules.append(f"ceiling {self.ceiling:g}{self.unit}")
        return (
            f"{self.what}: middle-third max {self.settled:g}{self.unit}, last-third max "
            f"{self.late:g}{self.unit} (grew {self.grew:+g}{self.unit}, peak after warm-up "
            f"{self.peak:g}{self.unit}; {', '.join(rules)})"
        )


def thirds(values: Sequence[float]) -> tuple[list[float], list[float], list[float]]:
    """``values`` (one per sample, in time order) cut into the warm-up, middle and last
    thirds."""
    n = len(values)
    if n < 6:
        raise AssertionError(f"{n} samples: too few to tell a trend")
    first, second = n // 3, 2 * n // 3
    return list(values[:first]), list(values[first:second]), list(values[second:])


def growth(
    what: str,
    values: Sequence[float],
    *,
    allowed: float | None,
    ceiling: float | None = None,
    unit: str = "",
) -> Growth:
    """The :class:`Growth` of ``values`` (in time order)."""
    _, middle, last = thirds(values)
    return Growth(
        what=what,
        settled=max(middle),
        late=max(last),
        allowed=allowed,
        ceiling=ceiling,
        peak=max(middle + last),
        unit=unit,
    )


@dataclass(frozen=True, slots=True)
class Pace:
    """Work done (a running count, e.g. appends acknowledged) in the middle and the last
    third of the run: the last third must keep up at least ``kept`` of the middle's pace (a
    process slowing down as it runs is as much a leak as one growing)."""

    what: str
    middle: int
    last: int
    kept: float

    @property
    def ok(self) -> bool:
        return self.last > 0 and self.last >= self.kept * self.middle

    def describe(self) -> str:
        return (
            f"{self.what}: {self.middle} in the middle third, {self.last} in the last "
            f"(at least {self.kept:.0%} of the middle's kept)"
        )


def pace(what: str, counts: Sequence[int], *, kept: float) -> Pace:
    """The :class:`Pace` of a running count sampled in time order."""
    n = len(counts)
    first, second = n // 3, 2 * n // 3
    return Pace(
        what=what,
        middle=counts[second] - counts[first],
        last=counts[-1] - counts[second],
        kept=kept,
    )


# ---- the processes under test -----------------------------------------------------------------


def start_child(
    name: str,
    arguments: Sequence[str],
    *,
    database_url: str,
    settings: Mapping[str, object],
    directory: Path,
) -> EpisodicProcess:
    """``episodic ARGUMENTS`` as a process of its own (``start_episodic``), logging to
    ``directory/NAME.log``."""
    process = start_episodic(
        name, arguments, database_url=database_url, settings=settings, directory=directory
    )
    return EpisodicProcess(name, process, directory / f"{name}.log")


def wait_healthy(child: EpisodicProcess, base_url: str, within: float = 30.0) -> None:
    """Wait for ``GET /healthz`` to answer 200."""
    deadline = time.monotonic() + within
    while True:
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if not child.alive():
            raise AssertionError(f"{child.name} exited early\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{child.name} did not start\n{child.log_tail()}")
        time.sleep(0.1)


def log_problems(text: str, *, ignore: Iterable[str] = ()) -> list[str]:
    """The lines of a process's log at ERROR or CRITICAL level, and tracebacks' first lines
    (``ignore``: substrings of lines that are not problems)."""
    skipped = tuple(ignore)
    found = []
    for line in text.splitlines():
        if (" ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")) and not (
            any(part in line for part in skipped)
        ):
            found.append(line)
    return found


def metric_values(exposition: str, name: str) -> dict[str, float]:
    """The samples of counter ``name`` in a Prometheus text exposition, by label set (the
    text between the braces; empty without labels)."""
    values: dict[str, float] = {}
    for line in exposition.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, labels = head.partition("{")
        if metric != name:
            continue
        values[labels.rstrip("}")] = float(value)
    return values


# ---- the slow scripted summarizer -------------------------------------------------------------


class ScriptedSummarizer(FakeOpenAIServer):
    """The fake OpenAI server answering every request with ``reply`` (after its delay), and
    counting requests instead of keeping them: a soak sends thousands."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(default=reply)
        self.calls = 0

    def _next_reply(self) -> Reply:
        # called once per request, right after it is recorded: forget it
        self.calls += 1
        self.requests.clear()
        return super()._next_reply()


def mib(kib: float) -> float:
    return round(kib / 1024, 1)
