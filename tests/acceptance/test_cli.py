"""The installed ``episodic`` console script, run as a subprocess against real databases."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import pytest

from episodic import BoundaryRequest, EpisodicStore, Message, StateChange, ToolCall
from episodic.store.attempts import AttemptEnd, AttemptRecord
from episodic.store.migrate import HEAD_REVISION
from tests.conftest import isolated_settings
from tests.support import FILE_LISTING

EPISODIC = Path(sys.executable).parent / "episodic"
HEADER = ["seq", "at", "kind", "tokens", "content"]


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without EPISODIC_* variables, wide enough that rich does
    not wrap, and UTF-8 output whatever the locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISODIC_")}
    env.update({"COLUMNS": "200", "PYTHONIOENCODING": "utf-8", **extra})
    return env


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    # cwd is a fresh directory so no ./.env or ./episodic.db leaks into (or out of) the run.
    done = subprocess.run(
        [str(EPISODIC), *args],
        cwd=cwd,
        env=clean_env() if env is None else env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


async def run_cli_async(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    return await asyncio.to_thread(run_cli, *args, cwd=cwd, env=env)


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of each row of the events table, header included."""
    rows = []
    for line in stdout.splitlines():
        if line[:1] in ("┃", "│"):  # rich draws the header with heavy bars
            bar = line[0]
            rows.append([cell.strip() for cell in line.strip().strip(bar).split(bar)])
    return rows


def test_console_script_is_installed() -> None:
    assert EPISODIC.is_file(), f"{EPISODIC} is missing: is the package installed in the venv?"


def test_a_bad_setting_is_named_not_a_traceback(tmp_path: Path) -> None:
    env = {**clean_env(), "EPISODIC_POOL_MAX_SIZE": "zero"}
    for command in (["status"], ["worker", "--once"]):
        result = run_cli(*command, cwd=tmp_path, env=env)
        assert result.code == 1, result.output
        assert "EPISODIC_POOL_MAX_SIZE" in result.stderr
        assert "Traceback" not in result.output


def test_help_lists_the_commands(tmp_path: Path) -> None:
    result = run_cli("--help", cwd=tmp_path)
    assert result.code == 0, result.output
    assert "migrate" in result.stdout
    assert "show" in result.stdout
    assert "append-only" in result.stdout


def test_show_help_names_the_environment_variable(tmp_path: Path) -> None:
    result = run_cli("show", "--help", cwd=tmp_path)
    assert result.code == 0, result.output
    assert "EPISODIC_DATABASE_URL" in result.stdout
    assert "--database-url" in result.stdout
    assert "--after-seq" in result.stdout


def test_migrate_creates_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    url = f"sqlite+aiosqlite:///{path}"

    first = run_cli("migrate", "--database-url", url, cwd=tmp_path)
    assert first.code == 0, first.output
    assert first.stdout.strip() == (
        f"created the episodic schema at revision {HEAD_REVISION} in {url}"
    )
    assert path.is_file()

    again = run_cli("migrate", "--database-url", url, cwd=tmp_path)
    assert again.code == 0, again.output
    assert again.stdout.strip() == (
        f"the episodic schema in {url} is up to date (revision {HEAD_REVISION})"
    )

    async def use() -> int:
        store = await EpisodicStore.open(url, settings=isolated_settings())
        try:
            cid = await store.create_conversation()
            events = await store.append(cid, [Message.user("hello")])
            return events[0].seq
        finally:
            await store.close()

    assert asyncio.run(use()) == 1


def test_show_before_migrate_says_to_migrate(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    result = run_cli("show", str(uuid.uuid4()), "--database-url", url, cwd=tmp_path)
    assert result.code == 1, result.output
    assert "episodic migrate" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "empty.db").exists(), "show created the database file"


# ---- show, on both backends ---------------------------------------------------------------


