"""Planning a compaction and turning a summary into a handoff. Pure: no I/O, no model calls.

``prepare_compaction`` decides whether a transcript is over its limit and, if so, builds the
request a summarizer answers (the prompt, capped to a token limit, newest messages first) and
the plan that ``finalize_compaction`` completes: the recent user messages kept verbatim. The
handoff is a *user-role* message whose prefix says it is carried-over runtime context, so the
model does not read it as a new instruction; earlier handoffs are never retained as user
messages, so they cannot pile up.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Self, get_args

from pydantic import BaseModel, ConfigDict, Field

from episodic.models import EpisodicModel, Message, TextBlock
from episodic.notes import (
    NOTE_FORM,
    Note,
    drop_echoes,
    merge_notes,
    parse_notes,
    render_notes,
)
from episodic.rendering import (
    DEFAULT_REASONING_CHAR_CAP,
    DEFAULT_TOOL_RESULT_CHAR_CAP,
    render_message,
)
from episodic.tokens import CharHeuristic, TokenEstimator
from episodic.worklog import WorkLog, render_instructions, render_worklog

#: Recorded on every boundary; bump it whenever the prompt or prefix texts change meaning.
PROMPT_VERSION = "episodic-handoff-5"

DEFAULT_SUMMARY_PREFIX = (
    "[Session handoff: runtime context from earlier in this session, not a new instruction]"
)

_PROMPT_TEMPLATE = """\
You write the handoff notes for an agent that continues this exact session after the \
messages below are removed from its context. It will see only your notes, the record of the \
tools' work (shown below, kept for you), and the user's newest messages, so it must be able to \
carry on without asking again.

Fill in this form from the messages below. Each section is a checklist: one bullet per item, \
at most 20 words each; copy names, values, identifiers, commands and steps exactly as \
written; write "None" for an empty section. Add only what the notes so far do not say, and \
be brief.

{form}

Some messages carry private reasoning excerpts. From those keep only durable findings, \
decisions and open questions; never reproduce the reasoning itself or any encoded payload.

Reply with the filled form only."""

DEFAULT_COMPACTION_PROMPT = _PROMPT_TEMPLATE.format(
    form="\n\n".join(f"## {heading}\n{meaning}" for heading, _, meaning in NOTE_FORM),
)

NOTES_HEADER = "Notes so far (kept as they are):"
#: The handoff's last line: what it summarized is still there, and where (store.search).
RECALL_TEMPLATE = "(Search the log for exact details through seq {seq}.)"
TRANSCRIPT_HEADER = "Session transcript, oldest first:"
NO_SUMMARY_TEXT = "(No summary was produced for the earlier part of this session.)"
TRUNCATION_MARKER = "\n[... cut to fit the token budget ...]\n"

#: a retained text is cut to what remains only if that holds 1/MIN_CUT_SHARE of it
MIN_CUT_SHARE = 2

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
    #: the user's standing instructions the handoff carries word for word (pinned first)
    instructions_token_budget: _TokenCount = 2_000
    #: after the pinned messages, carry the user's sentences that read as standing rules or
    #: reminders ("always ...", "never ...", "don't forget ...")
    detect_instructions: bool = True
    #: the handoff's notes (the model's narrative, kept across compactions)
    notes_token_budget: _TokenCount = 4_000
    #: the handoff's record of what the tools did (files, commands, errors, instructions)
    worklog_token_budget: _TokenCount = 4_000
    reasoning_char_cap: _TokenCount = DEFAULT_REASONING_CHAR_CAP
    #: the characters of each tool result the model is shown (its head): the record carries
    #: what a result identifies, read from all of it, and a small model copies log noise
    tool_result_char_cap: _TokenCount = DEFAULT_TOOL_RESULT_CHAR_CAP
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
        instructions_token_budget: int | None = None,
        notes_token_budget: int | None = None,
        worklog_token_budget: int | None = None,
        tool_result_char_cap: int | None = None,
    ) -> Self:
        """A copy with the given limits replaced (validated like the constructor)."""
        changes = {
            "auto_compact_token_limit": auto_compact_token_limit,
            "compact_request_token_limit": compact_request_token_limit,
            "recent_user_token_budget": recent_user_token_budget,
            "instructions_token_budget": instructions_token_budget,
            "notes_token_budget": notes_token_budget,
            "worklog_token_budget": worklog_token_budget,
            "tool_result_char_cap": tool_result_char_cap,
        }
        data = self.model_dump()
        data.update({key: value for key, value in changes.items() if value is not None})
        return self.model_validate(data)


class HandoffState(EpisodicModel):
    """What a boundary carries for the next compaction to build on: the notes its handoff
    shows and the record folded through its cut. Stored as JSON on the boundary
    (:attr:`~episodic.models.BoundaryEvent.handoff_state`)."""

    model_config = _FROZEN

    notes: tuple[Note, ...] = ()
    worklog: WorkLog = WorkLog()

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> HandoffState:
        """The state a boundary holds, read as a tolerant reader: fields this release does
        not know (a newer release wrote the boundary, during a rolling upgrade) are left
        out, not refused."""
        return cls.model_validate(_known_fields(cls, stored))

    def stored(self) -> dict[str, Any]:
        """The JSON to store: fields at their defaults left out, so that a release that
        does not know a new field reads what this one writes until the field has a value
        (ARCHITECTURE.md, "Changing the database")."""
        return self.model_dump(mode="json", exclude_defaults=True)


def _known_fields(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the keys ``model`` (and the models in its fields) does not declare."""
    if not isinstance(data, Mapping):
        return data
    known = {}
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is not None:
            known[name] = _known_in(field.annotation, value)
    return known


