"""The in-run compactor contract: validation, splits, plans, apply, and LlmCompactor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episodic.loop import (
    COMPACTED_CONTEXT_MARKER,
    CompactionContext,
    CompactionPlan,
    CompactionResult,
    CompactionSplit,
    LlmCompactor,
    apply_compaction,
    coerce_usage,
    compact_in_run,
    run_compactor,
    validate_history,
)
from episodic.models import Message, ToolCall, Usage
from episodic.rendering import render_transcript

from .conversations import any_histories, valid_histories

# ---- validate_history ------------------------------------------------------------------


def _calls(*ids: str) -> Message:
    return Message.assistant(None, tool_calls=[ToolCall(id=i, name="t") for i in ids])


def _result(call_id: str) -> Message:
    return Message.tool_result(call_id, "ok", name="t")


U, A = Message.user("u"), Message.assistant("a")


@pytest.mark.parametrize(
    "history",
    [
        [U],
        [U, A, U],
        [U, _calls("a"), _result("a")],
        [U, _calls("a", "b"), _result("b"), _result("a"), A, U],
        [U, _calls("a"), _result("a"), _calls("a"), _result("a")],
        [A, U],
    ],
)
def test_validate_accepts(history: list[Message]) -> None:
    validate_history(history)


@pytest.mark.parametrize(
    ("history", "why"),
    [
        ([], "empty"),
        ([Message.system("s"), U], "system"),
        ([U, Message.system("s"), U], "system"),
        ([U, _result("a")], "answers no tool call"),
        ([U, _calls("a"), _result("a"), _result("a")], "answers no tool call"),
        ([U, _calls("a"), _result("b")], "answers no tool call"),
        ([U, _calls("a", "b"), _result("a")], "ends before the results"),
        ([U, _calls("a"), U, _result("a")], "before the results"),
        ([U, _calls("a")], "ends before the results"),
        ([U, A], "ends with a assistant"),
    ],
)
def test_validate_refuses(history: list[Message], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        validate_history(history)


def _oracle_well_paired(messages: Sequence[Message]) -> bool:
    """Independent statement of the rule: each assistant message with n calls is followed by
    exactly n tool messages answering exactly those calls, and every tool message belongs to
    such a block."""
    if not messages or messages[-1].role not in ("user", "tool"):
        return False
    if any(m.role == "system" for m in messages):
        return False
    consumed: set[int] = set()
    for i, message in enumerate(messages):
        if not message.tool_calls:
            continue
        n = len(message.tool_calls)
        block = messages[i + 1 : i + 1 + n]
        if len(block) < n or any(m.role != "tool" for m in block):
            return False
        if sorted(str(m.tool_call_id) for m in block) != sorted(c.id for c in message.tool_calls):
            return False
        consumed.update(range(i + 1, i + 1 + n))
    return all(m.role != "tool" or i in consumed for i, m in enumerate(messages))


def _accepts(messages: Sequence[Message]) -> bool:
    try:
        validate_history(messages)
    except ValueError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(messages=any_histories)
def test_validate_accepts_exactly_the_well_paired_histories(messages: list[Message]) -> None:
    assert _accepts(messages) == _oracle_well_paired(messages)


@settings(max_examples=50, deadline=None)
@given(messages=valid_histories())
def test_generated_valid_histories_are_valid(messages: list[Message]) -> None:
    validate_history(messages)


# ---- splits ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(messages=any_histories, keep_turns=st.integers(1, 4))
def test_split_always_cuts_before_a_user_message(messages: list[Message], keep_turns: int) -> None:
    split = CompactionContext.of(messages).split_at_user_turn(keep_turns)
    assert split.keep_from == 0 or messages[split.keep_from].role == "user"
    assert list(split.older) + list(split.recent) == messages
    users_kept = sum(m.role == "user" for m in split.recent)
    assert users_kept == min(keep_turns, sum(m.role == "user" for m in messages))
    if split.keep_from == 0:
        with pytest.raises(ValueError, match="keep_from == 0"):
            split.plan("s")
    else:
        assert split.plan("s").keep_from == split.keep_from


@settings(max_examples=80, deadline=None)
@given(messages=valid_histories(), keep_turns=st.integers(1, 3), summary=st.text(max_size=20))
def test_a_plan_from_a_valid_history_always_applies(
    messages: list[Message], keep_turns: int, summary: str
) -> None:
    split = CompactionContext.of(messages).split_at_user_turn(keep_turns)
    if not split.older:
        return
    applied = apply_compaction(messages, split.plan(summary, Usage(input_tokens=3)))
    assert applied.messages[len(applied.messages) - len(split.recent) :] == list(split.recent)
    assert applied.usage == Usage(input_tokens=3)


def test_split_examples() -> None:
    history = [U, A, Message.user("second"), _calls("a"), _result("a"), Message.user("third")]
    context = CompactionContext.of(history)
    assert context.split_at_user_turn(1).keep_from == 5
    assert context.split_at_user_turn(2).keep_from == 2
    assert context.split_at_user_turn(3).keep_from == 0
    assert context.split_at_user_turn(9) == CompactionSplit(0, (), tuple(history))
    with pytest.raises(ValueError, match="at least 1"):
        context.split_at_user_turn(0)


# ---- apply_compaction ------------------------------------------------------------------

HISTORY = [Message.user("old"), Message.assistant("old answer"), Message.user("new")]


def test_none_leaves_the_history_unchanged() -> None:
    assert apply_compaction(HISTORY, None) == (HISTORY, None)


def test_a_plan_frames_the_summary_as_one_user_message() -> None:
    usage = Usage(input_tokens=10, output_tokens=2)
    applied = apply_compaction(HISTORY, CompactionPlan(keep_from=2, summary=" S ", usage=usage))
    assert applied.messages == [Message.user(f"{COMPACTED_CONTEXT_MARKER}\nS"), HISTORY[2]]
    assert applied.usage == usage


@pytest.mark.parametrize("summary", [None, "", "  "])
def test_a_plan_without_summary_only_drops(summary: str | None) -> None:
    applied = apply_compaction(HISTORY, CompactionPlan(keep_from=2, summary=summary))
    assert applied.messages == [HISTORY[2]]


@pytest.mark.parametrize(
    ("keep_from", "why"), [(1, "points at a assistant"), (3, "outside"), (7, "outside")]
)
def test_a_plan_must_point_at_a_user_message_inside_the_history(keep_from: int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        apply_compaction(HISTORY, CompactionPlan(keep_from=keep_from, summary="s"))


def test_a_plan_keep_from_must_be_positive() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        CompactionPlan(keep_from=0)


def test_a_full_list_is_validated() -> None:
    assert apply_compaction(HISTORY, [Message.user("only")]) == ([Message.user("only")], None)
    with pytest.raises(ValueError, match="ends with a assistant"):
        apply_compaction(HISTORY, HISTORY[:2])
    with pytest.raises(ValueError, match="empty"):
        apply_compaction(HISTORY, [])
    with pytest.raises(TypeError, match="not a string"):
        apply_compaction(HISTORY, "summary")  # type: ignore[arg-type]


async def test_sync_and_async_compactors_both_run() -> None:
    context = CompactionContext.of(HISTORY)
    plan = CompactionPlan(keep_from=2, summary="s")

    def sync_compactor(_: CompactionContext) -> CompactionResult:
        return plan

    async def async_compactor(_: CompactionContext) -> CompactionResult:
        return plan

    assert await run_compactor(sync_compactor, context) is plan
    assert await run_compactor(async_compactor, context) is plan


async def test_compact_in_run_records_the_plan_usage_once_accepted() -> None:
    seen: list[Usage] = []
    context = CompactionContext.of(HISTORY, on_usage=seen.append)
    usage = Usage(input_tokens=5)

    def compactor(_: CompactionContext) -> CompactionResult:
        return CompactionPlan(keep_from=2, summary="s", usage=usage)

    messages = await compact_in_run(compactor, context)
    assert messages[0].text.startswith(COMPACTED_CONTEXT_MARKER)
    assert seen == [usage]
    assert context.recorded_usage == usage

    def broken(_: CompactionContext) -> CompactionResult:
        return CompactionPlan(keep_from=1, summary="s", usage=usage)

    with pytest.raises(ValueError, match="user message"):
        await compact_in_run(broken, context)
    assert seen == [usage]


def test_coerce_usage_reads_usage_like_objects() -> None:
    assert coerce_usage(None) is None
    assert coerce_usage(Usage(input_tokens=1)) == Usage(input_tokens=1)
    cliver_like = SimpleNamespace(input_tokens=7, output_tokens=3, cache_read_input_tokens=None)
    assert coerce_usage(cliver_like) == Usage(input_tokens=7, output_tokens=3)
    assert coerce_usage({"input_tokens": 2, "cache_read_tokens": 1}) == Usage(
        input_tokens=2, cache_read_tokens=1
    )


# ---- LlmCompactor ----------------------------------------------------------------------


@dataclass
class FakeSummarizer:
    """The agent-core summarizer shape: async chat(prompt) -> .message.content, .usage_total."""

    reply: str | None = "the summary"
    usage: Any = field(default_factory=lambda: Usage(input_tokens=40, output_tokens=4))
    prompts: list[str] = field(default_factory=list)

    async def chat(self, prompt: str) -> Any:
        self.prompts.append(prompt)
        return SimpleNamespace(message=SimpleNamespace(content=self.reply), usage_total=self.usage)


LONG = [
    Message.user("first"),
    Message.assistant(None, tool_calls=[ToolCall(id="c1", name="run", args={"cmd": "ls"})]),
    Message.tool_result("c1", "a.txt", name="run"),
    Message.assistant("listed"),
    Message.user("second"),
    Message.assistant("ok"),
    Message.user("third"),
]


def _context(input_tokens: int | None, messages: Sequence[Message] = LONG) -> CompactionContext:
    last = None if input_tokens is None else Usage(input_tokens=input_tokens)
    return CompactionContext.of(messages, iteration=1, last_usage=last)


async def test_llm_compactor_is_silent_on_the_first_iteration_and_below_threshold() -> None:
    summarizer = FakeSummarizer()
    compactor = LlmCompactor(summarizer, threshold_tokens=100, keep_turns=2)
    assert await compactor(CompactionContext.of(LONG, iteration=0)) is None
    assert await compactor(_context(99)) is None
    assert summarizer.prompts == []


async def test_llm_compactor_is_silent_without_a_complete_older_turn() -> None:
    summarizer = FakeSummarizer()
    compactor = LlmCompactor(summarizer, threshold_tokens=100, keep_turns=3)
    assert await compactor(_context(100)) is None
    assert summarizer.prompts == []


async def test_llm_compactor_summarizes_exactly_the_older_part() -> None:
    summarizer = FakeSummarizer()
    compactor = LlmCompactor(summarizer, threshold_tokens=100, keep_turns=2)
    context = _context(100)
    plan = await compactor(context)
    assert plan == CompactionPlan(
        keep_from=4, summary="the summary", usage=Usage(input_tokens=40, output_tokens=4)
    )
    (prompt,) = summarizer.prompts
    assert prompt.endswith(render_transcript(LONG[:4]))
    assert "second" not in prompt
    applied = apply_compaction(context.messages, plan)
    assert applied.messages == [Message.user(f"{COMPACTED_CONTEXT_MARKER}\nthe summary"), *LONG[4:]]
    assert context.recorded_usage == Usage()  # the plan carries it; the core records it


@pytest.mark.parametrize("reply", [None, "", "  \n"])
async def test_an_empty_summary_changes_nothing_but_its_usage_is_recorded(
    reply: str | None,
) -> None:
    summarizer = FakeSummarizer(reply=reply)
    context = _context(500)
    assert await LlmCompactor(summarizer, threshold_tokens=100, keep_turns=1)(context) is None
    assert context.recorded_usage == Usage(input_tokens=40, output_tokens=4)


def test_llm_compactor_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="keep_turns"):
        LlmCompactor(FakeSummarizer(), threshold_tokens=1, keep_turns=0)
    with pytest.raises(ValueError, match="threshold_tokens"):
        LlmCompactor(FakeSummarizer(), threshold_tokens=-1)


async def test_llm_compactor_is_a_compactor_for_compact_in_run() -> None:
    context = _context(1_000)
    messages = await compact_in_run(LlmCompactor(FakeSummarizer(), 100, keep_turns=1), context)
    assert messages == [Message.user(f"{COMPACTED_CONTEXT_MARKER}\nthe summary"), LONG[-1]]
    assert context.recorded_usage == Usage(input_tokens=40, output_tokens=4)