@dataclass(frozen=True)
class Populated:
    url: str
    conversation_id: UUID
    token_estimates: list[int]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty directory to run the CLI in (the sqlite fixture's file lives in tmp_path)."""
    path = tmp_path / "cwd"
    path.mkdir()
    return path


@pytest.fixture
async def populated(database_url: str) -> Populated:
    """A conversation with a user turn, a tool call and its result, an answer, and a completed
    run (seqs 1-5), written through the library."""
    store = await EpisodicStore.open(database_url, settings=isolated_settings())
    try:
        cid = await store.create_conversation(tenant_id="acme")
        written = await store.append(cid, [Message.user("Fix the failing test, s'il vous plaît")])
        written += await store.append(
            cid,
            [
                Message.assistant(
                    None, tool_calls=[ToolCall(id="c1", name="run", args={"cmd": "pytest"})]
                ),
                Message.tool_result("c1", "1 failed", name="run"),
            ],
        )
        written += await store.append(cid, [Message.assistant("Fixed it. 🎉")])
        completed = await store.mark_run_completed(cid)
    finally:
        await store.close()
    assert [e.seq for e in written] + [completed.seq] == [1, 2, 3, 4, 5]
    estimates = [e.token_estimate for e in written] + [completed.token_estimate]
    return Populated(database_url, cid, estimates)


async def test_migrate_is_idempotent_on_a_migrated_database(
    populated: Populated, workdir: Path
) -> None:
    result = await run_cli_async("migrate", "--database-url", populated.url, cwd=workdir)
    assert result.code == 0, result.output
    assert f"is up to date (revision {HEAD_REVISION})" in result.stdout


async def test_show_prints_head_and_events(populated: Populated, workdir: Path) -> None:
    cid = str(populated.conversation_id)
    result = await run_cli_async("show", cid, "--database-url", populated.url, cwd=workdir)
    assert result.code == 0, result.output

    head = result.stdout.splitlines()[0]
    assert head.startswith(cid)
    assert "tenant=acme" in head
    assert "last_seq=5" in head
    assert "user messages=1" in head
    assert "open tool calls=0" in head

    rows = table_rows(result.stdout)
    assert rows[0] == HEADER
    events = rows[1:]
    assert [row[0] for row in events] == ["1", "2", "3", "4", "5"]
    assert [row[2] for row in events] == ["user", "assistant", "tool", "assistant", "run_completed"]
    assert [int(row[3]) for row in events] == populated.token_estimates
    assert [row[4] for row in events] == [
        "Fix the failing test, s'il vous plaît",
        'calls run#c1({"cmd":"pytest"})',
        "result #c1 run ok: 1 failed",
        "Fixed it. 🎉",
        "run completed; abandoned calls: none",
    ]


async def test_show_prints_state_changes_and_the_tombstone(
    database_url: str, workdir: Path
) -> None:
    store = await EpisodicStore.open(database_url, settings=isolated_settings())
    try:
        cid = await store.create_conversation(state=StateChange(conversation={"lang": "fr"}))
        await store.append(
            cid,
            [Message.user("bonjour")],
            state=StateChange(shared={"app:weather": {"units": "C"}}),
        )
        await store.delete_conversation(cid)
    finally:
        await store.close()
    result = await run_cli_async("show", str(cid), "--database-url", database_url, cwd=workdir)
    assert result.code == 0, result.output
    events = table_rows(result.stdout)[1:]
    assert [(row[2], row[4]) for row in events] == [
        ("state", "state set: lang"),
        ("user", "bonjour"),
        ("state", "state set: app:weather/units"),
        ("deletion", "deleted: hidden and closed to writes; the log is kept"),
    ]


async def test_show_pages_and_cuts(populated: Populated, workdir: Path) -> None:
    result = await run_cli_async(
        "show",
        str(populated.conversation_id),
        "--database-url",
        populated.url,
        "--after-seq",
        "2",
        "--limit",
        "2",
        "--width",
        "6",
        cwd=workdir,
    )
    assert result.code == 0, result.output
    events = table_rows(result.stdout)[1:]
    # A cut is marked with an ellipsis, within the width asked for.
    assert [(row[0], row[4]) for row in events] == [("3", "resul…"), ("4", "Fixed…")]
    cid = populated.conversation_id
    assert result.stdout.splitlines()[-1] == (
        f"showing 2 events through seq 4 of 5; for the next ones: episodic show {cid} --after-seq 4"
    )


async def test_show_reads_the_url_from_the_environment(populated: Populated, workdir: Path) -> None:
    env = clean_env(EPISODIC_DATABASE_URL=populated.url)
    result = await run_cli_async("show", str(populated.conversation_id), cwd=workdir, env=env)
    assert result.code == 0, result.output
    assert [row[0] for row in table_rows(result.stdout)[1:]] == ["1", "2", "3", "4", "5"]
    assert not (workdir / "episodic.db").exists(), "the default database was opened instead"


async def test_show_as_a_tenant_sees_only_that_tenants_conversations(
    populated: Populated, workdir: Path
) -> None:
    cid = str(populated.conversation_id)
    own = await run_cli_async(
        "show", cid, "--tenant", "acme", "--database-url", populated.url, cwd=workdir
    )
    assert own.code == 0, own.output
    assert "tenant=acme" in own.stdout
    other = await run_cli_async(
        "show", cid, "--tenant", "globex", "--database-url", populated.url, cwd=workdir
    )
    assert other.code == 1, other.output
    assert "does not exist" in other.stderr


async def test_show_unknown_conversation(populated: Populated, workdir: Path) -> None:
    missing = str(uuid.uuid4())
    result = await run_cli_async("show", missing, "--database-url", populated.url, cwd=workdir)
    assert result.code == 1, result.output
    assert "does not exist" in result.stderr
    assert missing in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "complaint", "code"),
    [
        pytest.param(["not-a-uuid"], "must be a UUID", 1, id="not-a-uuid"),
        pytest.param(["{id}", "--limit", "0"], "Invalid value for '--limit'", 2, id="zero-limit"),
    ],
)
async def test_show_refuses_bad_input(
    populated: Populated, workdir: Path, args: list[str], complaint: str, code: int
) -> None:
    args = [a.format(id=populated.conversation_id) for a in args]
    result = await run_cli_async("show", *args, "--database-url", populated.url, cwd=workdir)
    assert result.code == code, result.output
    assert complaint in result.stderr
    assert "Traceback" not in result.output