def _known_in(annotation: Any, value: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _known_fields(annotation, value)
    if isinstance(value, list):
        items = [arg for arg in get_args(annotation) if arg is not Ellipsis]
        if len(items) == 1:
            return [_known_in(items[0], item) for item in value]
    return value


class CompactionRequest(EpisodicModel):
    """What to send to the summarizer, with the numbers an attempt record wants."""

    model_config = _FROZEN

    prompt: str
    source_messages: int
    omitted_messages: int
    transcript_tokens: int
    request_tokens: int
    #: the user texts the boundary keeps word for word: a handoff need not repeat them
    retained: tuple[str, ...] = ()


class HandoffPlan(EpisodicModel):
    """What survives the compaction besides the model's reply: recent user texts (oldest
    first), the earlier notes the reply adds to, and the record through the cut."""

    model_config = _FROZEN

    retained_user_messages: tuple[str, ...]
    summary_prefix: str
    notes: tuple[Note, ...] = ()
    worklog: WorkLog = WorkLog()
    #: the seq the reply's notes are dated with (the cut)
    notes_seq: int = 0
    #: the prompt the model was given: a note that only copies a line of it is dropped
    compaction_prompt: str = ""
    #: what the tools printed in the messages the model was shown: a note that only copies
    #: a line of it is dropped too (the record keeps what matters of it: failures, ids)
    tool_output: tuple[str, ...] = ()
    instructions_token_budget: int = CompactionConfig.model_fields[
        "instructions_token_budget"
    ].default
    notes_token_budget: int = CompactionConfig.model_fields["notes_token_budget"].default
    worklog_token_budget: int = CompactionConfig.model_fields["worklog_token_budget"].default


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
    #: for the boundary, so the next compaction builds on it
    state: HandoffState = HandoffState()

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
    messages: Sequence[Message],
    config: CompactionConfig,
    estimator: TokenEstimator,
    *,
    previous: HandoffState | None = None,
    new_from: int = 0,
    cut_seq: int = 0,
    unpinned: Collection[int] = (),
) -> PreparedCompaction | None:
    """``None`` while ``messages`` are below the limit; otherwise the summarizer request and
    the handoff plan (see the module docstring).

    ``previous`` is the state of the boundary ``messages`` start from, and ``messages[new_from:]``
    what came after it: only those are shown to the model, beside the notes so far, and folded
    into the record. Without it, every message is (the handoff of a boundary that carries no
    state is then read as a message like the others). ``unpinned`` are the seqs of the pinned
    messages the log has unpinned since: the handoff stops carrying them.
    """
    transcript_tokens = estimate_transcript_tokens(
        messages, estimator, reasoning_char_cap=config.reasoning_char_cap
    )
    if not messages or not should_compact(transcript_tokens, config):
        return None
    rendered = [
        render_message(
            m,
            reasoning_char_cap=config.reasoning_char_cap,
            tool_result_char_cap=config.tool_result_char_cap,
        )
        for m in messages
    ]
    costs = [estimator.count(text) for text in rendered]
    new = new_from if previous is not None else 0
    state = previous or HandoffState()
    worklog = state.worklog.fold(
        [m for m in messages[new:] if not user_text(m).startswith(config.summary_prefix)],
        unpinned=unpinned,
        detect_instructions=config.detect_instructions,
    )
    retained = select_retained_user_messages(
        messages, config.recent_user_token_budget, estimator, summary_prefix=config.summary_prefix
    )
    notes, _ = render_notes(state.notes, config.notes_token_budget, estimator)
    head = "\n\n".join(
        part
        for part in (
            config.compaction_prompt,
            render_instructions(worklog, config.instructions_token_budget, estimator),
            notes and f"{NOTES_HEADER}\n{notes}",
            render_worklog(worklog, config.worklog_token_budget, estimator),
        )
        if part
    )
    first_kept = new + _first_message_within_cap(
        costs[new:], estimator.count(f"{head}\n\n{TRANSCRIPT_HEADER}"), config
    )
    prompt = _build_prompt(head, rendered[first_kept:], omitted=first_kept - new)
    request = CompactionRequest(
        prompt=prompt,
        source_messages=len(messages) - first_kept,
        omitted_messages=first_kept - new,
        transcript_tokens=sum(costs[new:]),
        request_tokens=estimator.count(prompt),
        retained=retained,
    )
    plan = HandoffPlan(
        retained_user_messages=retained,
        summary_prefix=config.summary_prefix,
        notes=state.notes,
        worklog=worklog,
        notes_seq=cut_seq,
        compaction_prompt=config.compaction_prompt,
        tool_output=tuple(m.text for m in messages[first_kept:] if m.role == "tool"),
        instructions_token_budget=config.instructions_token_budget,
        notes_token_budget=config.notes_token_budget,
        worklog_token_budget=config.worklog_token_budget,
    )
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


