"""An offline, deterministic summarizer: excerpts of the transcript, no model.

For the demo, for tests, and as a last resort when no model is reachable. It cannot
understand the session, so it keeps what a successor needs most and can find nowhere else:
the current request, the last reply, which tools ran and failed, the earlier requests (first
line each) and an excerpt of any earlier handoff, in that order of priority, each cut to its
share of ``max_chars``. The same prompt always gives the same text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from episodic.compaction import DEFAULT_SUMMARY_PREFIX, CompactionRequest
from episodic.loop import COMPACTED_CONTEXT_MARKER
from episodic.summarizers.base import SummaryResult
from episodic.summarizers.transcript import ParsedTranscript, TranscriptBlock, parse_transcript

EXTRACTIVE_MODEL = "extractive"
EXTRACTIVE_TITLE = "Extractive handoff (excerpts of the session, written without a model)."
MIN_MAX_CHARS = 200
ELLIPSIS = "…"

# Each section's share of max_chars; the total is cut to max_chars at the end, so a long
# section costs the sections after it, never the ones before.
_REQUEST_SHARE = 0.35
_REPLY_SHARE = 0.25
_TOOLS_SHARE = 0.10
_TOOL_ERROR_SHARE = 0.08
_EARLIER_SHARE = 0.15
_HANDOFF_SHARE = 0.20
_FIRST_LINE_CHARS = 160


class ExtractiveSummarizer:
    """Builds the handoff from the request prompt alone (see the module docstring); usage is
    ``None`` and the model :data:`EXTRACTIVE_MODEL`. A prompt with no transcript gives an
    empty text, which the worker counts as a failure.

    User blocks that start with ``summary_prefix`` (or the in-run compaction marker) are
    earlier handoffs, not requests.
    """

    def __init__(
        self,
        max_chars: int = 4000,
        *,
        summary_prefix: str = DEFAULT_SUMMARY_PREFIX,
        name: str = "extractive",
    ) -> None:
        if max_chars < MIN_MAX_CHARS:
            raise ValueError(f"max_chars must be at least {MIN_MAX_CHARS}, not {max_chars}")
        self.max_chars = max_chars
        self.summary_prefix = summary_prefix
        self.name = name

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(max_chars={self.max_chars})"

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        """The extractive handoff of ``request.prompt``."""
        text = extractive_handoff(
            parse_transcript(request.prompt),
            max_chars=self.max_chars,
            handoff_prefixes=(self.summary_prefix, COMPACTED_CONTEXT_MARKER),
            retained=request.retained,
        )
        return SummaryResult(text=text, usage=None, model=EXTRACTIVE_MODEL)


def extractive_handoff(
    transcript: ParsedTranscript,
    *,
    max_chars: int,
    handoff_prefixes: Sequence[str] = (DEFAULT_SUMMARY_PREFIX, COMPACTED_CONTEXT_MARKER),
    retained: Sequence[str] = (),
) -> str:
    """The handoff text for ``transcript``, at most ``max_chars`` characters; empty when the
    transcript has no blocks. Requests among ``retained`` (the user texts the boundary keeps
    word for word beside the handoff) are not repeated. Pure and deterministic."""
    blocks = transcript.blocks
    if not blocks:
        return ""
    kept_verbatim = {text.strip() for text in retained}
    requests: list[TranscriptBlock] = []
    handoffs: list[str] = []
    last_request_at = last_reply_at = -1
    for index, block in enumerate(blocks):
        if block.kind == "assistant" and block.text:
            last_reply_at = index
        if block.kind != "user":
            continue
        prefix = next((p for p in handoff_prefixes if block.text.startswith(p)), None)
        if prefix is None:
            requests.append(block)
            last_request_at = index
        else:
            handoffs.append(block.text[len(prefix) :].strip())
    tools = [b for b in blocks if b.kind == "tool"]

    lines = [EXTRACTIVE_TITLE]
    current = requests[-1:]
    if current and current[0].text.strip() not in kept_verbatim:
        request = _excerpt(current[0].text, _share(max_chars, _REQUEST_SHARE))
        lines.append(f"Current request: {request}")
    if last_reply_at >= 0:
        reply = _excerpt(blocks[last_reply_at].text, _share(max_chars, _REPLY_SHARE))
        when = " (before the current request)" if last_reply_at < last_request_at else ""
        lines.append(f"Last assistant reply{when}: {reply}")
    if tools:
        activity = _clip(_tool_activity(tools), _share(max_chars, _TOOLS_SHARE))
        lines.append(f"Tool activity: {activity}")
        errors = [b for b in tools if b.error]
        if errors:
            last = errors[-1]
            detail = _clip(_leading_lines(last.text, 3), _share(max_chars, _TOOL_ERROR_SHARE))
            lines.append(f"Last tool error ({last.tool_name}): {detail}")
    earlier = [block for block in requests[:-1] if block.text.strip() not in kept_verbatim]
    if earlier:
        lines.extend(_earlier_requests(earlier, _share(max_chars, _EARLIER_SHARE)))
    if handoffs:
        lines.append(
            "Earlier handoff: " + _excerpt(handoffs[-1], _share(max_chars, _HANDOFF_SHARE))
        )
    lines.append(_counts(blocks, transcript.omitted_messages))
    return _clip("\n".join(lines), max_chars)


def _tool_activity(tools: Iterable[TranscriptBlock]) -> str:
    calls: dict[str, int] = {}
    errors: dict[str, int] = {}
    for block in tools:
        calls[block.tool_name] = calls.get(block.tool_name, 0) + 1
        if block.error:
            errors[block.tool_name] = errors.get(block.tool_name, 0) + 1
    parts = []
    for name, count in calls.items():
        failed = errors.get(name, 0)
        parts.append(f"{name} x{count}" + (f" (errors: {failed})" if failed else ""))
    return ", ".join(parts)


def _earlier_requests(requests: Sequence[TranscriptBlock], budget: int) -> list[str]:
    """``Earlier requests:`` and one line per request, newest kept first within ``budget``,
    shown oldest first."""
    shown: list[str] = []
    used = 0
    for block in reversed(requests):
        line = "- " + _clip(_first_line(block.text), _FIRST_LINE_CHARS)
        if shown and used + len(line) + 1 > budget:
            break
        shown.append(line)
        used += len(line) + 1
    shown.reverse()
    hidden = len(requests) - len(shown)
    header = ["Earlier requests:"]
    if hidden:
        header.append(f"- ({hidden} older not shown)")
    return header + shown


def _counts(blocks: Sequence[TranscriptBlock], omitted: int) -> str:
    users = sum(1 for b in blocks if b.kind == "user")
    replies = sum(1 for b in blocks if b.kind == "assistant")
    results = sum(1 for b in blocks if b.kind == "tool")
    text = (
        f"Summarized: {len(blocks)} messages ({users} user, {replies} assistant, "
        f"{results} tool results)"
    )
    if omitted:
        text += f"; {omitted} older messages were not in the request"
    return text + "."


def _share(max_chars: int, fraction: float) -> int:
    return max(int(max_chars * fraction), 40)


def _first_line(text: str) -> str:
    return _leading_lines(text, 1)


def _leading_lines(text: str, count: int) -> str:
    """The first ``count`` non-blank lines, stripped and joined by `` | ``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[:count]) or "(empty)"


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in an ellipsis when cut."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: max(limit - len(ELLIPSIS), 0)].rstrip() + ELLIPSIS


def _excerpt(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters keeping two thirds head and one third tail: the
    ask tends to come first and the latest detail last."""
    text = text.strip()
    if len(text) <= limit:
        return text
    marker = f" {ELLIPSIS} "
    room = max(limit - len(marker), 0)
    head = room * 2 // 3
    tail = room - head
    return text[:head].rstrip() + marker + (text[len(text) - tail :].lstrip() if tail else "")


__all__ = [
    "ELLIPSIS",
    "EXTRACTIVE_MODEL",
    "EXTRACTIVE_TITLE",
    "MIN_MAX_CHARS",
    "ExtractiveSummarizer",
    "extractive_handoff",
]
