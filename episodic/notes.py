"""A handoff's narrative as notes that each compaction adds to, instead of a summary of a summary.

The model is shown the notes so far and asked only for what the messages since add, as a
form with a section per kind of note (goal, decisions, next steps, facts). The notes it wrote
before are kept as written, so a fact the first compaction caught survives every later one
unless the budget pushes it out (the compactions in between go first, see
:func:`render_notes`); it is never paraphrased away by a model re-summarizing its own note.
The model is not asked what was done, and a claim it makes anyway is dropped: the record of
the tools' work (:mod:`episodic.worklog`) says that, from the log.

Pure: parsing a reply, merging, rendering within a budget. Nothing here calls a model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import ConfigDict

from episodic.models import EpisodicModel
from episodic.rendering import TOOL_RESULT_CUT_MARKER
from episodic.sentences import split_sentences
from episodic.tokens import TokenEstimator

#: ``text``: a line written under no label (a prompt that asks for prose gets prose back)
NoteKind = Literal["goal", "decision", "fact", "next", "text"]

#: the label the model writes for each kind, in the order notes are rendered
NOTE_LABELS: dict[str, str] = {
    "goal": "GOAL",
    "decision": "DECISION",
    "fact": "FACT",
    "next": "NEXT",
}
#: the form the model fills in: each section's heading, the kind of its notes, what it holds
NOTE_FORM: tuple[tuple[str, NoteKind, str], ...] = (
    ("Goal", "goal", "What the user wants done."),
    ("Decisions", "decision", "Each decision taken, with its reason."),
    (
        "Next steps",
        "next",
        "Steps not done yet, and what the user asked to be done later. What someone plans or "
        "promises to do is not done until a tool result shows it.",
    ),
    (
        "Reproduce",
        "fact",
        "How to reproduce the problem: the command to run, or the steps a person takes "
        '("it reproduces when you ..."), copied word for word.',
    ),
    (
        "Facts",
        "fact",
        "Names and values the record does not hold, and any plan or value the user "
        "changed (the new one, and the one it replaces).",
    ),
)
#: which notes go first when the budget cannot hold them all
_PRIORITY: dict[NoteKind, int] = {"goal": 0, "decision": 1, "next": 2, "fact": 3, "text": 3}
_ORDER: dict[NoteKind, int] = {"goal": 0, "decision": 1, "fact": 2, "next": 3, "text": 4}
#: words a model uses for each label (headings like "## Next steps" or "**Decisions:**")
_SYNONYMS: dict[str, NoteKind | None] = {
    "goal": "goal",
    "goals": "goal",
    "intent": "goal",
    "session intent": "goal",
    "request": "goal",
    "current request": "goal",
    "decision": "decision",
    "decisions": "decision",
    "fact": "fact",
    "facts": "fact",
    "detail": "fact",
    "details": "fact",
    "key facts": "fact",
    "reproduce": "fact",
    "constraint": "fact",
    "constraints": "fact",
    # what was done is the record's to say (read from the log): a model's claim is dropped
    "done": None,
    "progress": None,
    "completed": None,
    "next": "next",
    "next step": "next",
    "next steps": "next",
    "todo": "next",
    "pending": "next",
}
_LABEL = re.compile(
    r"^[\s>*#\-\d.)]*\**\s*(" + "|".join(sorted(map(re.escape, _SYNONYMS), key=len, reverse=True))
    + r")\s*\**\s*[:\-]\s*\**\s*(.*)$",
    re.IGNORECASE,
)  # fmt: skip
_HEADING = re.compile(
    r"^[\s>*#\d.)]*\**\s*(" + "|".join(sorted(map(re.escape, _SYNONYMS), key=len, reverse=True))
    + r")\s*\**\s*:?\s*\**\s*$",
    re.IGNORECASE,
)  # fmt: skip
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_NOTHING = {"none", "nothing", "nothing new", "n/a", "not applicable", "no new notes", "-"}
_WORD = re.compile(r"[a-z0-9][a-z0-9_.:/-]*")
#: a sentence of fewer words is not taken for a copy of a line it occurs in
_MIN_COPIED_WORDS = 3
_NOTE_CHARS = 400
#: a note of fewer words says nothing on its own
_MIN_NOTE_WORDS = 2
#: how a transcript shows calls and results (episodic.rendering), copied back as a note
_MARKUP = re.compile(
    r"^(?:\[(?:user|assistant|system)\]|\[?tool (?:calls|result)\b)", re.IGNORECASE
)

#: the fixed words of a cut tool result's marker: a note holding them copied the transcript's
#: markup, not a finding ("16:10:42 IN [... 166 more characters: the tool record keeps ...")
_CUT_MARKER_KEY = " ".join(_WORD.findall(TOOL_RESULT_CUT_MARKER.partition("{more}")[2].lower()))


class Note(EpisodicModel):
    """One line of the narrative, and the boundary cut it was written at."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: NoteKind
    text: str
    seq: int