async def test_show_context_prints_what_the_model_sees(populated: Populated, workdir: Path) -> None:
    store = await EpisodicStore.open(populated.url, settings=isolated_settings())
    try:
        await store.write_boundary(
            populated.conversation_id,
            BoundaryRequest(
                summary="HANDOFF: the test was fixed",
                covers_through_seq=4,
                retained=["Fix the failing test, s'il vous plaît"],
                reason="manual_recovery",
                expected_boundary_seq=None,
            ),
        )
        await store.append(populated.conversation_id, [Message.user("now the docs")])
        expected = await store.load_context(populated.conversation_id)
    finally:
        await store.close()
    cid = str(populated.conversation_id)
    result = await run_cli_async(
        "show", cid, "--context", "--database-url", populated.url, cwd=workdir
    )
    assert result.code == 0, result.output
    assert "boundary at seq 6 covers through seq 4 (reason manual_recovery" in result.stdout
    assert f"{len(expected.messages)} messages, ≈{expected.estimated_tokens:,} tokens" in (
        result.stdout
    )
    rows = table_rows(result.stdout)[1:]
    assert [row[1] for row in rows] == ["handoff", "retained", "7"]
    assert [row[4] for row in rows] == [
        "HANDOFF: the test was fixed",
        "Fix the failing test, s'il vous plaît",
        "now the docs",
    ]
    assert [int(row[3]) for row in rows] == [m.token_estimate for m in expected.messages]


