"""``episodic erase``, ``export`` and ``import``: the console script, run as a subprocess
against real databases (both backends), checked through the library."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import pytest

from episodic import BoundaryRequest, EpisodicStore, Message, NotFoundError, StateChange, ToolCall
from episodic.store.attempts import AttemptEnd, AttemptRecord
from tests.acceptance.test_cli import EPISODIC, Result, clean_env
from tests.conftest import isolated_settings
from tests.support import snapshot


async def cli(*args: str, cwd: Path, answer: str = "") -> Result:
    """Run ``episodic`` with ``answer`` on its stdin (empty: end of file, never a terminal)."""

    def run() -> Result:
        done = subprocess.run(
            [str(EPISODIC), *args],
            cwd=cwd,
            env=clean_env(),
            input=answer,
            capture_output=True,
            encoding="utf-8",
            timeout=120,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    return await asyncio.to_thread(run)


def one_error_line(result: Result) -> str:
    """The failure's one line on stderr (no traceback, nothing on stdout)."""
    assert result.code != 0, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def tombstone(stdout: str) -> dict[str, str]:
    """The fields ``episodic erase`` printed, a ``name: value`` line each."""
    return {
        name.strip(): value.strip()
        for name, _, value in (line.partition(":") for line in stdout.splitlines())
    }


def files_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def conversation_ids_in(path: Path) -> list[str]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [line["conversation_id"] for line in lines if line["type"] == "conversation"]


@dataclass(frozen=True)
class Seeded:
    url: str
    #: tenant acme: a conversation with a boundary, a run completion, an attempt and state
    conversation_id: UUID
    #: tenant acme, deleted (its log is kept, so it is exported and erased too)
    deleted_id: UUID
    #: tenant globex
    other_id: UUID


async def seed(url: str) -> Seeded:
    store = await EpisodicStore.open(url, settings=isolated_settings())
    try:
        cid = await store.create_conversation(tenant_id="acme", metadata={"app": "cli"})
        written = await store.append(
            cid,
            [Message.user("Fix the failing test, s'il vous plaît 🎉")],
            state=StateChange(conversation={"lang": "fr"}, shared={"app:prefs": {"units": "C"}}),
        )
        written += await store.append(
            cid,
            [
                Message.assistant(
                    None, tool_calls=[ToolCall(id="c1", name="run", args={"cmd": "pytest"})]
                ),
                Message.tool_result("c1", "1 failed", name="run"),
            ],
        )
        written += await store.append(cid, [Message.assistant("Fixed it.")])
        await store.write_boundary(
            cid,
            BoundaryRequest(
                summary="HANDOFF: the test was fixed",
                covers_through_seq=written[-1].seq,
                retained=["Fix the failing test, s'il vous plaît 🎉"],
                reason="manual_recovery",
                expected_boundary_seq=None,
            ),
        )
        await store.append(cid, [Message.user("now the docs")])
        await store.mark_run_completed(cid)
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
            error="summarizer said no",
        )
        await store.end_attempt(claim, AttemptEnd(retry_in=600), record)

        deleted = await store.create_conversation(tenant_id="acme")
        await store.append(deleted, [Message.user("forget me")])
        await store.delete_conversation(deleted)
        other = await store.create_conversation(tenant_id="globex")
        await store.append(other, [Message.user("not acme's")])
    finally:
        await store.close()
    return Seeded(url, cid, deleted, other)


