"""Claude Code's transcript lines as the log keeps them (episodic.integrations.claude_agent),
and its own compactions among them.

Each line the Claude Agent SDK mirrors is one message holding the line whole in ``native``
under :data:`ENTRY_PROTOCOL`. Claude Code compacts on its own: it writes a ``system`` line
with subtype ``compact_boundary`` (then the summary as a user line marked
``isCompactSummary``). :func:`claude_compaction` finds such a line, so ``episodic show`` and
the inspector show it as the boundary it is, though the log holds it as a message: episodic
is the mirror of that session, not its compactor. Pure, and free of the SDK, which only the
integration imports.
"""

from __future__ import annotations

from dataclasses import dataclass

from episodic.models import Message

#: The ``native.protocol`` of a message holding one transcript line, whole.
ENTRY_PROTOCOL = "claude-agent-sdk.entry"


@dataclass(frozen=True, slots=True)
class ClaudeCompaction:
    """A compaction Claude Code recorded in its transcript."""

    #: "auto" or "manual", as Claude Code wrote it (None when it wrote none)
    trigger: str | None
    #: the context's tokens before it, and after it when Claude Code says
    pre_tokens: int | None
    post_tokens: int | None


def claude_compaction(message: Message) -> ClaudeCompaction | None:
    """The compaction ``message`` records, when it holds Claude Code's ``compact_boundary``
    line; else None."""
    native = message.native
    if native is None or native.protocol != ENTRY_PROTOCOL:
        return None
    line = native.data
    if line.get("type") != "system" or line.get("subtype") != "compact_boundary":
        return None
    meta = line.get("compactMetadata")
    meta = meta if isinstance(meta, dict) else {}
    trigger = meta.get("trigger")
    return ClaudeCompaction(
        trigger=trigger if isinstance(trigger, str) else None,
        pre_tokens=_count(meta.get("preTokens")),
        post_tokens=_count(meta.get("postTokens")),
    )


def describe_compaction(compaction: ClaudeCompaction) -> str:
    """One line about it (``episodic show``, the inspector)."""
    parts = [compaction.trigger or "trigger not recorded"]
    if compaction.pre_tokens is not None:
        after = f" -> {compaction.post_tokens:,}" if compaction.post_tokens is not None else ""
        parts.append(f"{compaction.pre_tokens:,}{after} tokens")
    return f"Claude Code compaction boundary ({', '.join(parts)})"


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = ["ENTRY_PROTOCOL", "ClaudeCompaction", "claude_compaction", "describe_compaction"]
