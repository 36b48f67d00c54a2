"""An in-run compaction, persisted, is where the next request starts."""

from __future__ import annotations

from dataclasses import dataclass

from episodic import EpisodicStore, Message, ToolCall, Usage
from episodic.loop import CompactionContext, LlmCompactor, apply_compaction
from episodic.persist import PersistingCompactor


@dataclass
class _Reply:
    content: str


@dataclass
class _Response:
    message: _Reply
    usage_total: Usage


class FakeSummarizer:
    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def chat(self, prompt: str) -> _Response:
        self.prompts.append(prompt)
        return _Response(_Reply("Fixed two tests; the third still fails."), Usage(input_tokens=7))


async def test_persisted_plan_is_the_next_requests_history(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    for turn in range(3):
        await store.append(
            conv,
            [
                Message.user(f"fix test {turn}"),
                Message.assistant(None, tool_calls=[ToolCall(id=f"c{turn}", name="pytest")]),
                Message.tool_result(f"c{turn}", "1 failed", name="pytest"),
                Message.assistant(f"fixed {turn}"),
            ],
        )
    await store.append(conv, [Message.user("now the last one")])  # the new request
    ctx = await store.load_context(conv)
    summarizer = FakeSummarizer()
    compactor = PersistingCompactor.for_context(
        store, ctx, LlmCompactor(summarizer, threshold_tokens=1_000, keep_turns=2)
    )
    run = CompactionContext.of(ctx.messages, iteration=1, last_usage=Usage(input_tokens=5_000))
    plan = await compactor(run)
    in_run = apply_compaction(list(ctx.messages), plan).messages

    [boundary] = compactor.boundaries
    assert boundary.retention == "recent_turns"
    assert boundary.covers_through_seq == 8
    assert boundary.usage == Usage(input_tokens=7)
    reloaded = await store.load_context(conv)
    strip = {"seq": None, "created_at": None, "token_estimate": None}
    assert [m.model_copy(update=strip) for m in reloaded.messages] == [
        m.model_copy(update=strip) for m in in_run
    ]


async def test_unstored_turn_is_not_persisted(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("one"), Message.assistant("a")])
    ctx = await store.load_context(conv)
    compactor = PersistingCompactor.for_context(
        store, ctx, LlmCompactor(FakeSummarizer(), threshold_tokens=1, keep_turns=1)
    )
    unsaved = [*ctx.messages, Message.user("two, not appended yet")]
    plan = await compactor(
        CompactionContext.of(unsaved, iteration=1, last_usage=Usage(input_tokens=9))
    )
    assert plan is not None
    assert compactor.boundaries == []
    assert (await store.load_context(conv)).boundary is None