async def fresh_sqlite(path: Path) -> str:
    url = f"sqlite+aiosqlite:///{path}"
    store = await EpisodicStore.open(url, settings=isolated_settings())
    try:
        await store.migrate()
    finally:
        await store.close()
    return url


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty directory to run the CLI in, where the files it writes go."""
    path = tmp_path / "cwd"
    path.mkdir()
    return path


@pytest.fixture
async def seeded(database_url: str) -> Seeded:
    return await seed(database_url)


# ---- export and import ------------------------------------------------------------------------


async def test_a_conversation_exported_and_imported_elsewhere_is_the_same(
    seeded: Seeded, workdir: Path, tmp_path: Path
) -> None:
    cid = str(seeded.conversation_id)
    exported = await cli(
        "export", cid, "-o", "one.jsonl", "--database-url", seeded.url, cwd=workdir
    )
    assert exported.code == 0, exported.output
    assert exported.stdout == ""
    assert exported.stderr.startswith(f"exported conversation {cid} to one.jsonl (")
    first = (workdir / "one.jsonl").read_bytes()
    assert files_in(workdir) == ["one.jsonl"]  # no partial file left
    to_stdout = await cli("export", cid, "--database-url", seeded.url, cwd=workdir)
    assert to_stdout.code == 0, to_stdout.output
    assert to_stdout.stdout.encode() == first

    target = await fresh_sqlite(tmp_path / "target.db")
    imported = await cli("import", "one.jsonl", "--database-url", target, cwd=workdir)
    assert imported.code == 0, imported.output
    assert imported.stdout.startswith(f"imported conversation {cid} (tenant acme, ")
    assert "1 compaction attempt)" in imported.stdout

    again = await cli("export", cid, "-o", "two.jsonl", "--database-url", target, cwd=workdir)
    assert again.code == 0, again.output
    assert (workdir / "two.jsonl").read_bytes() == first
    contexts = []
    for url in (seeded.url, target):
        store = await EpisodicStore.open(url, settings=isolated_settings())
        try:
            contexts.append(await store.load_context(cid))
        finally:
            await store.close()
    assert contexts[0] == contexts[1]
    assert contexts[0].boundary is not None


async def test_a_tenant_exported_to_a_file_is_imported_whole(
    seeded: Seeded, workdir: Path, tmp_path: Path
) -> None:
    url = ["--database-url", seeded.url]
    exported = await cli("export", "--tenant", "acme", "-o", "acme.jsonl", *url, cwd=workdir)
    assert exported.code == 0, exported.output
    assert exported.stderr.startswith("exported 2 conversations of tenant acme to acme.jsonl (")
    assert sorted(conversation_ids_in(workdir / "acme.jsonl")) == sorted(
        [str(seeded.conversation_id), str(seeded.deleted_id)]
    )

    target = await fresh_sqlite(tmp_path / "target.db")
    imported = await cli("import", "acme.jsonl", "--database-url", target, cwd=workdir)
    assert imported.code == 0, imported.output
    assert imported.stdout.startswith("imported 2 conversations (")
    assert "and 1 shared-state scope from acme.jsonl" in imported.stdout
    again = await cli(
        "export", "--tenant", "acme", "-o", "again.jsonl", "--database-url", target, cwd=workdir
    )
    assert again.code == 0, again.output
    assert (workdir / "again.jsonl").read_bytes() == (workdir / "acme.jsonl").read_bytes()

    # Into the database it came from: the first id is taken, nothing is written.
    before = await snapshot(seeded.url)
    conflict = one_error_line(await cli("import", "acme.jsonl", *url, cwd=workdir))
    assert conflict.endswith("already exists; nothing was imported")
    assert await snapshot(seeded.url) == before


async def test_an_import_with_a_taken_id_writes_nothing(
    seeded: Seeded, workdir: Path, tmp_path: Path
) -> None:
    url = ["--database-url", seeded.url]
    assert (
        await cli("export", "--tenant", "acme", "-o", "acme.jsonl", *url, cwd=workdir)
    ).code == 0
    first, second = conversation_ids_in(workdir / "acme.jsonl")
    assert (await cli("export", second, "-o", "second.jsonl", *url, cwd=workdir)).code == 0
    target = ["--database-url", await fresh_sqlite(tmp_path / "target.db")]
    assert (await cli("import", "second.jsonl", *target, cwd=workdir)).code == 0

    error = one_error_line(await cli("import", "acme.jsonl", *target, cwd=workdir))
    assert error == f"error: conversation {second} already exists; nothing was imported"
    store = await EpisodicStore.open(target[1], settings=isolated_settings())
    try:
        with pytest.raises(NotFoundError):
            await store.get_conversation(first)  # checked before anything was written
    finally:
        await store.close()


async def test_a_corrupted_file_is_refused_before_anything_is_written(
    database_url: str, workdir: Path, tmp_path: Path
) -> None:
    source = await seed(await fresh_sqlite(tmp_path / "source.db"))
    exported = await cli(
        "export", "--tenant", "acme", "-o", "acme.jsonl", "--database-url", source.url,
        cwd=workdir,
    )  # fmt: skip
    assert exported.code == 0, exported.output
    lines = (workdir / "acme.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    # Drop the first event of the last conversation: the one before it is whole, and still
    # not imported.
    header = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "conversation"][-1]
    assert header > 0
    assert json.loads(lines[header + 2])["seq"] == 2
    del lines[header + 1]
    (workdir / "broken.jsonl").write_text("".join(lines), encoding="utf-8")

    before = await snapshot(database_url)
    result = await cli("import", "broken.jsonl", "--database-url", database_url, cwd=workdir)
    error = one_error_line(result)
    assert error.startswith(f"error: line {header + 2}: event seq 2 where seq 1 was expected")
    assert error.endswith("; nothing was imported")
    assert await snapshot(database_url) == before


async def test_a_failed_export_leaves_the_file_as_it_was(seeded: Seeded, workdir: Path) -> None:
    (workdir / "kept.jsonl").write_text("what was there\n", encoding="utf-8")
    missing = str(uuid.uuid4())
    result = await cli(
        "export", missing, "-o", "kept.jsonl", "--database-url", seeded.url, cwd=workdir
    )
    assert f"conversation {missing} does not exist" in one_error_line(result)
    assert (workdir / "kept.jsonl").read_text(encoding="utf-8") == "what was there\n"
    assert files_in(workdir) == ["kept.jsonl"]


# ---- erase --------------------------------------------------------------------------------------


async def test_erase_with_yes_leaves_only_the_tombstone(seeded: Seeded, workdir: Path) -> None:
    store = await EpisodicStore.open(seeded.url, settings=isolated_settings())
    try:
        last_seq = (await store.get_conversation(seeded.conversation_id)).last_seq
        cid = str(seeded.conversation_id)
        result = await cli(
            "erase", cid, "--reason", "ticket 42", "--yes", "--database-url", seeded.url,
            cwd=workdir,
        )  # fmt: skip
        assert result.code == 0, result.output
        assert result.stderr == ""
        fields = tombstone(result.stdout)
        assert fields["conversation"] == cid
        assert fields["tenant"] == "acme"
        assert uuid.UUID(fields["erasure"])
        assert (fields["conversations"], fields["events"]) == ("1", str(last_seq))
        assert (fields["compaction attempts"], fields["shared states"]) == ("1", "0")
        assert fields["by"] == ("sqlite" if store.dialect == "sqlite" else "postgres")
        assert fields["reason"] == "ticket 42"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", fields["erased at"])
        with pytest.raises(NotFoundError):
            await store.load_context(cid)
        await store.load_context(seeded.other_id)  # the others are untouched
    finally:
        await store.close()


async def test_erase_answered_no_changes_nothing(seeded: Seeded, workdir: Path) -> None:
    before = await snapshot(seeded.url)
    cid = str(seeded.conversation_id)
    result = await cli(
        "erase", cid, "--reason", "ticket 42", "--database-url", seeded.url, cwd=workdir,
        answer="n\n",
    )  # fmt: skip
    assert result.code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"Erase conversation {cid} completely? Its log cannot be recovered [y/N]: ",
        "error: not confirmed: nothing was erased",
    ]
    assert await snapshot(seeded.url) == before


async def test_erase_a_tenant(seeded: Seeded, workdir: Path) -> None:
    url = ["--database-url", seeded.url]
    declined = await cli(
        "erase", "--tenant", "acme", "--reason", "contract ended", *url, cwd=workdir
    )
    assert declined.code == 1, declined.output
    assert "Erase tenant acme completely, its 2 conversations and its shared state?" in (
        declined.stderr
    )
    result = await cli(
        "erase", "--tenant", "acme", "--reason", "contract ended", "-y", *url, cwd=workdir
    )
    assert result.code == 0, result.output
    fields = tombstone(result.stdout)
    assert fields["tenant"] == "acme"
    assert fields["conversation"].startswith("tenant")
    assert (fields["conversations"], fields["shared states"]) == ("2", "1")
    assert fields["compaction attempts"] == "1"
    store = await EpisodicStore.open(seeded.url, settings=isolated_settings())
    try:
        assert await store.count_conversations("acme") == 0
        assert await store.count_conversations("globex") == 1
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("args", "complaint", "code"),
    [
        pytest.param(["{missing}", "--reason", "r"], "{missing} does not exist", 1, id="unknown"),
        pytest.param(["not-a-uuid", "--reason", "r"], "must be a UUID", 1, id="not-a-uuid"),
        pytest.param(["{id}", "--reason", ""], "reason must be a non-empty", 1, id="no-reason"),
        pytest.param(["{id}", "--tenant", "acme", "--reason", "r"], "not both", 2, id="both"),
        pytest.param(["--reason", "r"], "give a conversation id, or --tenant", 2, id="neither"),
    ],
)
async def test_erase_refusals_are_one_line(
    seeded: Seeded, workdir: Path, args: list[str], complaint: str, code: int
) -> None:
    before = await snapshot(seeded.url)
    names = {"id": seeded.conversation_id, "missing": uuid.uuid4()}
    args = [a.format(**names) for a in args]
    result = await cli("erase", *args, "--yes", "--database-url", seeded.url, cwd=workdir)
    assert complaint.format(**names) in one_error_line(result)
    assert result.code == code
    assert await snapshot(seeded.url) == before
