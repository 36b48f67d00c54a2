"""``run_demo``: the embedded-default demo, checked against what the store actually holds."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from episodic import EpisodicSettings, EpisodicStore, StoredEvent
from episodic.compaction import DEFAULT_SUMMARY_PREFIX
from episodic.demo import DemoError, DemoReport, run_demo
from episodic.models import BoundaryEvent, MessageEvent, RunCompletedEvent
from tests.support import require_extra

MAX_SECONDS = 10.0


@dataclass(frozen=True)
class Played:
    report: DemoReport
    output: str


def settings(**values: object) -> EpisodicSettings:
    """Defaults (no environment, no .env file) with ``values`` set."""
    return EpisodicSettings(_env_file=None).model_copy(update=values)


async def play(directory: Path | None, **values: object) -> Played:
    buffer = io.StringIO()
    report = await run_demo(
        directory, console=Console(file=buffer, width=120), settings=settings(**values)
    )
    return Played(report, buffer.getvalue())


async def read_log(report: DemoReport) -> list[StoredEvent]:
    store = await EpisodicStore.open(report.database_url, settings=settings())
    try:
        return await store.read_events(report.conversation_id, limit=10_000)
    finally:
        await store.close()


def user_texts(events: Sequence[StoredEvent]) -> list[str]:
    return [
        e.message.text for e in events if isinstance(e, MessageEvent) and e.message.role == "user"
    ]


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Played:
    """One demo run shared by the tests that only look at it (it is deterministic)."""
    with pytest.MonkeyPatch.context() as env:  # the autouse scrub is per test, this is not
        for name in [n for n in os.environ if n.startswith("EPISODIC_")]:
            env.delenv(name)
        return asyncio.run(play(tmp_path_factory.mktemp("demo")))


def flat(text: str) -> str:
    """``text`` without whitespace and panel borders, to find wrapped text in the output."""
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


async def test_compaction_makes_the_next_request_much_smaller(played: Played) -> None:
    r = played.report
    assert r.trigger_reason == "context_pressure"
    assert r.tokens_after < 0.6 * r.tokens_before
    assert r.tokens_after < r.trigger_context_tokens <= r.tokens_before
    # The append-time trigger fired midway through the session, not at its end.
    assert r.due_at_seq is not None
    assert r.due_pressure_tokens is not None
    assert 1 < r.due_at_seq < r.covers_through_seq // 2
    assert r.due_pressure_tokens >= r.trigger_context_tokens
    assert r.messages_after < r.messages_before
    assert r.summarizer == "extractive"
    assert r.seconds < MAX_SECONDS


async def test_the_log_keeps_every_message(played: Played) -> None:
    r = played.report
    events = await read_log(r)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(events) == r.log_events
    messages = [e for e in events if isinstance(e, MessageEvent)]
    assert len(messages) == r.log_message_events
    # The context before compaction was the whole log, plus one synthetic result for the call
    # its run abandoned.
    assert r.messages_before == r.log_message_events + r.abandoned_tool_calls
    assert r.abandoned_tool_calls == 1
    boundaries = [e for e in events if isinstance(e, BoundaryEvent)]
    assert len(boundaries) == 1
    boundary = boundaries[0]
    assert boundary.seq == r.boundary_seq == events[-1].seq
    assert boundary.covers_through_seq == r.covers_through_seq
    assert boundary.reason == r.trigger_reason
    assert boundary.tokens_before == r.tokens_before
    assert boundary.tokens_after == r.tokens_after
    assert boundary.summary == r.handoff_text
    assert sum(1 for e in events if isinstance(e, RunCompletedEvent)) == r.runs_completed >= 3


async def test_the_figures_are_what_the_store_loads(played: Played) -> None:
    r = played.report
    store = await EpisodicStore.open(r.database_url, settings=settings())
    try:
        context = await store.load_context(r.conversation_id)
        head = await store.get_conversation(r.conversation_id)
    finally:
        await store.close()
    assert len(context.messages) == r.messages_after
    assert context.estimated_tokens == r.tokens_after
    assert context.messages[0].text == r.handoff_text
    assert head.boundary_seq == r.boundary_seq
    assert head.due_since is None  # the worker cleared it


async def test_the_session_is_realistic(played: Played) -> None:
    events = await read_log(played.report)
    messages = [e.message for e in events if isinstance(e, MessageEvent)]
    assistants = [m for m in messages if m.role == "assistant"]
    results = [m for m in messages if m.role == "tool"]
    assert 40 <= len(assistants) + len(user_texts(events)) <= 70
    assert any(len(m.tool_calls) >= 2 for m in assistants), "no parallel calls"
    assert all(call.args for m in assistants for call in m.tool_calls)
    assert {call.name for m in assistants for call in m.tool_calls} >= {
        "read_file",
        "run_tests",
        "grep",
        "edit_file",
    }
    assert any(len(m.text.encode()) > 4_000 for m in results), "no multi-KB tool output"
    assert any(len(m.text) < 100 for m in results)
    assert any(m.is_error for m in results)
    usages = [e.usage for e in events if isinstance(e, MessageEvent) and e.usage is not None]
    assert len(usages) == len(assistants)
    assert all(u.input_tokens > 0 and u.output_tokens > 0 for u in usages)
    texts = user_texts(events)
    assert any(any("\u3040" <= ch <= "\u30ff" for ch in text) for text in texts), "no Japanese"
    assert any("é" in text or "à" in text for text in texts), "no French"


async def test_handoff_and_retained_messages(played: Played) -> None:
    r = played.report
    assert r.handoff_text.startswith(DEFAULT_SUMMARY_PREFIX)
    assert r.handoff_text[len(DEFAULT_SUMMARY_PREFIX) :].strip()
    texts = user_texts(await read_log(r))
    # Kept verbatim: the most recent requests, oldest first (the budget fits them exactly).
    assert 2 <= len(r.retained_texts) < len(texts)
    assert list(r.retained_texts) == texts[-len(r.retained_texts) :]


async def test_the_output_shows_the_figures(played: Played) -> None:
    r, out = played.report, played.output
    for figure in (
        f"≈{r.tokens_before:,}",
        f"≈{r.tokens_after:,}",
        f"≈{r.log_tokens:,}",
        f"{r.log_events:,} events",
        f"{r.log_bytes:,}",
        f"{r.bytes_before:,}",
        f"{r.bytes_after:,}",
        str(r.conversation_id),
        r.trigger_reason,
        str(r.database_path),
        f"episodic show {r.conversation_id} --context --database-url {r.database_url}",
        "episodic status",
        "EPISODIC_SUMMARIZER=openai",
        "In production",
    ):
        assert figure in out, figure
    assert flat(r.handoff_text) in flat(out)
    for text in r.retained_texts:
        assert flat(text) in flat(out)
    assert "Traceback" not in out


async def test_a_second_run_in_the_same_directory_plays_a_new_conversation(
    played: Played,
) -> None:
    again = await play(played.report.database_path.parent)
    assert again.report.database_path == played.report.database_path
    assert again.report.conversation_id != played.report.conversation_id
    assert "already holds a demo conversation" in again.output
    first = {k: v for k, v in played.report.figures.items() if k != "conversation_id"}
    second = {k: v for k, v in again.report.figures.items() if k != "conversation_id"}
    assert first == second


async def test_without_a_directory_it_uses_a_new_temporary_one_and_the_same_figures(
    played: Played, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    again = await play(None)
    folder = again.report.database_path.parent
    assert folder.parent == tmp_path
    assert folder.name.startswith("episodic-demo-")
    assert again.report.database_path.is_file()
    assert "temporary directory" in again.output
    # Deterministic: a fresh database gives the same figures, conversation id included.
    assert again.report.figures == played.report.figures


async def test_an_openai_compatible_summarizer_is_used_when_configured(tmp_path: Path) -> None:
    require_extra("openai", "openai")
    from tests.support_openai import FakeOpenAIServer, chat_completion

    handoff = "The agent fixed CI on PR #913; next: post the note to #payments-eng."
    async with FakeOpenAIServer([chat_completion(handoff, model="fake-model-0613")]) as server:
        # No EPISODIC_SUMMARIZER: a base URL and a model are enough to pick it.
        result = await play(
            tmp_path, summarizer_base_url=server.base_url, summarizer_model="fake-model"
        )
    r = result.report
    assert [request.json["model"] for request in server.requests] == ["fake-model"]
    assert r.summarizer == "openai-chat:fake-model"
    assert r.summarizer_model == "fake-model-0613"
    # the model's reply (prose: kept as written), then the record read from the log
    assert r.handoff_text.startswith(f"{DEFAULT_SUMMARY_PREFIX}\n{handoff}\n\n")
    assert handoff in result.output


async def test_a_failing_summarizer_stops_the_demo_with_its_error(tmp_path: Path) -> None:
    require_extra("openai", "openai")
    from tests.support_openai import FakeOpenAIServer, Reply, error_body

    reply = Reply(401, error_body("Incorrect API key provided", error_type="invalid_request"))
    async with FakeOpenAIServer([reply]) as server:
        with pytest.raises(DemoError, match="Incorrect API key provided"):
            await play(
                tmp_path,
                summarizer="openai",
                summarizer_base_url=server.base_url,
                summarizer_model="fake-model",
            )


def test_the_demo_command_runs_as_a_new_user_would(tmp_path: Path) -> None:
    """`episodic demo`, the README's first command: no server, no key, no EPISODIC_* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISODIC_")}
    env["COLUMNS"] = "120"
    script = Path(sys.executable).parent / "episodic"
    result = subprocess.run(
        [str(script), "demo", "--directory", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "The next request loads" in result.stdout
    assert (tmp_path / "episodic-demo.db").is_file()
