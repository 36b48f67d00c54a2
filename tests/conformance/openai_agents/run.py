"""``python -m tests.conformance.openai_agents.run``: the OpenAI Agents SDK's own runtime tests,
run against :class:`~episodic.integrations.openai_agents.EpisodicSession`.

The SDK's source distribution (from the package index, never committed here) ships its tests.
Its ``tests/utils/simple_session.py``, the in-memory session 25+ of its runtime test files
use, is replaced by ``simple_session.py`` beside this file, a subclass of our session on a
real store; then the SDK's runtime files (:data:`FILES`) run, on SQLite and on PostgreSQL
(the server of ``EPISODIC_TEST_DATABASE_URL``, on a database made for the run and dropped
after). Every instance of our session notes the test that made it: the run fails unless
every test passed but the deselected ones (:data:`DESELECTED`, each with its reason), at
least :data:`MIN_PASSED` did, and at least :data:`MIN_CASES` distinct tests went through
episodic, so a silent fallback to a list-backed double cannot pass.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

from episodic import EpisodicStore
from episodic.settings import EpisodicSettings

SDK = "openai-agents==0.24.0"
HERE = Path(__file__).parent
ROOT = HERE.parents[2]

#: The SDK's runtime test files that use its in-memory session (adapters.md §7.1).
FILES = (
    "tests/test_agent_runner.py",
    "tests/test_agent_runner_streamed.py",
    "tests/memory/test_openai_responses_compaction_session.py",
    "tests/memory/test_compaction_model_visibility.py",
    "tests/deferred_session_writes/",
    "tests/test_error_logging_redaction.py",
    "tests/test_run_impl_resume_paths.py",
    "tests/test_max_turns.py",
    "tests/test_run_state_pending_input.py",
    "tests/test_runtime_symmetry_contract.py",
    "tests/test_hitl_session_scenario.py",
    "tests/test_runner_tracing_disabled.py",
    "tests/test_runner_guardrail_resume.py",
    "tests/test_prompt_cache_key.py",
    "tests/test_invalid_final_output_handler.py",
    "tests/test_handoff_history_duplication.py",
    "tests/test_cancel_streaming.py",
)

_ORPHAN = (
    "stores a function_call_output whose function_call was never stored (or only after it): "
    "episodic refuses an orphan result (OrphanToolResultError) rather than keep a history "
    "no provider accepts"
)
_NO_ROLE = (
    "stores a message item with no role: episodic refuses it (ValidationError) rather than "
    "guess whose message it is"
)
#: Tests that cannot pass against a store that checks what it is given, and why.
DESELECTED = {
    "tests/test_agent_runner.py::test_prepare_input_with_session_keeps_orphan_output_without_limit": _ORPHAN,  # noqa: E501
    "tests/test_agent_runner.py::test_prepare_input_with_session_drops_limited_orphan_history_function_call_outputs": _ORPHAN,  # noqa: E501
    "tests/test_agent_runner.py::test_prepare_input_with_session_leaves_custom_callback_output_unchanged": _ORPHAN,  # noqa: E501
    "tests/test_agent_runner.py::test_prepare_input_with_session_prefers_latest_function_call_output": _ORPHAN,  # noqa: E501
    "tests/test_agent_runner.py::test_save_result_to_session_preserves_function_outputs": _ORPHAN,
    "tests/test_agent_runner.py::test_save_result_to_session_prefers_latest_duplicate_function_outputs": _ORPHAN,  # noqa: E501
    "tests/test_run_impl_resume_paths.py::test_resumed_session_persistence_uses_saved_count": _ORPHAN,  # noqa: E501
    "tests/test_agent_runner.py::test_rewind_handles_id_stripped_sessions": _NO_ROLE,
    "tests/test_agent_runner.py::test_wait_for_session_cleanup_logs_when_targets_linger": _NO_ROLE,
    "tests/test_run_impl_resume_paths.py::test_pending_session_write_without_the_held_key_keeps_its_meaning": (  # noqa: E501
        "relabels a pending write as run-state format 1.17, which predates compaction-aware "
        "sessions: EpisodicSession is one (run_compaction records the turn's usage), so its "
        "pending write carries the compaction exchange that format cannot hold"
    ),
    "tests/memory/test_compaction_model_visibility.py::test_encrypted_session_checks_decrypted_history": (  # noqa: E501
        "EncryptedSession stores opaque envelopes with neither a type nor a role: episodic "
        "refuses an item it cannot read (encrypt the database at rest instead)"
    ),
}
MIN_PASSED = 1_400
MIN_CASES = 600


def fetch_sdk(workdir: Path) -> Path:
    """The SDK's source distribution, downloaded and unpacked into ``workdir``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
         ":all:", SDK, "-d", str(workdir)],
        check=True,
    )  # fmt: skip
    (archive,) = workdir.glob("openai_agents-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    (source,) = (p for p in workdir.iterdir() if p.is_dir() and p.name.startswith("openai_agents"))
    shutil.copyfile(HERE / "simple_session.py", source / "tests" / "utils" / "simple_session.py")
    return source


async def _migrate(url: str) -> None:
    store = await EpisodicStore.open(url, settings=EpisodicSettings(_env_file=None))
    try:
        await store.migrate()
    finally:
        await store.close()


async def _admin(server: str, sql: str) -> None:
    conn = await asyncpg.connect(server)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def run_suite(source: Path, url: str, label: str, workdir: Path) -> tuple[int, int]:
    """Run the SDK's files on ``url``; (passed, distinct tests through episodic)."""
    cases = workdir / f"cases-{label}.txt"
    cases.unlink(missing_ok=True)
    env = {
        **os.environ,
        "EPISODIC_CONFORMANCE_URL": url,
        "EPISODIC_CONFORMANCE_CASES": str(cases),
        "PYTHONPATH": os.pathsep.join([str(source / "src"), str(ROOT)]),
    }
    deselect = [arg for test in DESELECTED for arg in ("--deselect", test)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *deselect, *FILES],
        cwd=source, env=env, capture_output=True, text=True,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    counts = {
        k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|deselected)", summary)
    }
    through = len(set(cases.read_text().splitlines())) if cases.exists() else 0
    print(
        f"openai-agents 0.24.0 runtime suite on {label}: {counts.get('passed', 0):,} passed, "
        f"{counts.get('failed', 0)} failed, {counts.get('deselected', 0)} deselected; "
        f"{through:,} tests went through EpisodicSession"
    )
    if done.returncode != 0:
        print(done.stdout[-6_000:], done.stderr[-2_000:], sep="\n")
        raise SystemExit(f"the SDK's tests failed on {label}")
    if counts.get("passed", 0) < MIN_PASSED or through < MIN_CASES:
        raise SystemExit(
            f"on {label} only {counts.get('passed', 0)} passed and {through} went through "
            f"EpisodicSession (want at least {MIN_PASSED} and {MIN_CASES})"
        )
    return counts["passed"], through


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.openai_agents.run")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("EPISODIC_TEST_DATABASE_URL"),
        help="a PostgreSQL server the run may create a database on (default: "
        "EPISODIC_TEST_DATABASE_URL); without one, SQLite only",
    )
    args = parser.parse_args(argv)
    print("deselected, each with its reason:")
    for test, reason in DESELECTED.items():
        print(f"  {test}: {reason}")
    with tempfile.TemporaryDirectory(prefix="episodic-sdk-") as tmp:
        workdir = Path(tmp)
        source = fetch_sdk(workdir)
        sqlite = f"sqlite+aiosqlite:///{workdir / 'conformance.db'}"
        asyncio.run(_migrate(sqlite))
        run_suite(source, sqlite, "SQLite", workdir)
        if args.postgres:
            server = make_url(args.postgres)
            name = f"episodic_sdk_{uuid.uuid4().hex[:12]}"
            admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
            url = server.set(database=name).render_as_string(hide_password=False)
            asyncio.run(_admin(admin, f'CREATE DATABASE "{name}"'))
            try:
                asyncio.run(_migrate(url))
                run_suite(source, url, "PostgreSQL", workdir)
            finally:
                asyncio.run(_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
