"""T17: a rolling upgrade. The previous release keeps working while ``episodic migrate`` brings
the schema to head, and then beside the new release.

The previous release is the commit before the newest migration was added (the newest version
whose schema is one migration behind), taken from this checkout's git history
(``git archive``) into a virtual environment of its own: its ``episodic`` first on the path,
this environment's packages for its dependencies. The test checks that its schema head really
is older.

1. The previous release migrates an empty database to its head, and starts a compaction
   worker (``episodic worker``, extractive summarizer) and a writer (tests/reliability/
   upgrade_child.py: keyed appends of finished turns to 4 conversations, a ``load_context``
   after each, compaction due every 2 turns).
2. While they run, this release's ``episodic migrate`` upgrades the schema to head.
3. They go on on the new schema; then this release's worker and writer start beside them, on
   the same conversations.
4. Everything stops (the workers by SIGTERM); each release reads every event and the context
   of every conversation.

Pass criteria: 0 errors in either release's writer (appends and loads) and 0 warnings, errors
or tracebacks in either worker's log; every acknowledged append stored exactly once; both
workers wrote boundaries after the migration, and both writers loaded contexts that began at
a boundary; both releases read the same events and the same contexts, so each reads the
boundaries the other wrote.

This is the guard of the rule in ARCHITECTURE.md ("Changing the database"): a migration never
breaks the release before it (expand; deploy; contract in a later release).

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
     .venv/bin/pytest tests/reliability/test_t17_rolling_upgrade.py -q -s
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
import venv
from collections import Counter
from pathlib import Path
from typing import IO, Any

import asyncpg
import pytest

from episodic.store.migrate import HEAD_REVISION
from tests.reliability.sizes import size
from tests.support import asyncpg_dsn

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("upgrade_child.py")
CLI = "from episodic.cli import main; main()"
#: seconds of each phase: the previous release alone, on the new schema, beside the new one
PHASE = size(3, 30)


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"T17 needs this checkout's git history: git {' '.join(args)}: "
                    f"{done.stderr.strip()}")  # fmt: skip
    return done.stdout.strip()


def previous_release() -> str:
    """The parent of the commit that added the newest migration."""
    newest = _git("log", "-1", "--format=%H", "--diff-filter=A", "--", "migrations/versions")
    if not newest or _git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("T17 needs this checkout's whole git history (a shallow clone has not)")
    return _git("rev-parse", f"{newest}^")


@pytest.fixture(scope="module")
def previous_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a virtual environment holding the previous release."""
    revision = previous_release()
    root = tmp_path_factory.mktemp("previous-release")
    source = root / "source"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "episodic_previous_release.pth").write_text(f"{source}\n{ours}\n")
    head = subprocess.run(
        [str(python), "-c", "from episodic.store.migrate import HEAD_REVISION as h; print(h)"],
        capture_output=True, text=True, check=True, cwd=root,
    ).stdout.strip()  # fmt: skip
    assert head != HEAD_REVISION, f"the previous release ({revision[:8]}) is at head {head}"
    print(f"\nT17: previous release {revision[:8]} (schema {head}), this one {HEAD_REVISION}")
    return python


class Process:
    """A child whose stdout and stderr go to files (never a pipe that could fill)."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.out_path = logs / f"{name}.out"
        self.err_path = logs / f"{name}.err"
        self._out: IO[bytes] = self.out_path.open("wb")
        self._err: IO[bytes] = self.err_path.open("wb")
        self.popen = subprocess.Popen(
            command, env=env, stdout=self._out, stderr=self._err, cwd=logs
        )

    def line(self, number: int, within: float = 60.0) -> str:
        """Line ``number`` (from 0) of what it printed, once it has been printed."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            lines = self.out_path.read_text().splitlines()
            if len(lines) > number:
                return lines[number]
            assert self.popen.poll() is None, f"{self.name} exited: {self.err_path.read_text()}"
            time.sleep(0.05)
        raise AssertionError(f"{self.name} printed no line {number} in {within:g} s")

    def wait(self, within: float = 60.0) -> str:
        try:
            self.popen.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"{self.name} did not stop within {within:g} s") from None
        finally:
            self._out.close()
            self._err.close()
        return self.out_path.read_text()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._out.close()
        self._err.close()


def _env(url: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("EPISODIC_")}
    env.pop("PYTHONPATH", None)
    return env | {
        "EPISODIC_DATABASE_URL": url,
        "EPISODIC_TRIGGER_UNFINISHED_TURNS": "2",
        "EPISODIC_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }


def _worker_trouble(log: str) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if any(word in line for word in ("WARNING", "ERROR", "Traceback", "CRITICAL"))
    ]


async def _boundaries_by_worker(url: str, since: float) -> Counter[str]:
    """Succeeded attempts (each wrote a boundary) finished after ``since`` (epoch seconds),
    by the worker's pid."""
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT worker, count(*) AS n FROM episodic_compaction_attempts "
            "WHERE outcome = 'succeeded' AND finished_at > to_timestamp($1) GROUP BY worker",
            since,
        )
    finally:
        await connection.close()
    # A worker's id is host:pid:suffix.
    return Counter({row["worker"].split(":")[1]: row["n"] for row in rows})


async def _cli(python: str, *args: str, env: dict[str, str], cwd: Path) -> Any:
    return await asyncio.to_thread(
        subprocess.run, [python, "-c", CLI, *args], env=env, capture_output=True, text=True,
        cwd=cwd, check=False,
    )  # fmt: skip


