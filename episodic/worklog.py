"""What the log shows the agent did, derived without a model and carried across boundaries.

A :class:`WorkLog` is folded from messages: the files the agent's tool calls named and the
last thing done to each, the other changes its tools made, the commands it ran with the last
line each printed, identifiers and error codes seen in tool output, the calls still waiting
for a result, and the user's standing instructions. A boundary stores the log folded up to
its cut; the next compaction folds the messages after the cut into it, so a cascade of
compactions merges exact records instead of summarizing a summary.

Everything here is read off tool calls and their results, never off what a model wrote: a
planned edit is not a done edit. A call counts as done only once its result is in the log,
and a result marked as an error is shown as one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Annotated, TypeAlias, TypeVar

from pydantic import ConfigDict, Field, JsonValue

from episodic.models import EpisodicModel, Message, ToolCall
from episodic.sentences import split_sentences
from episodic.tokens import TokenEstimator

_FROZEN = ConfigDict(frozen=True, extra="forbid")

#: argument names whose value is a file the call works on
_PATH_ARGS = ("path", "file", "file_path", "filepath", "filename", "target_file", "paths")
#: argument names whose value is a shell command
_COMMAND_ARGS = ("command", "cmd", "script")
#: a result this short is an acknowledgement (a change made); a longer one is data read
_ACK_CHARS = 80
#: identifier-like words: letters and digits joined by - or _, with a digit somewhere
_IDENTIFIER = re.compile(r"\b(?=[A-Za-z0-9_-]*\d)[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)+\b")
#: a log line's leading timestamp (routine chatter unless it reports a failure)
_TIMESTAMP = re.compile(r"^\s*\[?(?:\d{4}-\d{2}-\d{2}[T ])?\d{2}:\d{2}:\d{2}")
_FAILURE = re.compile(
    r"\b(?:fail(?:ed|ure|s)?|errors?|exception|traceback|fatal|panic|denied|refused|"
    r"timed? ?out|duplicat\w*|invalid|cannot|unable)\b",
    re.IGNORECASE,
)
#: words that make a user's sentence a standing instruction rather than a request
_STANDING = re.compile(
    r"\b(?:always|never|only|do not|don't|must not|must|from now on|for this whole|"
    r"standing rule|rule for|remember to|(?:don't|do not) forget)\b",
    re.IGNORECASE,
)
#: a sentence of the user or the agent that says how the problem reproduces: "It reproduces
#: when you ...", "Reproduced with `...`", "To reproduce: ...", "repro steps: ..." (not a bare
#: "Reproduced." or "Reproduced; the fix goes in x.py", which say that, not how)
_REPRODUCES = re.compile(
    r"\b(?:to reproduce|repro(?:duction)? steps|reproduc\w*(?:\s+(?:it|this|that|the \w+))?"
    r"(?:\s*:|\s+(?:when|with|by|using|via|if|after|on|in)\b))",
    re.IGNORECASE,
)
_LINE_CHARS = 160
#: the characters of an output line kept around an identifier seen on it (the words that say
#: what it is; the rest of the line is in the log)
_AROUND_CHARS = 48
#: the newest entries a section keeps (a boundary stores the log: it must not grow without
#: bound; older entries are still in the log itself)
MAX_ENTRIES = 100


class FileEntry(EpisodicModel):
    """A file a tool call named: what was last done to it and how that ended."""

    model_config = _FROZEN
    path: str
    action: str
    times: Annotated[int, Field(ge=1)]
    seq: int
    outcome: str


class ChangeEntry(EpisodicModel):
    """A call whose result was an acknowledgement (the tool changed something)."""

    model_config = _FROZEN
    call: str
    times: Annotated[int, Field(ge=1)]
    seq: int
    outcome: str


class CommandEntry(EpisodicModel):
    """A command a tool ran, and the last line its latest run printed."""

    model_config = _FROZEN
    command: str
    runs: Annotated[int, Field(ge=1)]
    seq: int
    outcome: str
    failed: bool


class IdentifierEntry(EpisodicModel):
    """An identifier or error code seen in tool output, with the line it was seen on."""

    model_config = _FROZEN
    value: str
    line: str
    seq: int
    failing: bool
    #: the command whose run printed it: its next run replaces what it printed
    command: str | None = None


class OpenCall(EpisodicModel):
    """A call with no result yet (kept whole: its result may come after the next cut)."""

    model_config = _FROZEN
    id: str
    name: str
    args: dict[str, JsonValue] = Field(default_factory=dict)
    seq: int

    def as_call(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.name, args=self.args)


class Instruction(EpisodicModel):
    """A standing instruction of the user: a whole message the application pinned, or a
    sentence that reads as one (see :data:`_STANDING`)."""

    model_config = _FROZEN
    text: str
    seq: int
    #: the application pinned the message (carried until unpinned; never trimmed)
    pinned: bool = False


class Reproduction(EpisodicModel):
    """A sentence of the user or the agent that says how the problem reproduces ("It
    reproduces when you open Billing, ..."), as said: a model asked to copy such steps word
    for word leaves them out (measured in bench/handoff: the 1.5B model wrote none of the
    support sessions' steps at any depth)."""

    model_config = _FROZEN
    text: str
    seq: int


class WorkLog(EpisodicModel):
    """The record a boundary carries (see the module docstring). Entries are kept newest
    last; :func:`render_worklog` orders them for reading."""

    model_config = _FROZEN
    files: tuple[FileEntry, ...] = ()
    changes: tuple[ChangeEntry, ...] = ()
    commands: tuple[CommandEntry, ...] = ()
    identifiers: tuple[IdentifierEntry, ...] = ()
    open_calls: tuple[OpenCall, ...] = ()
    instructions: tuple[Instruction, ...] = ()
    reproductions: tuple[Reproduction, ...] = ()

    def fold(
        self,
        messages: Sequence[Message],
        *,
        unpinned: Collection[int] = (),
        detect_instructions: bool = True,
    ) -> WorkLog:
        """This log with ``messages`` (oldest first) folded in. A message without a seq
        takes its position after the newest seq seen so far. A pinned user message is an
        instruction until its seq is among ``unpinned``; with ``detect_instructions``, so is
        any user sentence that reads as a standing rule."""
        folding = _Folding(self, detect_instructions=detect_instructions)
        for message in messages:
            folding.add(message)
        return folding.result(unpinned)


_Dated: TypeAlias = (
    FileEntry | ChangeEntry | CommandEntry | IdentifierEntry | OpenCall | Instruction | Reproduction
)


class _Folding:
    def __init__(self, log: WorkLog, *, detect_instructions: bool) -> None:
        self.detect_instructions = detect_instructions
        self.files = {entry.path: entry for entry in log.files}
        self.changes = {entry.call: entry for entry in log.changes}
        self.commands = {entry.command: entry for entry in log.commands}
        self.identifiers = {entry.value: entry for entry in log.identifiers}
        self.instructions = {entry.text: entry for entry in log.instructions}
        self.open = {entry.id: entry for entry in log.open_calls}
        self.reproductions = {entry.text: entry for entry in log.reproductions}
        groups: tuple[Sequence[_Dated], ...] = (
            log.files, log.changes, log.commands, log.identifiers, log.open_calls,
            log.instructions, log.reproductions,
        )  # fmt: skip
        self.seq = max((entry.seq for group in groups for entry in group), default=0)

    def add(self, message: Message) -> None:
        self.seq = message.seq if message.seq is not None else self.seq + 1
        if message.role == "user" and message.pinned:
            text = message.text.strip()
            _newest(self.instructions, text, Instruction(text=text, seq=self.seq, pinned=True))
        if message.role in ("user", "assistant"):
            sentences = split_sentences(message.text)  # once, for the rules and the repro
            if message.role == "user" and not message.pinned and self.detect_instructions:
                self._instructions(sentences)
            for sentence in sentences:
                if _REPRODUCES.search(sentence):
                    entry = Reproduction(text=_clip(sentence), seq=self.seq)
                    _newest(self.reproductions, entry.text, entry)
        for call in message.tool_calls:
            self.open[call.id] = OpenCall(id=call.id, name=call.name, args=call.args, seq=self.seq)
        if message.role == "tool" and message.tool_call_id is not None:
            waiting = self.open.pop(message.tool_call_id, None)
            if waiting is not None:
                self._result(waiting.as_call(), message)

    def _instructions(self, sentences: Sequence[str]) -> None:
        for sentence in sentences:
            found = self.instructions.get(sentence)
            if _STANDING.search(sentence) and not (found is not None and found.pinned):
                _newest(self.instructions, sentence, Instruction(text=sentence, seq=self.seq))

    def _result(self, call: ToolCall, result: Message) -> None:
        text = result.text.strip()
        failed = result.is_error or bool(_FAILURE.search(_last_line(text)))
        outcome = _outcome(text, result.is_error)
        command = _command_of(call)
        if command is not None:
            runs = self.commands[command].runs + 1 if command in self.commands else 1
            _newest(
                self.commands,
                command,
                CommandEntry(
                    command=command, runs=runs, seq=self.seq, outcome=outcome, failed=failed
                ),
            )
            for value in [v for v, e in self.identifiers.items() if e.command == command]:
                del self.identifiers[value]
        self._identifiers(text, command)
        paths = _paths_of(call)
        for path in paths:
            times = self.files[path].times + 1 if path in self.files else 1
            _newest(
                self.files,
                path,
                FileEntry(path=path, action=call.name, times=times, seq=self.seq, outcome=outcome),
            )
        if command is None and not paths and len(text) <= _ACK_CHARS:
            key = _call_text(call)
            times = self.changes[key].times + 1 if key in self.changes else 1
            _newest(
                self.changes, key, ChangeEntry(call=key, times=times, seq=self.seq, outcome=outcome)
            )

    def _identifiers(self, text: str, command: str | None) -> None:
        for line in text.splitlines():
            failing = bool(_FAILURE.search(line))
            if _TIMESTAMP.match(line) and not failing:
                continue  # routine log chatter
            values = [v for v in _IDENTIFIER.findall(line) if not _looks_like_path_part(line, v)]
            # One excerpt per line, around its first identifier, so the identifiers seen on
            # one line are shown together on it.
            excerpt = _around(line.strip(), values[0]) if values else ""
            for value in values:
                _newest(
                    self.identifiers,
                    value,
                    IdentifierEntry(
                        value=value,
                        line=excerpt,
                        seq=self.seq,
                        failing=failing,
                        command=command,
                    ),
                )

    def result(self, unpinned: Collection[int]) -> WorkLog:
        def newest(entries: dict[str, _Entry]) -> tuple[_Entry, ...]:
            return tuple(entries.values())[-MAX_ENTRIES:]

        gone = set(unpinned)
        # Pinned instructions stay until unpinned, however many there are; the application
        # chose them. Only the detected ones are trimmed.
        pinned = {k: i for k, i in self.instructions.items() if i.pinned and i.seq not in gone}
        detected = {k: i for k, i in self.instructions.items() if not i.pinned}
        return WorkLog(
            files=newest(self.files),
            changes=newest(self.changes),
            commands=newest(self.commands),
            identifiers=newest(self.identifiers),
            open_calls=newest(self.open),
            instructions=tuple(pinned.values()) + newest(detected),
            reproductions=newest(self.reproductions),
        )


_Entry = TypeVar("_Entry", bound=EpisodicModel)


def _newest(entries: dict[str, _Entry], key: str, entry: _Entry) -> None:
    """``entry`` under ``key``, moved to the newest place (a dict keeps insertion order, and
    the log keeps its entries newest last)."""
    entries.pop(key, None)
    entries[key] = entry


def _call_text(call: ToolCall) -> str:
    args = ", ".join(f"{key}={_scalar(value)}" for key, value in call.args.items())
    return _clip(f"{call.name}({args})")


def _scalar(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def _command_of(call: ToolCall) -> str | None:
    for key in _COMMAND_ARGS:
        value = call.args.get(key)
        if isinstance(value, str) and value.strip():
            return _clip(value.strip())
    return None


def _paths_of(call: ToolCall) -> list[str]:
    found: list[str] = []
    for key in _PATH_ARGS:
        value = call.args.get(key)
        values = value if isinstance(value, list) else [value]
        found += [v.strip() for v in values if isinstance(v, str) and v.strip()]
    return found


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _outcome(text: str, is_error: bool) -> str:
    last = _clip(_last_line(text)) or "(no output)"
    return f"error: {last}" if is_error else last


def _looks_like_path_part(line: str, value: str) -> bool:
    """``test_sync_entries_42`` inside ``tests/x/test_sync_entries_42.py``: part of a path,
    which the files and commands already carry."""
    at = line.find(value)
    before = line[at - 1] if at > 0 else ""
    after = line[at + len(value) : at + len(value) + 1]
    return (before != "" and before in "/.") or (after != "" and after in "/.")


def _around(line: str, value: str) -> str:
    """The part of ``line`` around ``value``: the words that say what it is, not the whole
    line (a test runner's failure line repeats the test's path before the error)."""
    if len(line) <= _AROUND_CHARS:
        return line
    at = line.find(value)
    start = max(0, min(at - _AROUND_CHARS // 4, len(line) - _AROUND_CHARS))
    piece = line[start : start + _AROUND_CHARS]
    return ("..." if start else "") + piece + ("..." if start + _AROUND_CHARS < len(line) else "")


def _clip(text: str) -> str:
    return text if len(text) <= _LINE_CHARS else text[: _LINE_CHARS - 3] + "..."


# ---- rendering -----------------------------------------------------------------------------

WORKLOG_HEADER = "Record from the log, exact:"
INSTRUCTIONS_HEADER = "Standing instructions, verbatim:"


def render_instructions(
    log: WorkLog, budget: int, estimator: TokenEstimator, *, shown: Sequence[str] = ()
) -> str:
    """The user's standing instructions within ``budget`` tokens: the pinned ones, in the
    order they were given, then the sentences detected as rules or reminders, newest first.
    Those found word for word in ``shown`` (the user messages the context keeps beside the
    handoff) are not repeated. Empty when there are none to show.

    Detected sentences come after the pins, within what the pins leave of the budget: an
    application pins the rules it knows of, and a reminder said in passing ("... at the end;
    don't forget that") is not one of them (measured in bench/handoff: pins alone lost that
    request in 1 of 4 sessions by depth 8, to a note the model left out)."""
    beside = [" ".join(text.split()) for text in shown]
    chosen = [
        *sorted((i for i in log.instructions if i.pinned), key=lambda i: i.seq),
        *sorted((i for i in log.instructions if not i.pinned), key=lambda i: -i.seq),
    ]
    entries = [
        f"- {i.text}"
        for i in chosen
        if not any(" ".join(i.text.split()) in text for text in beside)
    ]
    return _render(INSTRUCTIONS_HEADER, [("", entries)], budget, estimator)


def render_worklog(log: WorkLog, budget: int, estimator: TokenEstimator) -> str:
    """The files, commands, what was said about reproducing the problem, errors, changes and
    waiting calls, within ``budget`` tokens: within each section the most relevant first
    (failures, then the most touched and the newest), each section's first entries before any
    section's later ones, and a count of the entries left out. Empty when there are none or
    the budget holds no entry."""
    commands = [c.command for c in log.commands]
    sections = [
        ("Files", [
            f"- {f.path}: {f.action}" + (f" x{f.times}" if f.times > 1 else "") + f" -> {f.outcome}"
            for f in sorted(log.files, key=lambda f: (-f.times, -f.seq))
        ]),
        ("Commands run", [
            f"- `{c.command}`" + (f" x{c.runs}" if c.runs > 1 else "") + f" -> {c.outcome}"
            for c in sorted(log.commands, key=lambda c: (not c.failed, -c.seq))
        ]),
        # a sentence naming a command the record lists says no more than its line does
        ("Reproduction, as said", [
            f"- {r.text}"
            for r in sorted(log.reproductions, key=lambda r: -r.seq)
            if not any(command in r.text for command in commands)
        ]),
        ("Errors and ids seen", _identifier_lines(log.identifiers)),
        ("Changes made", [
            f"- {c.call}" + (f" x{c.times}" if c.times > 1 else "") + f" -> {c.outcome}"
            for c in sorted(log.changes, key=lambda c: (-c.times, -c.seq))
        ]),
        ("Calls awaiting a result", [
            f"- {_call_text(c.as_call())}" for c in sorted(log.open_calls, key=lambda c: -c.seq)
        ]),
    ]  # fmt: skip
    return _render(WORKLOG_HEADER, sections, budget, estimator)


def _render(
    header: str,
    sections: Sequence[tuple[str, Sequence[str]]],
    budget: int,
    estimator: TokenEstimator,
) -> str:
    """``header`` and the sections' entries that fit in ``budget`` (a section titled "" has
    no heading line). Round by round: every section's first entry before any section's
    second, so one busy section (a run of routine commands) cannot crowd out the others'
    most relevant entries."""
    used = estimator.count(header)
    taken: list[list[str]] = [[] for _ in sections]
    full = [not entries for _, entries in sections]
    for rank in range(max((len(entries) for _, entries in sections), default=0)):
        for index, (title, entries) in enumerate(sections):
            if full[index] or rank >= len(entries):
                continue
            heading = estimator.count(f"{title}:") if title and not rank else 0
            cost = estimator.count(entries[rank]) + heading
            if used + cost > budget:
                full[index] = True  # the section keeps its order: nothing after a gap
                continue
            taken[index].append(entries[rank])
            used += cost
    lines = [header]
    for (title, _), kept in zip(sections, taken, strict=True):
        if kept:
            lines += [f"{title}:", *kept] if title else kept
    if len(lines) == 1:
        return ""
    left_out = sum(len(entries) for _, entries in sections) - sum(map(len, taken))
    if left_out:
        lines.append(f"({left_out} more in the log.)")
    return "\n".join(lines)


def _identifier_lines(identifiers: Sequence[IdentifierEntry]) -> list[str]:
    """A line per line of output, naming every identifier seen on it that its excerpt does
    not show: failures first, then the newest."""
    by_line: dict[str, list[IdentifierEntry]] = {}
    for entry in sorted(identifiers, key=lambda i: (not i.failing, -i.seq)):
        by_line.setdefault(entry.line, []).append(entry)
    lines = []
    for line, entries in by_line.items():
        # an identifier the excerpt shows is not named again before it
        unseen = [e.value for e in entries if e.value not in line]
        lines.append(f"- {', '.join(unseen)}: {line}" if unseen else f"- {line}")
    return lines


__all__ = [
    "INSTRUCTIONS_HEADER",
    "WORKLOG_HEADER",
    "ChangeEntry",
    "CommandEntry",
    "FileEntry",
    "IdentifierEntry",
    "Instruction",
    "OpenCall",
    "Reproduction",
    "WorkLog",
    "render_instructions",
    "render_worklog",
]
