"""Reading a compaction prompt back into message blocks, for summarizers that use no model.

The prompt is ``instructions``, :data:`~episodic.compaction.TRANSCRIPT_HEADER`, an optional
note on left-out messages, then one rendered block per message separated by blank lines (see
:mod:`episodic.rendering`). A block starts at a header line (``[user]``, ``[assistant]``,
``[system]``, ``[tool result ID NAME ok|error]``) at the top or after a blank line. Rendering
is not escaped, so a message whose text holds such a line after a blank line reads as two
blocks: good enough for excerpts, and deterministic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from episodic.compaction import TRANSCRIPT_HEADER
from episodic.rendering import REASONING_HEADER

BlockKind = Literal["user", "assistant", "system", "tool"]

_ROLE_HEADER = re.compile(r"\[(user|assistant|system)\]")
_TOOL_HEADER = re.compile(r"\[tool result (.+) (\S+) (ok|error)\]")
_OMITTED_NOTE = re.compile(r"\[The (\d+) oldest messages? (?:was|were) left out\b.*\]")
_ROLE_KINDS: dict[str, BlockKind] = {"user": "user", "assistant": "assistant", "system": "system"}
_TOOL_CALLS_PREFIX = "tool calls: "
_EMPTY_ASSISTANT = "(empty)"


@dataclass(frozen=True, slots=True)
class TranscriptBlock:
    """One rendered message: its ``kind``, its ``text`` (private reasoning removed; for an
    assistant, without the tool-call line, which is in ``tool_calls``), and for a tool result
    the tool's ``tool_name`` and whether it was an ``error``."""

    kind: BlockKind
    text: str
    tool_calls: str = ""
    tool_name: str = ""
    error: bool = False


@dataclass(frozen=True, slots=True)
class ParsedTranscript:
    """The blocks of a compaction prompt, oldest first, and how many of the oldest messages the
    request left out to fit its limit."""

    blocks: tuple[TranscriptBlock, ...]
    omitted_messages: int = 0


def parse_transcript(prompt: str) -> ParsedTranscript:
    """The message blocks after the transcript header of ``prompt`` (the whole prompt when the
    header is missing)."""
    _, found, rest = prompt.partition(TRANSCRIPT_HEADER)
    text = rest if found else prompt
    blocks: list[TranscriptBlock] = []
    omitted = 0
    header: str | None = None
    body: list[str] = []
    previous_blank = True
    for line in text.splitlines():
        if previous_blank and _is_header(line):
            if header is not None:
                blocks.append(_block(header, body))
            header, body = line, []
        elif header is None:
            note = _OMITTED_NOTE.fullmatch(line.strip())
            if note:
                omitted = int(note.group(1))
        else:
            body.append(line)
        previous_blank = not line.strip()
    if header is not None:
        blocks.append(_block(header, body))
    return ParsedTranscript(blocks=tuple(blocks), omitted_messages=omitted)


def _is_header(line: str) -> bool:
    return bool(_ROLE_HEADER.fullmatch(line) or _TOOL_HEADER.fullmatch(line))


def _block(header: str, lines: list[str]) -> TranscriptBlock:
    if REASONING_HEADER in lines:
        lines = lines[: lines.index(REASONING_HEADER)]
    text = "\n".join(lines).strip("\n")
    tool = _TOOL_HEADER.fullmatch(header)
    if tool:
        return TranscriptBlock(
            kind="tool", text=text, tool_name=tool.group(2), error=tool.group(3) == "error"
        )
    role = _ROLE_HEADER.fullmatch(header)
    kind = _ROLE_KINDS[role.group(1)] if role else "user"
    if kind != "assistant":
        return TranscriptBlock(kind=kind, text=text)
    calls = ""
    body = text.splitlines()
    if body and body[-1].startswith(_TOOL_CALLS_PREFIX):
        calls = body.pop()[len(_TOOL_CALLS_PREFIX) :]
    reply = "\n".join(body).strip()
    return TranscriptBlock(
        kind="assistant", text="" if reply == _EMPTY_ASSISTANT else reply, tool_calls=calls
    )


__all__ = ["BlockKind", "ParsedTranscript", "TranscriptBlock", "parse_transcript"]