def _read_if_it_starts(python: Path, url: str, convs: list[str], logs: Path) -> Any:
    """What a new process of ``python``'s release reads; None when the release predates
    ``runs_on`` and so refuses a schema newer than its own."""
    knows = subprocess.run(
        [str(python), "-c", "from episodic.store.migrate import runs_on"],
        capture_output=True, cwd=logs, check=False,
    )  # fmt: skip
    done = subprocess.run(
        [str(python), str(CHILD), "read", url, *convs],
        env=_env(url), capture_output=True, text=True, cwd=logs, check=False,
    )  # fmt: skip
    if knows.returncode != 0:
        assert "SchemaNotMigratedError" in done.stderr, done.stderr[-2000:]
        return None
    assert done.returncode == 0, f"a new process could not read: {done.stderr[-2000:]}"
    return json.loads(done.stdout.splitlines()[-1])


async def test_t17_the_previous_release_runs_through_the_migration_and_beside_the_new(
    previous_python: Path, empty_postgres_url: str, tmp_path: Path
) -> None:
    url = empty_postgres_url
    env = _env(url)
    old, new = str(previous_python), sys.executable
    migrated = await _cli(old, "migrate", env=env, cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    stop_old, stop_new = tmp_path / "stop-old", tmp_path / "stop-new"
    processes: list[Process] = []
    try:
        old_worker = Process("old-worker", [old, "-c", CLI, "worker"], env, tmp_path)
        old_writer = Process(
            "old-writer", [old, str(CHILD), "write", url, "old", str(stop_old)], env, tmp_path
        )
        processes += [old_worker, old_writer]
        convs: list[str] = json.loads(old_writer.line(0))
        await asyncio.sleep(PHASE)

        upgraded = await _cli(new, "migrate", env=env, cwd=tmp_path)
        assert upgraded.returncode == 0, upgraded.stderr
        migrated_at = time.time()
        await asyncio.sleep(PHASE)

        new_worker = Process("new-worker", [new, "-c", CLI, "worker"], env, tmp_path)
        new_writer = Process(
            "new-writer", [new, str(CHILD), "write", url, "new", str(stop_new), *convs],
            env, tmp_path,
        )  # fmt: skip
        processes += [new_worker, new_writer]
        await asyncio.sleep(PHASE)

        stop_old.touch()
        stop_new.touch()
        writes = {
            "old-writer": json.loads(old_writer.line(1)),
            "new-writer": json.loads(new_writer.line(0)),
        }
        await asyncio.sleep(1)  # the workers finish what the last appends made due
        for worker in (old_worker, new_worker):
            worker.stop()
        logs = {w.name: (w.wait(), w.err_path.read_text())[1] for w in (old_worker, new_worker)}
        # Each writer process reads the log it wrote through (the previous release's was
        # started before the migration).
        for stop in (stop_old, stop_new):
            stop.with_name(stop.name + ".read").touch()
        reads = {
            "old": json.loads(old_writer.wait().splitlines()[-1]),
            "new": json.loads(new_writer.wait().splitlines()[-1]),
        }
    finally:
        for process in processes:
            process.kill()
    # A process of the previous release started now, after the migration: releases from this
    # one on run on a schema one migration ahead (migrate.runs_on); older ones refuse to start.
    fresh = _read_if_it_starts(previous_python, url, convs, tmp_path)
    stored = Counter(
        event[2].removesuffix(" question")
        for conv in convs
        for event in reads["new"][conv]["events"]
        if event[1] == "message" and event[2].endswith(" question")
    )
    acked = [tag for result in writes.values() for _, tag in result["acked"]]
    boundaries = await _boundaries_by_worker(url, migrated_at)
    by_release = {
        "old": boundaries[str(old_worker.popen.pid)],
        "new": boundaries[str(new_worker.popen.pid)],
    }
    figures = (
        f"T17: {len(writes['old-writer']['acked'])} appends by the previous release (through "
        f"`episodic migrate` to {HEAD_REVISION} and beside this one), "
        f"{len(writes['new-writer']['acked'])} by this one; "
        f"{sum(len(r['errors']) for r in writes.values())} writer errors, "
        f"{sum(len(_worker_trouble(log)) for log in logs.values())} worker warnings; "
        f"{sum(1 for tag in acked if stored[tag] != 1)} lost or doubled; boundaries after the "
        f"migration by the previous worker {by_release['old']}, by this one "
        f"{by_release['new']}; loads from a boundary: previous "
        f"{writes['old-writer']['from_boundary']}/{writes['old-writer']['loads']}, this "
        f"{writes['new-writer']['from_boundary']}/{writes['new-writer']['loads']}; a "
        f"previous-release process started after the migration "
        f"{'read the same' if fresh is not None else 'refused (it predates migrate.runs_on)'}"
    )
    print(figures)

    for name, result in writes.items():
        assert result["errors"] == [], f"{name}: {result['errors'][:5]}"
        assert result["acked"], f"{name} acknowledged nothing"
        assert result["from_boundary"] > 0, f"{name} never loaded a context from a boundary"
    for name, log in logs.items():
        assert _worker_trouble(log) == [], f"{name}: {_worker_trouble(log)[:5]}"
    assert [tag for tag in acked if stored[tag] != 1] == [], figures
    assert set(stored) == set(acked), f"stored but never acknowledged: {set(stored) - set(acked)}"
    assert by_release["old"] > 0, figures
    assert by_release["new"] > 0, figures
    assert reads["old"] == reads["new"], "the two releases read the log differently"
    if fresh is not None:
        assert fresh == reads["new"], "a previous-release process started late reads otherwise"
