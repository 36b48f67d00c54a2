"""Compaction by size with nothing configured: a conversation past the default context-tokens
trigger, whose every turn ends with ``mark_run_completed`` (as the README's examples do), is
compacted by ``episodic worker --once``."""

from __future__ import annotations

from pathlib import Path

import pytest

from episodic import BoundaryEvent, EpisodicStore, Message
from episodic.errors import ConfigurationError
from episodic.policy import DEFAULT_TRIGGER_CONTEXT_TOKENS, EpisodicCompactionTrigger
from episodic.settings import load_settings
from tests.acceptance.test_cli import clean_env, run_cli_async
from tests.conftest import isolated_settings

#: ~20k estimated tokens per message (UTF-8 bytes / 4); six turns of two are ~240k tokens.
WORDS = "the migration fails on the orders table with error E1234 " * 1_400
TURNS = 6


async def test_a_conversation_past_the_default_trigger_is_compacted(
    database_url: str, tmp_path: Path
) -> None:
    settings = isolated_settings()
    assert settings.trigger_context_tokens == DEFAULT_TRIGGER_CONTEXT_TOKENS
    store = await EpisodicStore.open(database_url, settings=settings)
    try:
        conv = await store.create_conversation(tenant_id="acme")
        for turn in range(TURNS):
            await store.append(conv, [Message.user(f"turn {turn}: {WORDS}")])
            await store.append(conv, [Message.assistant(f"answer {turn}: {WORDS}")])
            await store.mark_run_completed(conv)
        before = await store.load_context(conv)
        assert before.estimated_tokens > 2 * DEFAULT_TRIGGER_CONTEXT_TOKENS
        # A run completed after every turn: only the size can make it due.
        assert (await store.pressure(conv)).user_messages_after_latest_run_completed == 0

        result = await run_cli_async(
            "worker", "--once", cwd=tmp_path, env=clean_env(EPISODIC_DATABASE_URL=database_url)
        )
        assert result.code == 0, result.output

        events = await store.read_events(conv)
        boundaries = [e for e in events if isinstance(e, BoundaryEvent)]
        assert [b.reason for b in boundaries] == [EpisodicCompactionTrigger.CONTEXT_PRESSURE]
        after = await store.load_context(conv)
        assert after.boundary is not None
        assert after.estimated_tokens < DEFAULT_TRIGGER_CONTEXT_TOKENS
    finally:
        await store.close()


def test_off_turns_the_size_rule_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no ./.env
    monkeypatch.setenv("EPISODIC_TRIGGER_CONTEXT_TOKENS", "off")
    assert load_settings().trigger_config().trigger_context_tokens is None
    monkeypatch.setenv("EPISODIC_TRIGGER_CONTEXT_TOKENS", "120000")
    assert load_settings().trigger_config().trigger_context_tokens == 120_000
    monkeypatch.setenv("EPISODIC_TRIGGER_CONTEXT_TOKENS", "")
    with pytest.raises(ConfigurationError, match="EPISODIC_TRIGGER_CONTEXT_TOKENS"):
        load_settings()
