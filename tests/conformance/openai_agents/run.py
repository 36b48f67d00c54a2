"""``python -m tests.conformance.openai_agents.run``: the OpenAI Agents SDK's own tests, run
against :class:`~episodic.integrations.openai_agents.EpisodicSession`.

The SDK's source distribution (from the package index, never committed here) ships its tests.
Its ``tests/utils/simple_session.py``, the in-memory session 25+ of its runtime test files
use, is replaced by ``simple_session.py`` beside this file, a subclass of our session on a
real store; then the SDK's runtime files (:data:`FILES`) run, on SQLite and on PostgreSQL
(the server of ``EPISODIC_TEST_DATABASE_URL``, on a database made for the run and dropped
after). Then its backend session tests (:data:`BACKEND_FILES`, written for its
``SQLiteSession`` and ``SQLAlchemySession``) run with those names imported from
``backend_sessions.py``, EpisodicSessions too. Every instance of our session notes the test
that made it: each run fails unless every test passed but the deselected ones
(:data:`DESELECTED`, :data:`BACKEND_DESELECTED`, each with its reason), enough of them did,
and enough distinct tests went through episodic, so a silent fallback to a list-backed
double cannot pass.
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
_ENCRYPTED = (
    "EncryptedSession stores opaque envelopes with neither a type nor a role: episodic "
    "refuses an item it cannot read, pair or summarize (encrypt the database at rest instead)"
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
    "tests/memory/test_compaction_model_visibility.py::test_encrypted_session_checks_decrypted_history": _ENCRYPTED,  # noqa: E501
}
MIN_PASSED = 1_400
MIN_CASES = 600

#: The SDK's backend session tests (its SQLiteSession and SQLAlchemySession files, their
#: imports pointed at backend_sessions.py): what they check of the SDK's own implementations.
_THREADS = (
    "SQLiteSession's worker-thread connections, file locks and write lock: EpisodicSession "
    "holds no connection, thread or lock of its own (the store's pool and the database do)"
)
_CLOSE = (
    "SQLiteSession.close(): EpisodicSession holds no connection to close, so nothing is "
    "refused after it"
)
_CORRUPT = (
    "writes corrupt rows into the SDK's own tables with raw SQL: episodic's log holds only "
    "what validation accepted, and no other table is read"
)
_SPIES = (
    "injects failures into, or spies on, the SDK's own transactions and their rollback and "
    "cancellation handling (episodic's twin: tests/contract/test_retractions.py and the "
    "reliability battery)"
)
_ENGINE = (
    "reads SQLAlchemySession's engine, session factory, table-creation lock or SQLite "
    "configuration registry, which EpisodicSession does not have"
)
_TIES = (
    "inserts rows with equal timestamps into the SDK's tables: episodic orders by seq, "
    "never by time (tests/integration/test_openai_agents_session.py checks the order)"
)
_ASCII = "the SDK's JSON storage format (ensure_ascii): episodic stores items as they came"
_WINDOW = (
    "expects get_items(limit=2) to return a function_call_output whose call is outside the "
    "window (the Runner drops it later): EpisodicSession never returns an output without its "
    "call"
)
BACKEND_DESELECTED = {
    "tests/memory/test_session.py::test_sqlite_session_close_closes_worker_thread_connections": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_reaps_connections_from_exited_worker_threads": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_closes_retired_connections_before_the_next_allocation": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_keeps_connections_of_live_worker_threads": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_file_lock_is_shared_across_instances": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_failed_add_items_releases_write_lock": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_failed_pop_item_releases_write_lock": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_rollback_failure_evicts_connection": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_close_retries_quarantined_connection": _THREADS,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_sqlite_fallback_reserves_writer_before_tail_claim": _THREADS,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_add_items_waits_for_transient_sqlite_write_lock": _THREADS,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_closed_rejects_empty_add_items": _CLOSE,
    "tests/memory/test_session.py::test_sqlite_session_pop_item_skips_corrupt_most_recent": _CORRUPT,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _CORRUPT,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _CORRUPT,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_pop_item_skips_corrupt_most_recent": _CORRUPT,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_get_items_limit_skips_corrupt_newest_rows": _CORRUPT,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_failed_clear_session_rolls_back": _SPIES,
    "tests/memory/test_session.py::test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome[add]": _SPIES,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome[pop]": _SPIES,  # noqa: E501
    "tests/memory/test_session.py::test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome[clear]": _SPIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_pop_item_supports_unknown_delete_rowcount": _SPIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_pop_item_retries_returning_claim_lost_to_concurrent_delete": _SPIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_mutation_cancellation_waits_for_transaction_exit[add]": _SPIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_mutation_cancellation_waits_for_transaction_exit[pop]": _SPIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_mutation_cancellation_waits_for_transaction_exit[clear]": _SPIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_add_items_concurrent_first_access_across_from_url_sessions": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_add_items_concurrent_first_access_across_from_url_sessions_cross_loop": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_add_items_concurrent_first_access_with_shared_session_cross_loop": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_add_items_cancelled_waiter_does_not_strand_table_init_lock": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_create_tables_false_does_not_allocate_shared_init_lock": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_engine_property_from_url": _ENGINE,
    "tests/extensions/memory/test_sqlalchemy_session.py::test_engine_property_from_external_engine": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_engine_property_is_read_only": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_sqlite_configuration_registry_releases_collected_engines": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_sqlite_configuration_registry_does_not_grow_unbounded": _ENGINE,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_get_items_same_timestamp_consistent_order": _TIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_pop_item_same_timestamp_returns_latest": _TIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_get_items_orders_by_id_for_ties": _TIES,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_sqlalchemy_session_defaults_to_escaped_non_ascii_storage": _ASCII,  # noqa: E501
    "tests/extensions/memory/test_sqlalchemy_session.py::test_sqlalchemy_session_can_store_non_ascii_without_escaping": _ASCII,  # noqa: E501
    "tests/memory/test_session_limit.py::test_session_limit_drops_unmatched_history_function_call_output[run]": _WINDOW,  # noqa: E501
    "tests/memory/test_session_limit.py::test_session_limit_drops_unmatched_history_function_call_output[run_sync]": _WINDOW,  # noqa: E501
    "tests/memory/test_session_limit.py::test_session_limit_drops_unmatched_history_function_call_output[run_streamed]": _WINDOW,  # noqa: E501
}
_REWRITE = (
    "rewrites a stored row's timestamp in the SDK's own table to reorder its history: "
    "episodic's log is never rewritten, and its order is the seq"
)
_SUFFIX, _SQLA_COMPACTION = (
    "tests/memory/test_compaction_suffix.py",
    "tests/memory/test_sqlalchemy_compaction.py",
)
BACKEND_DESELECTED |= {
    **{f"{_SUFFIX}::{name}": _ENCRYPTED for name in (
        "test_expired_prefix_does_not_block_full_live_window",
        "test_failed_encrypted_suffix_transaction_preserves_original_tokens",
        "test_prefix_cleanup_stops_before_retained_history",
        "test_repeated_ttl_bursts_do_not_accumulate_expired_rows",
        "test_unverifiable_rows_inside_snapshot_are_retained",
    )},
    f"{_SUFFIX}::test_suffix_transaction_rolls_back_failed_insert": _SPIES,
    f"{_SUFFIX}::test_cancelled_suffix_transaction_settles_before_newer_append": _SPIES,
    f"{_SQLA_COMPACTION}::test_encrypted_prefix_cleanup_is_atomic": _ENCRYPTED,
    f"{_SQLA_COMPACTION}::test_encrypted_unknown_row_is_retained": _ENCRYPTED,
    f"{_SQLA_COMPACTION}::test_replacement_uses_timestamp_order_not_id_order": _REWRITE,
    f"{_SQLA_COMPACTION}::test_cancelled_replacement_settles_before_other_instance_append": _SPIES,
    f"{_SQLA_COMPACTION}::test_failed_replacement_preserves_history_during_other_instance_access": _SPIES,  # noqa: E501
    f"{_SQLA_COMPACTION}::test_compaction_with_engine_managed_sqlite_begin": _ENGINE,
    f"{_SQLA_COMPACTION}::test_parent_constraint_rejection_propagates": _SPIES,
}  # fmt: skip
#: The backend files, and the imports pointed at backend_sessions.py (each (old, new) once).
BACKEND_FILES = {
    "tests/memory/test_session.py": ((
        "from agents import Agent, RunConfig, Runner, SessionSettings, SQLiteSession, "
        "TResponseInputItem",
        "from agents import Agent, RunConfig, Runner, SessionSettings, TResponseInputItem\n"
        "from tests.utils.episodic_backends import SQLiteSession",
    ),),
    "tests/extensions/memory/test_sqlalchemy_session.py": ((
        "from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession",
        "from tests.utils.episodic_backends import SQLAlchemySession",
    ),),
    "tests/memory/test_session_limit.py": ((
        "from agents import Agent, RunConfig, SQLiteSession",
        "from agents import Agent, RunConfig\n"
        "from tests.utils.episodic_backends import SQLiteSession",
    ),),
    # OpenAIResponsesCompactionSession over the stores with the suffix-snapshot hook.
    "tests/memory/test_compaction_suffix.py": (
        (
            "from agents.extensions.memory.async_sqlite_session import AsyncSQLiteSession",
            "from tests.utils.episodic_backends import AsyncSQLiteSession",
        ),
        (
            "from agents.memory import OpenAIResponsesCompactionSession, SQLiteSession",
            "from agents.memory import OpenAIResponsesCompactionSession\n"
            "from tests.utils.episodic_backends import SQLiteSession",
        ),
    ),
    "tests/memory/test_sqlalchemy_compaction.py": ((
        "from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession",
        "from tests.utils.episodic_backends import SQLAlchemySession",
    ),),
}  # fmt: skip
MIN_BACKEND_PASSED = 90
MIN_BACKEND_CASES = 80


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
    shutil.copyfile(
        HERE / "backend_sessions.py", source / "tests" / "utils" / "episodic_backends.py"
    )
    for name, replacements in BACKEND_FILES.items():
        path = source / name
        text = path.read_text(encoding="utf-8")
        for old, new in replacements:
            if text.count(old) != 1:
                raise SystemExit(f"{name}: the import to point at episodic is not there: {old!r}")
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
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


def run_suite(
    source: Path,
    url: str,
    label: str,
    workdir: Path,
    *,
    files: tuple[str, ...],
    deselected: dict[str, str],
    min_passed: int,
    min_cases: int,
) -> tuple[int, int]:
    """Run the SDK's ``files`` on ``url``; (passed, distinct tests through episodic)."""
    cases = workdir / f"cases-{label}.txt"
    cases.unlink(missing_ok=True)
    env = {
        **os.environ,
        "EPISODIC_CONFORMANCE_URL": url,
        "EPISODIC_CONFORMANCE_CASES": str(cases),
        "PYTHONPATH": os.pathsep.join([str(source / "src"), str(ROOT)]),
    }
    deselect = [arg for test in deselected for arg in ("--deselect", test)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *deselect, *files],
        cwd=source, env=env, capture_output=True, text=True,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    counts = {
        k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|deselected)", summary)
    }
    through = len(set(cases.read_text().splitlines())) if cases.exists() else 0
    print(
        f"openai-agents 0.24.0 {label}: {counts.get('passed', 0):,} passed, "
        f"{counts.get('failed', 0)} failed, {counts.get('deselected', 0)} deselected; "
        f"{through:,} tests went through EpisodicSession"
    )
    if done.returncode != 0:
        print(done.stdout[-6_000:], done.stderr[-2_000:], sep="\n")
        raise SystemExit(f"the SDK's tests failed: {label}")
    if counts.get("passed", 0) < min_passed or through < min_cases:
        raise SystemExit(
            f"{label}: only {counts.get('passed', 0)} passed and {through} went through "
            f"EpisodicSession (want at least {min_passed} and {min_cases})"
        )
    return counts["passed"], through