def parse_notes(reply: str, *, seq: int) -> tuple[Note, ...]:
    """The notes in a model's reply: labelled lines, and bullets under a heading. Lines before
    any label are kept as they are (a model that ignored the format still said something);
    lines under a label for finished work are dropped (what was done is the record's to say)."""
    notes: list[Note] = []
    kind: NoteKind | None = "text"
    for raw in reply.splitlines():
        line = raw.strip().strip("`").strip()
        if not line:
            continue
        heading = _HEADING.match(line)
        # a heading is marked as one ("## Goal", "**Goal**", "Goal:"); a bare word is prose
        if heading and (line[0] in "#*" or line.rstrip("*").endswith(":")):
            kind = _SYNONYMS[heading.group(1).lower()]
            continue
        labelled = _LABEL.match(line)
        if labelled:
            kind, line = _SYNONYMS[labelled.group(1).lower()], labelled.group(2)
        else:
            line = _BULLET.sub("", line)
        text = _clean(line)
        if kind is not None and text and text.lower().rstrip(".") not in _NOTHING:
            notes.append(Note(kind=kind, text=text, seq=seq))
    return tuple(notes)


def merge_notes(previous: Sequence[Note], new: Sequence[Note]) -> tuple[Note, ...]:
    """``previous`` then ``new``, each text once; a new note every word of which another
    note already holds (a small model says the same thing under two labels: "DECISION: Next
    I will write test_x" and "NEXT: Write test_x") is left out, the earlier notes as
    written."""
    merged = _unique(previous)
    earlier = [_words(note.text) for note in merged]
    said = {_key(note.text) for note in merged}
    fresh = [note for note in _unique(new) if _key(note.text) not in said]
    fresh_words = [_words(note.text) for note in fresh]
    for index, (note, own) in enumerate(zip(fresh, fresh_words, strict=True)):
        if any(own <= words for words in earlier):
            continue
        if any(own < words for other, words in enumerate(fresh_words) if other != index):
            continue
        merged.append(note)
    return tuple(merged)


def _unique(notes: Sequence[Note]) -> list[Note]:
    """``notes`` with each text once (the first)."""
    seen: set[str] = set()
    unique: list[Note] = []
    for note in notes:
        if _key(note.text) not in seen:
            seen.add(_key(note.text))
            unique.append(note)
    return unique


def drop_echoes(notes: Sequence[Note], texts: Sequence[str]) -> tuple[Note, ...]:
    """``notes`` without those that only repeat a line of ``texts`` (what the prompt showed the
    model: a small model copies the form's descriptions and the record back), the
    transcript's markup ("tool calls: ...", a cut result's marker), bare headings ("Files:")
    and single words under a label ("FACT: shell"); prose is kept as the model wrote it."""
    shown = [_key(line) for text in texts for line in text.splitlines() if line.strip()]
    trimmed = (note if note.kind == "text" else _uncopied(note, shown) for note in notes)
    return tuple(
        note
        for note in trimmed
        if note is not None
        and (note.kind == "text" or len(_key(note.text).split()) >= _MIN_NOTE_WORDS)
        and not any(_echoes(note, line) for line in shown)
        and not note.text.endswith(":")
        and not _MARKUP.match(note.text)
        and _CUT_MARKER_KEY not in _key(note.text)
    )


