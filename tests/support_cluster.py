"""A private PostgreSQL cluster for tests that must own a server: crash it (T14), make it
check passwords (the shared test server trusts every local connection), or fail it over to a
streaming standby (T16).

``initdb`` into a temporary directory, run as the ``postgres`` OS user (PostgreSQL refuses to
run as root), on a free port of 127.0.0.1. Tests skip, saying why, where the server binaries or
the ``postgres`` user are missing (a laptop running PostgreSQL in Docker).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")
#: The bootstrap superuser's password in a cluster made with ``password=True``.
PASSWORD = "episodic-test-password"


def as_postgres(*command: str) -> subprocess.CompletedProcess[str]:
    prefix = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    return subprocess.run([*prefix, *command], check=True, capture_output=True, text=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    def __init__(
        self, root: Path, port: int, *, password: bool, settings: Sequence[str] = ()
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = port
        self.password = password
        #: more ``name=value`` server settings, given on the command line at every start
        self.settings = list(settings)

    def start(self) -> None:
        extra = "".join(f" -c {setting}" for setting in self.settings)
        as_postgres(
            str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c fsync=on "
            f"-c unix_socket_directories={self.data}{extra}",
            "start",
        )  # fmt: skip

    def sql(self, statement: str) -> str:
        """``statement``'s result as psql prints it unaligned (one value per line)."""
        done = as_postgres(
            str(BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            "-d", "postgres", "-X", "-At", "-c", statement,
        )  # fmt: skip
        return done.stdout.strip()

    def promote(self) -> None:
        """A standby becomes a primary (``pg_ctl promote``, waiting until it takes writes)."""
        as_postgres(str(BIN / "pg_ctl"), "-D", str(self.data), "-w", "promote")

    def crash(self) -> None:
        as_postgres(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def stop(self) -> None:
        prefix = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
        subprocess.run(
            [*prefix, str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"],
            capture_output=True,
            check=False,
        )

    def url(self, *, password: str | None = None) -> str:
        user = "postgres" if password is None else f"postgres:{password}"
        return f"postgresql+asyncpg://{user}@127.0.0.1:{self.port}/postgres"


@contextmanager
def private_cluster(*, password: bool = False) -> Iterator[Cluster]:
    """A running cluster, removed afterwards. ``password``: every connection must give
    :data:`PASSWORD` (scram-sha-256); otherwise local connections are trusted."""
    if not (BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL 15 server binaries in {BIN} to run a private cluster")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres OS user to run a private cluster as")
    root = Path(tempfile.mkdtemp(prefix="episodic-cluster-"))
    shutil.chown(root, "postgres")
    made = Cluster(root, free_port(), password=password)
    auth = ["-A", "trust"]
    if password:
        secret = root / "pwfile"
        secret.write_text(PASSWORD + "\n", encoding="utf-8")
        shutil.chown(secret, "postgres")
        auth = ["-A", "scram-sha-256", f"--pwfile={secret}"]
    as_postgres(str(BIN / "initdb"), "-D", str(made.data), "-U", "postgres", *auth)
    made.start()
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(check: str, cluster: Cluster, *, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while cluster.sql(check) != "t":
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {check!r} on port {cluster.port}")
        time.sleep(0.05)


@contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[tuple[Cluster, Cluster]]:
    """A primary and a hot standby streaming from it (``pg_basebackup -R``), both running,
    removed afterwards. ``synchronous``: the primary's commits wait until the standby has
    flushed them (``synchronous_standby_names='*'``, ``synchronous_commit=on``), set after the
    base backup so that the promoted standby does not wait for a standby of its own."""
    with private_cluster() as primary:
        standby = Cluster(primary.root / "standby", free_port(), password=False)
        standby.root.mkdir()
        shutil.chown(standby.root, "postgres")
        as_postgres(
            str(BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-D", str(standby.data), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        standby.start()
        try:
            _wait_for(
                "SELECT count(*) = 1 FROM pg_stat_replication WHERE state = 'streaming'", primary
            )
            if synchronous:
                primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
                primary.sql("SELECT pg_reload_conf()")
                _wait_for(
                    "SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'",
                    primary,
                )
            yield primary, standby
        finally:
            standby.stop()


__all__ = [
    "BIN",
    "PASSWORD",
    "Cluster",
    "as_postgres",
    "free_port",
    "private_cluster",
    "replicated_pair",
]
