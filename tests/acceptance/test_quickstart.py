"""The README's quickstart, run as written: its shell block (migrate, a worker in the
background, ``python app.py``, the worker stopped) with its ``app.py``, against a new
PostgreSQL database and a scripted OpenAI-compatible model on 127.0.0.1. Only the database
URL is changed, to the test's own database."""

from __future__ import annotations

from pathlib import Path

from episodic import EpisodicStore, MessageEvent, RunCompletedEvent
from tests.conftest import isolated_settings
from tests.readme import README_DATABASE_URL, fenced, run_shell, section, user_environment
from tests.support_openai import FakeOpenAIServer, chat_completion

QUICKSTART = section("Quickstart")
ANSWERS = ["E1234 is the orders table's missing column.", "Fixed; pytest -k orders passes."]


def quickstart_blocks() -> tuple[str, str]:
    (shell,) = fenced(QUICKSTART, "bash")
    (app,) = fenced(QUICKSTART, "python")
    return shell, app


def test_the_quickstart_names_its_parts() -> None:
    shell, app = quickstart_blocks()
    assert README_DATABASE_URL in shell
    for step in ("episodic migrate", "episodic worker &", "python app.py", "kill $WORKER"):
        assert step in shell
    for call in ("store.append(", "store.load_context(", "store.mark_run_completed("):
        assert call in app


async def test_the_quickstart_runs_as_written(empty_postgres_url: str, tmp_path: Path) -> None:
    shell, app = quickstart_blocks()
    (tmp_path / "app.py").write_text(app, encoding="utf-8")
    env = user_environment()

    async with FakeOpenAIServer() as model:
        for number, answer in enumerate(ANSWERS):
            model.add(chat_completion(answer, prompt_tokens=900 + 100 * number))
        env.update(OPENAI_BASE_URL=model.base_url, OPENAI_API_KEY="sk-test")
        script = shell.replace(README_DATABASE_URL, empty_postgres_url)
        code, output = await run_shell(script, cwd=tmp_path, env=env)
        requests = list(model.requests)

    assert code == 0, output
    for answer in ANSWERS:
        assert answer in output
    assert "estimated_context_tokens" in output  # the pressure it printed
    # The second request sent the model the first turn as episodic stored it.
    assert len(requests) == 2
    second = requests[1].json["messages"]
    assert second[0]["role"] == "system"
    assert [m["role"] for m in second[1:]] == ["user", "assistant", "user"]
    assert second[2]["content"] == ANSWERS[0]

    store = await EpisodicStore.open(empty_postgres_url, settings=isolated_settings())
    try:
        (conversation,) = await store.list_conversations()
        events = await store.read_events(conversation.conversation_id)
        kinds = [type(e) for e in events]
        assert kinds == [MessageEvent, MessageEvent, RunCompletedEvent] * 2
        # The usage the model reported reached the head: the trigger sees it.
        pressure = await store.pressure(conversation.conversation_id)
        assert pressure.estimated_context_tokens is not None
        assert pressure.estimated_context_tokens >= 1_000
    finally:
        await store.close()