async def test_worker_status_and_compact_commands(populated: Populated, workdir: Path) -> None:
    url = ["--database-url", populated.url]
    env = clean_env(EPISODIC_TRIGGER_UNFINISHED_TURNS="1")
    store = await EpisodicStore.open(populated.url, settings=isolated_settings())
    try:
        store.trigger = store.trigger.model_copy(update={"trigger_unfinished_turns": 1})
        await store.append(
            populated.conversation_id,
            [
                Message.user("and the docs, please"),
                Message.assistant(f"The docs:\n{FILE_LISTING}"),
                Message.assistant("Docs updated."),
            ],
        )
    finally:
        await store.close()

    status = await run_cli_async("status", *url, cwd=workdir, env=env)
    assert status.code == 0, status.output
    assert "due=1" in status.stdout

    once = await run_cli_async("worker", "--once", *url, cwd=workdir, env=env)
    assert once.code == 0, once.output
    assert "1 attempt: {'succeeded': 1}" in once.stdout

    status = await run_cli_async("status", *url, cwd=workdir, env=env)
    assert "due=0" in status.stdout
    assert "succeeded" in status.stdout

    forced = await run_cli_async(
        "compact", str(populated.conversation_id), *url, cwd=workdir, env=env
    )
    assert forced.code == 0, forced.output
    # nothing came after the boundary: there is nothing new for a handoff to say
    assert forced.stdout.startswith("nothing_to_compact")
    store = await EpisodicStore.open(populated.url, settings=isolated_settings())
    try:
        await store.append(
            populated.conversation_id,
            [
                Message.user("one more thing"),
                Message.assistant(f"The rest:\n{FILE_LISTING}"),
                Message.assistant("Done too."),
            ],
        )
    finally:
        await store.close()
    forced = await run_cli_async(
        "compact", str(populated.conversation_id), *url, cwd=workdir, env=env
    )
    assert forced.code == 0, forced.output
    assert forced.stdout.startswith("succeeded")
    unknown = await run_cli_async("compact", str(uuid.uuid4()), *url, cwd=workdir, env=env)
    assert unknown.code == 1
    assert "does not exist" in unknown.stderr


# ---- what an operator sees ------------------------------------------------------------------

#: A tool output that, printed raw, would retitle the terminal (OSC 0), ring the bell, clear
#: the screen and colour the rest red (CSI), and reverse the text after it (a bidi override).
HOSTILE = "done\x1b]0;pwned\x07\x1b[2J\x1b[31mred\r\u202eevil\x9b0m [bold]markup[/bold]"


async def test_show_never_sends_stored_escapes_to_the_terminal(
    database_url: str, workdir: Path
) -> None:
    store = await EpisodicStore.open(database_url, settings=isolated_settings())
    try:
        cid = await store.create_conversation(tenant_id="acme\x1b[2J")
        await store.append(
            cid,
            [
                Message.user(HOSTILE),
                Message.assistant(None, tool_calls=[ToolCall(id="c\x1b1", name="run\x07")]),
                Message.tool_result("c\x1b1", HOSTILE, name="run\x07"),
            ],
        )
    finally:
        await store.close()
    for extra in ([], ["--context"]):
        result = await run_cli_async(
            "show", str(cid), "--tenant", "acme\x1b[2J", *extra, "--database-url", database_url,
            "--width", "400", cwd=workdir,
        )  # fmt: skip
        assert result.code == 0, result.output
        raw = result.stdout.encode("utf-8")
        for byte in (b"\x1b", b"\x07", b"\r", "\x9b".encode(), "\u202e".encode()):
            assert byte not in raw, (byte, result.stdout)
        # Shown, as escapes a person can read, and rich markup printed as text.
        assert r"done\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x0d\u202eevil\x9b0m" in result.stdout
        assert "[bold]markup[/bold]" in result.stdout


