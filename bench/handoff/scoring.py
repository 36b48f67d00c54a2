"""Scores computed by code from what the model saw and said; the model never grades itself.

- *context recall*: a probe's keys all appear, normalised, in the model-visible context.
- *answer recall*: the model, given only that context and the probes' questions (one call,
  numbered), answers with every key of the probe; for a ``planned_not_done`` probe, answers
  "no".
- *false done*: a ``planned_not_done`` probe answered "yes".
- *search recall@5* (compactors that keep a searchable log): one of the five events a
  search for the probe's question returns holds every key.
- *answer recall with search*: the model answers, given the context and, under each
  question, excerpts of those five events.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from bench.handoff.sessions import Probe
from episodic import Message
from episodic.search import excerpt, query_terms
from episodic.worklog import WORKLOG_HEADER

_NOT_WORD = re.compile(r"[^0-9a-z]+")
_NUMBERED = re.compile(r"^\s*(?:\*\*)?(\d{1,2})[.):]\s*(.*)$")


def normalise(text: str) -> str:
    """Lower case, every run of other characters one space, padded by spaces (so a key
    matches whole words only: ``staging 7`` is not in ``staging 17``)."""
    return f" {_NOT_WORD.sub(' ', text.lower()).strip()} "


def holds(text: str, keys: Sequence[str]) -> bool:
    """Whether ``text`` holds every key."""
    said = normalise(text)
    return all(normalise(key) in said for key in keys)


def render(messages: Sequence[Message]) -> str:
    """The context as one text, the same way for every compactor: a line per message (its
    role, its text, its tool calls), nothing cut."""
    lines = []
    for message in messages:
        text = message.text
        parts = [text] if text else []
        parts += [f"[calls {call.name}({call.arguments_text()})]" for call in message.tool_calls]
        who = f"tool {message.name}" if message.role == "tool" and message.name else message.role
        lines.append(f"{who}: {' '.join(parts)}")
    return "\n".join(lines)


#: how much of each search hit the model is shown under a question, in characters
HIT_CHARS = 240


def questions_prompt(
    context: str, probes: Sequence[Probe], found: Sequence[Sequence[str]] | None = None
) -> str:
    """One user message: the instructions and every probe's question, numbered, then the
    context. The fixed part comes first so that a server which keeps the prompts it has
    seen (llama.cpp's cache) computes it once per session, not once per context. With
    ``found`` (each question's search hits), the hits follow the context, by question,
    each cut to :data:`HIT_CHARS` around the question's words."""
    asked = "\n".join(f"{n}. {probe.question}" for n, probe in enumerate(probes, start=1))
    searched = ""
    if found is not None:
        blocks = []
        for n, (probe, hits) in enumerate(zip(probes, found, strict=True), start=1):
            terms = query_terms(probe.question)
            shown = "\n".join(f"- {excerpt(' '.join(h.split()), terms, HIT_CHARS)}" for h in hits)
            blocks.append(f"For question {n}:\n{shown or '(nothing found)'}")
        searched = (
            "\n\n<search results>\nEarlier messages of this conversation that a search for "
            "each question found:\n" + "\n".join(blocks) + "\n</search results>"
        )
    return (
        "You are the agent of the session below (its earlier part may have been summarized). "
        "Answer each of these questions from the conversation alone, as briefly as possible: "
        "the exact identifier, file, command or value where one is asked. If the "
        "conversation does not say, answer 'unknown'.\n\n"
        f"{asked}\n\n<conversation>\n{context}\n</conversation>{searched}\n\n"
        f"Now answer questions 1 to {len(probes)}: one line a question, each starting with "
        "its number."
    )


def parse_answers(reply: str, count: int) -> list[str]:
    """The reply's answers by number (1..count); a missing one is empty. A reply with no
    numbers at all (small models often answer one line a question, unnumbered) is read a
    line a question, in order."""
    answers = [""] * count
    current: int | None = None
    for line in reply.splitlines():
        match = _NUMBERED.match(line)
        if match and 1 <= int(match.group(1)) <= count:
            current = int(match.group(1)) - 1
            answers[current] = match.group(2).strip()
        elif current is not None and line.strip():
            answers[current] = f"{answers[current]} {line.strip()}".strip()
    if current is None:
        lines = [line.strip() for line in reply.splitlines() if line.strip()]
        answers = (lines + [""] * count)[:count]
    return answers


def says_yes(answer: str, question: str = "") -> bool | None:
    """True for a yes, False for a no (or "not yet"), None when it says neither. A reply
    that repeats the question before answering it (small models do) is read after it."""
    said = normalise(answer)
    asked = normalise(question.split("?", 1)[0])
    if question and said.startswith(asked):
        said = f" {said[len(asked) :]}"
    if said.startswith((" no ", " not ")) or " not yet " in said or " not been " in said:
        return False
    if said.startswith((" yes ", " it has ", " done ")):
        return True
    return None


@dataclass(frozen=True, slots=True)
class ProbeScore:
    kind: str
    in_context: bool
    answered: bool
    false_done: bool
    #: None where the compactor keeps no searchable log, or the model was not asked
    searched: bool | None = None
    answered_with_search: bool | None = None
    #: for a planned-not-done probe in a handoff with a tool record (episodic's): whether
    #: the record names the planned work, i.e. shows it as done; None otherwise
    record_claims_done: bool | None = None


def _answered(probe: Probe, answer: str) -> tuple[bool, bool]:
    """Whether ``answer`` answers the probe, and whether it is a false done."""
    if probe.kind == "planned_not_done":
        verdict = says_yes(answer, probe.question)
        return verdict is False, verdict is True
    return holds(answer, probe.keys), False


def score(
    probes: Sequence[Probe],
    context: str,
    answers: Sequence[str],
    found: Sequence[Sequence[str]] | None = None,
    answers_with_search: Sequence[str] | None = None,
) -> list[ProbeScore]:
    """Each probe's scores from the context text and the model's answers; and with
    ``found`` (each question's search hits), from those hits and the answers given them."""
    scores = []
    record = tool_record(context)
    for index, (probe, answer) in enumerate(zip(probes, answers, strict=True)):
        answered, false_done = _answered(probe, answer)
        searched = with_search = None
        if found is not None:
            searched = any(holds(hit, probe.keys) for hit in found[index])
        if answers_with_search is not None:
            with_search = _answered(probe, answers_with_search[index])[0]
        claimed = (
            holds(record, probe.keys)
            if record is not None and probe.kind == "planned_not_done"
            else None
        )
        scores.append(
            ProbeScore(
                probe.kind,
                holds(context, probe.keys),
                answered,
                false_done,
                searched,
                with_search,
                claimed,
            )
        )
    return scores


def tool_record(context: str) -> str | None:
    """The derived record of a handoff in ``context`` (from its header to the next blank
    line), or None when there is none."""
    start = context.find(WORKLOG_HEADER)
    if start < 0:
        return None
    end = context.find("\n\n", start)
    return context[start : end if end >= 0 else len(context)]