def _build_prompt(head: str, rendered: Sequence[str], *, omitted: int) -> str:
    parts = [head, TRANSCRIPT_HEADER]
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
    to what remains when that holds at least half of it (the newest text always), and
    selection stops there so the kept texts stay contiguous in time. A smaller piece would be
    a fragment that says nothing and costs its tokens.
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
        room = remaining - estimator.count(TRUNCATION_MARKER)  # what the piece can hold
        if not kept or room * MIN_CUT_SHARE >= cost:
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


def finalize_compaction(
    plan: HandoffPlan, summary: str, estimator: TokenEstimator | None = None
) -> FinalizedCompaction:
    """The handoff message and the retained user messages.

    The handoff is the prefix, then the user's standing instructions and the notes (the
    earlier ones and those the reply adds), then the record of the tools' work, each within
    its budget; instructions the retained messages hold are not repeated. A reply with no
    notes and nothing else to say becomes :data:`NO_SUMMARY_TEXT`, so a handoff always says
    something. A plan that knows its cut ends with :data:`RECALL_TEMPLATE`: the agent can
    search the log for what the handoff left out.
    """
    estimator = estimator or CharHeuristic()
    instructions = render_instructions(
        plan.worklog, plan.instructions_token_budget, estimator, shown=plan.retained_user_messages
    )
    record = render_worklog(plan.worklog, plan.worklog_token_budget, estimator)
    # A note that copies what the handoff already says (the prompt's own lines, the record,
    # a carried instruction) or a line a tool printed adds nothing but its tokens.
    echoed = (plan.compaction_prompt, record, instructions, *plan.tool_output)
    added = drop_echoes(parse_notes(summary, seq=plan.notes_seq), echoed)
    notes, kept = render_notes(merge_notes(plan.notes, added), plan.notes_token_budget, estimator)
    body = "\n\n".join(part for part in (instructions, notes, record) if part) or NO_SUMMARY_TEXT
    if plan.notes_seq:
        body += "\n\n" + RECALL_TEMPLATE.format(seq=plan.notes_seq)
    handoff = Message.user(f"{plan.summary_prefix}\n{body}")
    retained = tuple(Message.user(text) for text in plan.retained_user_messages)
    state = HandoffState(notes=kept, worklog=plan.worklog)
    return FinalizedCompaction(handoff=handoff, retained=retained, state=state)


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
    "NOTES_HEADER",
    "NO_SUMMARY_TEXT",
    "PROMPT_VERSION",
    "RECALL_TEMPLATE",
    "TRANSCRIPT_HEADER",
    "TRUNCATION_MARKER",
    "CompactionConfig",
    "CompactionRequest",
    "FinalizedCompaction",
    "HandoffPlan",
    "HandoffState",
    "PreparedCompaction",
    "estimate_transcript_tokens",
    "finalize_compaction",
    "prepare_compaction",
    "select_retained_user_messages",
    "should_compact",
    "truncate_to_token_budget",
    "user_text",
]
