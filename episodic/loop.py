"""Compaction inside one agent run: the agent-core compactor contract, on episodic messages.

Before each model call the loop hands a compactor a :class:`CompactionContext`; the compactor
returns a :class:`CompactionPlan` (recommended), a complete replacement history, or ``None``.
:func:`apply_compaction` is the core side: it materializes a plan, frames the summary as one
user message, and refuses any history a provider would reject (:func:`validate_history`).

:class:`LlmCompactor` only uses the context's public surface (``last_usage``,
``split_at_user_turn``, ``render``, ``record_usage``, ``split.plan``), so the same instance
also works inside an agent core that passes its own context type (cliver-core's).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple, Protocol, TypeAlias, TypeVar

from pydantic import ConfigDict, Field

from episodic.compaction import DEFAULT_COMPACTION_PROMPT, TRANSCRIPT_HEADER
from episodic.models import EpisodicModel, Message, Usage
from episodic.rendering import render_transcript

#: The first line of the user message that carries an in-run summary.
COMPACTED_CONTEXT_MARKER = "[Compacted earlier context]"


class CompactionPlan(EpisodicModel):
    """What to compact: keep ``messages[keep_from:]``, put ``summary`` (if any) before them,
    and count ``usage`` (the summarization call's) into the run once the result is accepted.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    keep_from: Annotated[int, Field(ge=1)]
    summary: str | None = None
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class CompactionSplit:
    """A history split before a user turn: ``older`` (to summarize) and ``recent`` (kept).

    :meth:`plan` binds the summary to this same boundary, so the plan cannot drift from the
    text the summarizer saw.
    """

    keep_from: int
    older: tuple[Message, ...]
    recent: tuple[Message, ...]

    def plan(self, summary: str | None = None, usage: object = None) -> CompactionPlan:
        """A plan that replaces ``older`` with ``summary``. ``ValueError`` when nothing would
        be dropped: check ``older`` first."""
        if self.keep_from == 0:
            raise ValueError("the split drops nothing (keep_from == 0); check split.older first")
        return CompactionPlan(keep_from=self.keep_from, summary=summary, usage=coerce_usage(usage))


@dataclass(frozen=True, slots=True)
class CompactionContext:
    """What a compactor sees before one model call of a run.

    ``messages`` excludes the system message (the core owns it); ``last_usage`` is the previous
    model call's usage, ``None`` on the first iteration. ``on_usage`` receives every usage the
    compactor records, so the run's total includes summarization calls.
    """

    messages: tuple[Message, ...]
    iteration: int = 0
    run_id: str = ""
    model: str | None = None
    last_usage: Usage | None = None
    on_usage: Callable[[Usage], None] | None = None
    _recorded: list[Usage] = field(default_factory=list, init=False, repr=False, compare=False)

    @classmethod
    def of(
        cls,
        messages: Iterable[Message],
        *,
        iteration: int = 0,
        run_id: str = "",
        model: str | None = None,
        last_usage: object = None,
        on_usage: Callable[[Usage], None] | None = None,
    ) -> CompactionContext:
        """A context over ``messages``; ``last_usage`` may be any usage-like object."""
        return cls(
            messages=tuple(messages),
            iteration=iteration,
            run_id=run_id,
            model=model,
            last_usage=coerce_usage(last_usage),
            on_usage=on_usage,
        )

    @property
    def recorded_usage(self) -> Usage:
        """The sum of every usage recorded through :meth:`record_usage`."""
        return sum(self._recorded, Usage())

    def record_usage(self, usage: object) -> None:
        """Fold the usage of a model call the compactor made into the run's total."""
        converted = coerce_usage(usage)
        if converted is None:
            return
        self._recorded.append(converted)
        if self.on_usage is not None:
            self.on_usage(converted)

    def split_at_user_turn(self, keep_turns: int) -> CompactionSplit:
        """Split before the ``keep_turns``-th user message from the end (the whole history is
        recent when there are fewer). A suffix starting at a user message never holds half of
        a tool call/result pair."""
        if keep_turns < 1:
            raise ValueError(f"keep_turns must be at least 1, not {keep_turns}")
        users = [i for i, message in enumerate(self.messages) if message.role == "user"]
        keep_from = users[-keep_turns] if len(users) >= keep_turns else 0
        return CompactionSplit(
            keep_from=keep_from,
            older=self.messages[:keep_from],
            recent=self.messages[keep_from:],
        )

    def render(self, messages: Sequence[Message]) -> str:
        """``messages`` as compact text for a summarizer prompt."""
        return render_transcript(messages)


CompactionResult: TypeAlias = CompactionPlan | Sequence[Message] | None
Compactor: TypeAlias = Callable[[CompactionContext], CompactionResult | Awaitable[CompactionResult]]


class AppliedCompaction(NamedTuple):
    """The history for the next model call and the usage to add to the run's total."""

    messages: list[Message]
    usage: Usage | None


def apply_compaction(
    context_messages: Sequence[Message], result: CompactionResult
) -> AppliedCompaction:
    """Turn a compactor's result into the next history (the core side of the contract).

    ``None`` keeps the history unchanged. A list replaces it. A plan keeps
    ``messages[keep_from:]`` behind one user message that starts with
    :data:`COMPACTED_CONTEXT_MARKER`. A plan or list that breaks the history raises
    ``ValueError`` before any model call, and its usage is not counted.
    """
    if result is None:
        return AppliedCompaction(list(context_messages), None)
    if isinstance(result, CompactionPlan):
        messages = _materialize(context_messages, result)
        validate_history(messages)
        return AppliedCompaction(messages, result.usage)
    if isinstance(result, str):
        raise TypeError("a compactor returns a plan, a list of messages or None, not a string")
    messages = list(result)
    validate_history(messages)
    return AppliedCompaction(messages, None)


def summary_message(summary: str) -> Message:
    """The user message that carries an in-run summary."""
    return Message.user(f"{COMPACTED_CONTEXT_MARKER}\n{summary.strip()}")


def _materialize(messages: Sequence[Message], plan: CompactionPlan) -> list[Message]:
    if not 0 < plan.keep_from < len(messages):
        raise ValueError(
            f"plan.keep_from={plan.keep_from} is outside the history of {len(messages)} messages"
        )
    if messages[plan.keep_from].role != "user":
        raise ValueError(
            f"plan.keep_from={plan.keep_from} points at a {messages[plan.keep_from].role} "
            "message; it must point at a user message"
        )
    kept = list(messages[plan.keep_from :])
    if plan.summary is None or not plan.summary.strip():
        return kept
    return [summary_message(plan.summary), *kept]


def validate_history(messages: Sequence[Message]) -> None:
    """Raise ``ValueError`` unless a provider would accept ``messages`` as a history.

    The history must not be empty, must hold no system message, must answer every tool call
    with exactly one result right after it (before the next non-tool message, as providers
    require), must hold no result that answers no such call, and must end with a user or tool
    message so the model has a turn to answer.
    """
    if not messages:
        raise ValueError("the history is empty")
    waiting: set[str] = set()
    for index, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id not in waiting:
                raise ValueError(
                    f"message {index} is a tool result for {message.tool_call_id!r}, which "
                    "answers no tool call waiting right before it"
                )
            waiting.discard(message.tool_call_id)
            continue
        if waiting:
            raise ValueError(
                f"message {index} ({message.role}) comes before the results of tool calls "
                f"{sorted(waiting)}"
            )
        if message.role == "system":
            raise ValueError(f"message {index} is a system message; the core owns that one")
        waiting.update(call.id for call in message.tool_calls)
    if waiting:
        raise ValueError(f"the history ends before the results of tool calls {sorted(waiting)}")
    if messages[-1].role not in ("user", "tool"):
        raise ValueError(
            f"the history ends with a {messages[-1].role} message; it must end with a user or "
            "tool message so the model has a turn to answer"
        )


async def run_compactor(compactor: Compactor, context: CompactionContext) -> CompactionResult:
    """Call a sync or async compactor and return its result."""
    result = compactor(context)
    if inspect.isawaitable(result):
        return await result
    return result


async def compact_in_run(compactor: Compactor, context: CompactionContext) -> list[Message]:
    """Run ``compactor``, apply its result and record a plan's usage on ``context``."""
    applied = apply_compaction(context.messages, await run_compactor(compactor, context))
    if applied.usage is not None:
        context.record_usage(applied.usage)
    return applied.messages


# ---- the built-in LLM compactor -----------------------------------------------------------

PlanT = TypeVar("PlanT", covariant=True)


class UsageLike(Protocol):
    """What a compactor reads of a usage: the previous call's input size."""

    @property
    def input_tokens(self) -> int: ...


class SplitLike(Protocol[PlanT]):
    """The part of a split an LLM compactor uses."""

    @property
    def older(self) -> Sequence[Any]: ...

    def plan(self, summary: str | None = ..., usage: Any = ...) -> PlanT: ...


class ContextLike(Protocol[PlanT]):
    """The part of a compaction context an LLM compactor uses; episodic's
    :class:`CompactionContext` and an agent core's own context both have it."""

    @property
    def last_usage(self) -> UsageLike | None: ...

    def split_at_user_turn(self, keep_turns: int) -> SplitLike[PlanT]: ...

    def render(self, messages: Sequence[Any]) -> str: ...

    def record_usage(self, usage: Any) -> None: ...


class ChatSummarizer(Protocol):
    """Anything with an async ``chat(prompt)`` whose reply has ``.message.content`` and a
    ``.usage_total`` (or ``.usage``): an agent core bound to a cheaper model, typically."""

    async def chat(self, prompt: str, /) -> Any: ...


class LlmCompactor:
    """Summarize everything before the last ``keep_turns`` user turns once the previous model
    call's input reached ``threshold_tokens``.

    Silent on the first iteration (no usage yet) and while no complete older turn exists. An
    empty summary leaves the history unchanged, but its usage is still recorded.
    """

    def __init__(
        self,
        summarizer: ChatSummarizer,
        threshold_tokens: int,
        keep_turns: int = 2,
        *,
        instructions: str = DEFAULT_COMPACTION_PROMPT,
    ) -> None:
        if threshold_tokens < 0:
            raise ValueError(f"threshold_tokens must not be negative, not {threshold_tokens}")
        if keep_turns < 1:
            raise ValueError(f"keep_turns must be at least 1, not {keep_turns}")
        self.summarizer = summarizer
        self.threshold_tokens = threshold_tokens
        self.keep_turns = keep_turns
        self.instructions = instructions

    def __repr__(self) -> str:
        return (
            f"LlmCompactor(threshold_tokens={self.threshold_tokens}, keep_turns={self.keep_turns})"
        )

    async def __call__(self, context: ContextLike[PlanT]) -> PlanT | None:
        usage = context.last_usage
        if usage is None or usage.input_tokens < self.threshold_tokens:
            return None
        split = context.split_at_user_turn(self.keep_turns)
        if not split.older:
            return None
        prompt = f"{self.instructions}\n\n{TRANSCRIPT_HEADER}\n\n{context.render(split.older)}"
        response = await self.summarizer.chat(prompt)
        summary = _response_text(response)
        # Passed through unconverted: a foreign context's plan expects its own usage type.
        summary_usage = _response_usage(response)
        if not summary.strip():
            if summary_usage is not None:
                context.record_usage(summary_usage)
            return None
        return split.plan(summary=summary, usage=summary_usage)


def _response_text(response: Any) -> str:
    message = getattr(response, "message", None)
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            for block in content
            if isinstance(block, Mapping) and isinstance(block.get("text"), str)
        )
    return ""