async def _failing_conversations(url: str, tenants: list[str]) -> list[UUID]:
    """One conversation per tenant, each claimed and failed once with a hostile error."""
    store = await EpisodicStore.open(url, settings=isolated_settings())
    try:
        made = [await store.create_conversation(tenant_id=tenant) for tenant in tenants]
        for cid in made:
            await store.append(cid, [Message.user("hello")])
            claim = await store.claim_conversation(cid, "tester", lease_seconds=60)
            assert claim is not None
            now = datetime.now(UTC)
            record = AttemptRecord(
                conversation_id=cid,
                attempt_id=uuid.uuid4(),
                tenant_id=claim.tenant_id,
                worker="tester",
                reason=claim.reason,
                outcome="failed",
                started_at=now,
                finished_at=now,
                error=f"summarizer said no {HOSTILE}",
            )
            await store.end_attempt(claim, AttemptEnd(retry_in=600), record)
        return made
    finally:
        await store.close()


async def test_status_names_each_conversation_in_80_columns(
    database_url: str, workdir: Path
) -> None:
    failing = await _failing_conversations(database_url, ["acme", "globex-corporation-eu"])
    env = clean_env(COLUMNS="80")
    result = await run_cli_async("status", "--database-url", database_url, cwd=workdir, env=env)
    assert result.code == 0, result.output
    assert "due=2  leased=0  failing=2  dead=0" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "\x1b" not in result.stdout
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    words = [line.split() for line in lines]
    header = words.index(["conversation", "tenant", "state", "reason", "tries", "next"])
    listed = {line.split()[0]: line.split() for line in lines[header + 1 : header + 3]}
    assert set(listed) == {str(cid)[:8] for cid in failing}
    for cells in listed.values():
        assert cells[2:5] == ["failing", "manual_recovery", "1"]
    assert "globex-corp…" in result.stdout  # a long tenant is cut, visibly
    errors = lines[lines.index("last errors") + 1 :][:2]
    assert sorted(line.split()[0] for line in errors) == sorted(listed)
    assert all(line.endswith("…") for line in errors)
    assert r"summarizer said no done\x1b]0;pwned\x07" in result.stdout
    wide = await run_cli_async(
        "status", "--wide", "--database-url", database_url, cwd=workdir, env=clean_env()
    )
    assert wide.code == 0, wide.output
    for cid in failing:
        assert str(cid) in wide.stdout
    assert "globex-corporation-eu" in wide.stdout
    scoped = await run_cli_async(
        "status", "--tenant", "acme", "--wide", "--database-url", database_url, cwd=workdir
    )
    assert "due=1  leased=0  failing=1  dead=0" in scoped.stdout
    assert str(failing[0]) in scoped.stdout
    assert str(failing[1]) not in scoped.stdout


async def test_list_pages_conversations(database_url: str, workdir: Path) -> None:
    store = await EpisodicStore.open(database_url, settings=isolated_settings())
    try:
        made = [await store.create_conversation(tenant_id="acme") for _ in range(3)]
        await store.create_conversation(tenant_id="globex")
    finally:
        await store.close()
    url = ["--database-url", database_url]
    first = await run_cli_async(
        "list", "--tenant", "acme", "--limit", "2", "--wide", *url, cwd=workdir
    )
    assert first.code == 0, first.output
    page = [line.split()[0] for line in first.stdout.splitlines()[1:-1]]
    assert page == [str(made[2]), str(made[1])]
    assert first.stdout.splitlines()[-1] == f"more: episodic list --before {made[1]}"
    rest = await run_cli_async(
        "list", "--tenant", "acme", "--limit", "2", "--wide", "--before", str(made[1]), *url,
        cwd=workdir,
    )  # fmt: skip
    assert [line.split()[0] for line in rest.stdout.splitlines()[1:]] == [str(made[0])]
    assert "more:" not in rest.stdout