def run_both(source: Path, url: str, backend: str, workdir: Path) -> None:
    """The runtime suite, then the backend session files, on one database."""
    run_suite(
        source, url, f"runtime suite on {backend}", workdir,
        files=FILES, deselected=DESELECTED, min_passed=MIN_PASSED, min_cases=MIN_CASES,
    )  # fmt: skip
    run_suite(
        source, url, f"backend session tests on {backend}", workdir,
        files=tuple(BACKEND_FILES), deselected=BACKEND_DESELECTED,
        min_passed=MIN_BACKEND_PASSED, min_cases=MIN_BACKEND_CASES,
    )  # fmt: skip


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
    for test, reason in {**DESELECTED, **BACKEND_DESELECTED}.items():
        print(f"  {test}: {reason}")
    with tempfile.TemporaryDirectory(prefix="episodic-sdk-") as tmp:
        workdir = Path(tmp)
        source = fetch_sdk(workdir)
        sqlite = f"sqlite+aiosqlite:///{workdir / 'conformance.db'}"
        asyncio.run(_migrate(sqlite))
        run_both(source, sqlite, "SQLite", workdir)
        if args.postgres:
            server = make_url(args.postgres)
            name = f"episodic_sdk_{uuid.uuid4().hex[:12]}"
            admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
            url = server.set(database=name).render_as_string(hide_password=False)
            asyncio.run(_admin(admin, f'CREATE DATABASE "{name}"'))
            try:
                asyncio.run(_migrate(url))
                run_both(source, url, "PostgreSQL", workdir)
            finally:
                asyncio.run(_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
