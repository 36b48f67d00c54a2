"""Planning a compaction and turning a summary into a handoff. Pure: no I/O, no model calls.

``prepare_compaction`` decides whether a transcript is over its limit and, if so, builds the
request a summarizer answers (the prompt, capped to a token limit, newest messages first) and
the plan that ``finalize_compaction`` completes: the recent user messages kept verbatim. The
handoff is a *user-role* message whose prefix says it is carried-over runtime context, so the
model does not read it as a new instruction; earlier handoffs are never retained as user
messages, so they cannot pile up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Self

from pydantic import ConfigDict, Field

from episodic.models import EpisodicModel, Message, TextBlock
from episodic.rendering import DEFAULT_REASONING_CHAR_CAP, render_message
from episodic.tokens import TokenEstimator

#: Recorded on every boundary; bump it whenever the prompt or prefix texts change meaning.
PROMPT_VERSION = "episodic-handoff-1"

DEFAULT_SUMMARY_PREFIX = (
    "[Session handoff] Runtime context carried over from the earlier part of this session so "
    "the work can continue. It is not a new instruction from the user."
)

DEFAULT_COMPACTION_PROMPT = """\
Write a handoff note for the agent that will continue this exact session once the earlier \
messages below are removed from its context. That agent will see only your note and the \
most recent messages, so the note must let it carry on without asking again.

Be concise and specific. No greetings, no filler, no restating these instructions. Cover:
1. The current request in concrete terms: what the user wants done now, and what counts as done.
2. Progress so far and the decisions taken, with the reason when it matters.
3. Constraints and preferences the user stated or the work revealed.
4. The files, commands, identifiers, errors and tool results needed to continue, quoted \
exactly where precision matters.
5. The next steps, starting with the one in progress.

Some messages carry private reasoning excerpts. From those keep only durable findings, \
evidence, decisions, approaches that failed, remaining uncertainty and open questions. Never \
reproduce the reasoning itself, and never copy opaque, encoded or signed reasoning payloads.

Reply with the note only; do not answer or continue the conversation."""

TRANSCRIPT_HEADER = "Session transcript, oldest first:"
NO_SUMMARY_TEXT = "(No summary was produced for the earlier part of this session.)"
TRUNCATION_MARKER = "\n[... cut to fit the token budget ...]\n"

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_TokenCount = Annotated[int, Field(ge=0)]


class CompactionConfig(EpisodicModel):
    """When to compact and how much goes into the summary request and the handoff.

    Defaults suit a 1M-token window; override them per model with :meth:`with_limits`.
    """

    model_config = _FROZEN

    enabled: bool = True
    auto_compact_token_limit: _TokenCount = 300_000
    compact_request_token_limit: _TokenCount = 250_000
    recent_user_token_budget: _TokenCount = 20_000
    reasoning_char_cap: _TokenCount = DEFAULT_REASONING_CHAR_CAP
    summary_prefix: Annotated[str, Field(min_length=1)] = DEFAULT_SUMMARY_PREFIX
    compaction_prompt: Annotated[str, Field(min_length=1)] = DEFAULT_COMPACTION_PROMPT

    @classmethod
    def disabled(cls) -> CompactionConfig:
        """A config that never compacts."""
        return cls(enabled=False)

    def with_limits(
        self,
        *,
        auto_compact_token_limit: int | None = None,
        compact_request_token_limit: int | None = None,
        recent_user_token_budget: int | None = None,
    ) -> Self:
        """A copy with the given limits replaced (validated like the constructor)."""
        changes = {
            "auto_compact_token_limit": auto_compact_token_limit,
            "compact_request_token_limit": compact_request_token_limit,
            "recent_user_token_budget": recent_user_token_budget,
        }
        data = self.model_dump()
        data.update({key: value for key, value in changes.items() if value is not None})
        return self.model_validate(data)


class CompactionRequest(EpisodicModel):
    """What to send to the summarizer, with the numbers an attempt record wants."""

    model_config = _FROZEN

    prompt: str
    source_messages: int
    omitted_messages: int
    transcript_tokens: int
    request_tokens: int


class HandoffPlan(EpisodicModel):
    """What survives the compaction besides the summary: recent user texts, oldest first."""

    model_config = _FROZEN

    retained_user_messages: tuple[str, ...]
    summary_prefix: str


class PreparedCompaction(EpisodicModel):
    """A compaction that is due: the summarizer request and the plan to finalize."""

    model_config = _FROZEN

    request: CompactionRequest
    plan: HandoffPlan


class FinalizedCompaction(EpisodicModel):
    """The replacement for the compacted history: the handoff, then the retained messages."""

    model_config = _FROZEN

    handoff: Message
    retained: tuple[Message, ...]

    @property
    def handoff_text(self) -> str:
        return self.handoff.text

    @property
    def retained_texts(self) -> tuple[str, ...]:
        return tuple(message.text for message in self.retained)

    @property
    def messages(self) -> tuple[Message, ...]:
        return (self.handoff, *self.retained)


def should_compact(estimate: int, config: CompactionConfig) -> bool:
    """Whether a transcript of ``estimate`` tokens is due for compaction."""
    return config.enabled and estimate >= config.auto_compact_token_limit


def estimate_transcript_tokens(
    messages: Sequence[Message],
    estimator: TokenEstimator,
    *,
    reasoning_char_cap: int = DEFAULT_REASONING_CHAR_CAP,
) -> int:
    """The transcript's estimate as a summarizer sees it: the sum over rendered messages."""
    return sum(
        estimator.count(render_message(m, reasoning_char_cap=reasoning_char_cap)) for m in messages
    )