def _response_usage(response: Any) -> Any:
    total = getattr(response, "usage_total", None)
    return total if total is not None else getattr(response, "usage", None)


def coerce_usage(usage: object) -> Usage | None:
    """An episodic :class:`Usage` from any usage-like object or mapping (``None`` stays
    ``None``): reads ``input_tokens``, ``output_tokens``, ``cache_read_tokens`` (or
    ``cache_read_input_tokens``) and ``reasoning_tokens``, missing ones as 0."""
    if usage is None or isinstance(usage, Usage):
        return usage
    if isinstance(usage, Mapping):
        values: Mapping[str, Any] = usage
    else:
        values = {
            name: getattr(usage, name, None)
            for name in (
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_read_input_tokens",
                "reasoning_tokens",
            )
        }
    cache_read = values.get("cache_read_tokens")
    if cache_read is None:
        cache_read = values.get("cache_read_input_tokens")
    return Usage(
        input_tokens=values.get("input_tokens") or 0,
        output_tokens=values.get("output_tokens") or 0,
        cache_read_tokens=cache_read or 0,
        reasoning_tokens=values.get("reasoning_tokens") or 0,
    )


__all__ = [
    "COMPACTED_CONTEXT_MARKER",
    "AppliedCompaction",
    "ChatSummarizer",
    "CompactionContext",
    "CompactionPlan",
    "CompactionResult",
    "CompactionSplit",
    "Compactor",
    "ContextLike",
    "LlmCompactor",
    "SplitLike",
    "UsageLike",
    "apply_compaction",
    "coerce_usage",
    "compact_in_run",
    "run_compactor",
    "summary_message",
    "validate_history",
]