def _uncopied(note: Note, shown: Sequence[str]) -> Note | None:
    """``note`` without the sentences that copy a shown line (keys) whole: "Call them back on
    Thursday. Email the receipt; don't forget that." beside a carried instruction that says
    the second sentence keeps the first. None when every sentence is a copy."""
    sentences = split_sentences(note.text)
    kept = [sentence for sentence in sentences if not _copies(sentence, shown)]
    if len(kept) == len(sentences):
        return note
    # what is left of a copy ("Handle it.") says nothing on its own
    if not any(len(_key(sentence).split()) >= _MIN_COPIED_WORDS for sentence in kept):
        return None
    return note.model_copy(update={"text": " ".join(kept)})


def _copies(sentence: str, shown: Sequence[str]) -> bool:
    key = _key(sentence)
    if len(key.split()) < _MIN_COPIED_WORDS:
        return False  # "Fine." or "Done." is in many lines and copies none of them
    return any(f" {key} " in f" {line} " for line in shown)


def _echoes(note: Note, line: str) -> bool:
    """Whether ``note`` copies ``line`` (a key): prose only when it is the whole line (a
    one-word reply like "done" is a reply), a labelled note when it is any part of it."""
    key = _key(note.text)
    return key == line if note.kind == "text" else key in line


def render_notes(
    notes: Sequence[Note], budget: int, estimator: TokenEstimator
) -> tuple[str, tuple[Note, ...]]:
    """The notes as labelled lines within ``budget`` tokens, and the notes that fit (what a
    boundary keeps for the next compaction). When they do not all fit, the earliest and the
    newest compactions' notes are kept first (the first's before the newest's), and within
    those the most important kinds; the lines are grouped by kind, in the order they were
    written."""
    # The first compaction's notes set the session up (the task, the decisions taken, what
    # the user asked to be done at the end) and the newest say where it is: the notes of the
    # compactions in between go first, then by kind. A note left out here is left out of
    # the boundary's state for good, so the set-up is never traded for a side task's note.
    seqs = sorted({note.seq for note in notes})
    distance = {seq: at and 1 + min(at, len(seqs) - 1 - at) for at, seq in enumerate(seqs)}
    first = seqs[0] if seqs else 0

    def rank(i: int) -> tuple[int, int, int]:
        return (distance[notes[i].seq], _PRIORITY[notes[i].kind], i)

    # The session's goal is set where the notes start. A later compaction sees a window whose
    # newest request is mostly a detour ("check the status log"), and the newest request is
    # kept word for word beside the handoff anyway: its "goal" is left out (in bench/handoff,
    # 7 of the 10 later goals of two runs were side requests, 3 restated the pinned task).
    ranked = sorted(
        (i for i, note in enumerate(notes) if note.kind != "goal" or note.seq == first),
        key=rank,
    )
    chosen: set[int] = set()
    used = 0
    for index in ranked:
        cost = estimator.count(_line(notes[index]))
        if used + cost > budget:
            continue
        chosen.add(index)
        used += cost
    kept = tuple(note for index, note in enumerate(notes) if index in chosen)
    lines = [_line(note) for note in sorted(kept, key=lambda note: _ORDER[note.kind])]
    return "\n".join(lines), kept


def _line(note: Note) -> str:
    return note.text if note.kind == "text" else f"{NOTE_LABELS[note.kind]}: {note.text}"


def _clean(text: str) -> str:
    text = re.sub(r"\*\*|__", "", text).strip().strip("-").strip()
    return text if len(text) <= _NOTE_CHARS else text[: _NOTE_CHARS - 3] + "..."


def _key(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def _words(text: str) -> set[str]:
    """The words of ``text``, lower case, without the punctuation that ends a sentence."""
    return {word.rstrip(".:/-") for word in _WORD.findall(text.lower())}


__all__ = [
    "NOTE_FORM",
    "NOTE_LABELS",
    "Note",
    "NoteKind",
    "drop_echoes",
    "merge_notes",
    "parse_notes",
    "render_notes",
]