def prepare_compaction(
    messages: Sequence[Message], config: CompactionConfig, estimator: TokenEstimator
) -> PreparedCompaction | None:
    """``None`` while ``messages`` are below the limit; otherwise the summarizer request and
    the handoff plan (see the module docstring)."""
    rendered = [render_message(m, reasoning_char_cap=config.reasoning_char_cap) for m in messages]
    costs = [estimator.count(text) for text in rendered]
    transcript_tokens = sum(costs)
    if not messages or not should_compact(transcript_tokens, config):
        return None
    first_kept = _first_message_within_cap(
        costs, estimator.count(f"{config.compaction_prompt}\n\n{TRANSCRIPT_HEADER}"), config
    )
    prompt = _build_prompt(config.compaction_prompt, rendered[first_kept:], omitted=first_kept)
    request = CompactionRequest(
        prompt=prompt,
        source_messages=len(messages) - first_kept,
        omitted_messages=first_kept,
        transcript_tokens=transcript_tokens,
        request_tokens=estimator.count(prompt),
    )
    retained = select_retained_user_messages(
        messages, config.recent_user_token_budget, estimator, summary_prefix=config.summary_prefix
    )
    plan = HandoffPlan(retained_user_messages=retained, summary_prefix=config.summary_prefix)
    return PreparedCompaction(request=request, plan=plan)


def _first_message_within_cap(
    costs: Sequence[int], prompt_tokens: int, config: CompactionConfig
) -> int:
    """Index of the oldest message the request keeps: newest first while the total fits, the
    newest always. Older messages go because the newest ones hold the work in progress."""
    total = prompt_tokens
    first = len(costs)
    for index in range(len(costs) - 1, -1, -1):
        if first < len(costs) and total + costs[index] > config.compact_request_token_limit:
            break
        total += costs[index]
        first = index
    return first


def _build_prompt(instructions: str, rendered: Sequence[str], *, omitted: int) -> str:
    parts = [instructions, TRANSCRIPT_HEADER]
    if omitted:
        noun = "message was" if omitted == 1 else "messages were"
        parts.append(
            f"[The {omitted} oldest {noun} left out to keep this request within its limit.]"
        )
    parts.append("\n\n".join(rendered))
    return "\n\n".join(parts)


def select_retained_user_messages(
    messages: Sequence[Message],
    budget: int,
    estimator: TokenEstimator,
    *,
    summary_prefix: str = DEFAULT_SUMMARY_PREFIX,
) -> tuple[str, ...]:
    """Recent user texts to keep verbatim within ``budget`` tokens, oldest first.

    Walks the whole transcript newest to oldest, skipping non-user messages, empty texts and
    earlier handoffs. Each text is taken whole while it fits; the first that does not is cut
    to what remains, and selection stops there so the kept texts stay contiguous in time.
    """
    kept: list[str] = []
    remaining = budget
    for message in reversed(messages):
        if remaining <= 0:
            break
        text = user_text(message)
        if not text or text.startswith(summary_prefix):
            continue
        cost = estimator.count(text)
        if cost <= remaining:
            kept.append(text)
            remaining -= cost
            continue
        kept.append(truncate_to_token_budget(text, remaining, estimator))
        break
    kept.reverse()
    return tuple(kept)


def user_text(message: Message) -> str:
    """A user message's own words: its text blocks joined by newlines (images and other
    attachments cannot be carried as text); empty for any other role."""
    if message.role != "user" or message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "\n".join(block.text for block in message.content if isinstance(block, TextBlock))


def finalize_compaction(plan: HandoffPlan, summary: str) -> FinalizedCompaction:
    """The handoff message (prefix, newline, trimmed summary) and the retained user messages.

    An empty summary becomes :data:`NO_SUMMARY_TEXT`, so a handoff always says something.
    """
    body = summary.strip() or NO_SUMMARY_TEXT
    handoff = Message.user(f"{plan.summary_prefix}\n{body}")
    retained = tuple(Message.user(text) for text in plan.retained_user_messages)
    return FinalizedCompaction(handoff=handoff, retained=retained)


def truncate_to_token_budget(text: str, budget: int, estimator: TokenEstimator) -> str:
    """``text`` cut to about ``budget`` tokens around :data:`TRUNCATION_MARKER`.

    The allowance is ``estimator.max_chars_for_tokens(budget)`` UTF-8 bytes, cut on character
    boundaries. With room to spare it keeps half head and half tail (the request and its latest
    detail); when the allowance cannot even hold the marker it keeps only the tail after it,
    so the output is never longer than the allowance plus the marker.
    """
    if estimator.count(text) <= budget:
        return text
    allowance = estimator.max_chars_for_tokens(budget)
    data = text.encode("utf-8", "surrogatepass")
    if allowance <= 0:
        return ""
    if len(data) <= allowance:
        return text
    marker = TRUNCATION_MARKER.encode()
    room = allowance - len(marker)
    if room <= 0:
        return TRUNCATION_MARKER.lstrip("\n") + _decode(data[_tail_start(data, allowance) :])
    head = room // 2
    tail = room - head
    return (
        _decode(data[: _head_end(data, head)])
        + TRUNCATION_MARKER
        + _decode(data[_tail_start(data, tail) :])
    )


def _head_end(data: bytes, size: int) -> int:
    """The largest cut ``<= size`` that does not split a UTF-8 character."""
    end = min(size, len(data))
    while 0 < end < len(data) and _is_continuation(data[end]):
        end -= 1
    return end


def _tail_start(data: bytes, size: int) -> int:
    """The start of the longest suffix ``<= size`` bytes that begins on a character."""
    start = max(len(data) - size, 0)
    while start < len(data) and _is_continuation(data[start]):
        start += 1
    return start


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


__all__ = [
    "DEFAULT_COMPACTION_PROMPT",
    "DEFAULT_SUMMARY_PREFIX",
    "NO_SUMMARY_TEXT",
    "PROMPT_VERSION",
    "TRANSCRIPT_HEADER",
    "TRUNCATION_MARKER",
    "CompactionConfig",
    "CompactionRequest",
    "FinalizedCompaction",
    "HandoffPlan",
    "PreparedCompaction",
    "estimate_transcript_tokens",
    "finalize_compaction",
    "prepare_compaction",
    "select_retained_user_messages",
    "should_compact",
    "truncate_to_token_budget",
    "user_text",
]
