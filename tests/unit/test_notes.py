"""A handoff's notes: parsed from a model's form, merged across compactions, rendered within a
budget (episodic.notes)."""

from __future__ import annotations

from episodic.notes import Note, drop_echoes, merge_notes, parse_notes, render_notes
from episodic.rendering import TOOL_RESULT_CUT_MARKER
from episodic.tokens import CharHeuristic

ESTIMATOR = CharHeuristic()

FORM_REPLY = """\
## Goal
Fix the double post in the refund job.

## Decisions
- Use a unique index rather than a retry limit, because duplicates slip past the check.

## Next steps
1. Write the regression test test_refund_replay.
2. Deploy to staging-5.

## Reproduce
None

## Facts
- **Client:** aiohttp only

## Done
- The regression test was written.
"""


def test_a_filled_form_becomes_notes_by_section_and_claims_of_done_work_are_dropped() -> None:
    notes = parse_notes(FORM_REPLY, seq=9)
    assert [(n.kind, n.text) for n in notes] == [
        ("goal", "Fix the double post in the refund job."),
        (
            "decision",
            "Use a unique index rather than a retry limit, because duplicates slip past the check.",
        ),
        ("next", "Write the regression test test_refund_replay."),
        ("next", "Deploy to staging-5."),
        ("fact", "Client: aiohttp only"),
    ]
    assert {n.seq for n in notes} == {9}


def test_labelled_lines_and_prose_are_read_too() -> None:
    notes = parse_notes("done\nSome prose first.\nDECISION: keep it\n- NEXT: ship it\nNONE", seq=1)
    assert [(n.kind, n.text) for n in notes] == [
        ("text", "done"),  # a bare word is prose, not the heading "Done"
        ("text", "Some prose first."),
        ("decision", "keep it"),
        ("next", "ship it"),
    ]


def test_merging_keeps_the_earlier_notes_as_written_and_adds_each_new_text_once() -> None:
    first = parse_notes("GOAL: fix it\nFACT: staging-8", seq=3)
    later = parse_notes("FACT: Staging-8\nFACT: staging-5 replaces staging-8", seq=7)
    merged = merge_notes(first, later)
    assert [(n.text, n.seq) for n in merged] == [
        ("fix it", 3),
        ("staging-8", 3),
        ("staging-5 replaces staging-8", 7),
    ]


def test_over_budget_the_first_and_newest_compactions_notes_are_kept_before_the_middle() -> None:
    notes = [Note(kind="fact", text=f"fact number {seq} " + "x" * 40, seq=seq) for seq in range(6)]
    one = ESTIMATOR.count(f"FACT: {notes[0].text}")
    text, kept = render_notes(notes, one * 3, ESTIMATOR)
    # distance from either end: 0 and 5 first, then 1 (written before 4)
    assert [n.seq for n in kept] == [0, 1, 5]
    assert text.splitlines() == [f"FACT: {n.text}" for n in kept]
    assert render_notes(notes, 0, ESTIMATOR) == ("", ())


def test_over_budget_the_first_compactions_notes_outrank_the_newest() -> None:
    # the session's set-up (a pending request said once, at the start) against a side
    # task's decision written by the newest compaction (a kind that outranks next steps
    # within a compaction): the set-up stays
    first = Note(kind="next", text="add a note about the fix to docs/runbook.md", seq=1)
    newest = Note(kind="decision", text="we look at the search worker's log first", seq=9)
    _, kept = render_notes([first, newest], ESTIMATOR.count(f"NEXT: {first.text}"), ESTIMATOR)
    assert kept == (first,)


def test_a_later_compactions_goal_is_left_out_and_the_first_one_kept() -> None:
    # the first compaction saw the session start; a later one's "goal" is its newest request,
    # a detour the retained user messages carry word for word
    first = parse_notes("GOAL: fix the double post\nNEXT: deploy to staging-5", seq=3)
    later = parse_notes("GOAL: check the status log\nFACT: the status log is quiet", seq=9)
    text, kept = render_notes(merge_notes(first, later), 1_000, ESTIMATOR)
    assert [(n.kind, n.seq) for n in kept] == [("goal", 3), ("next", 3), ("fact", 9)]
    assert "status log is quiet" in text
    assert "check the status log" not in text


def test_within_a_compaction_the_goal_and_next_steps_outrank_facts() -> None:
    notes = parse_notes("FACT: " + "f" * 80 + "\nGOAL: fix it\nNEXT: ship it", seq=1)
    _, kept = render_notes(notes, ESTIMATOR.count("GOAL: fix it\nNEXT: ship it") + 2, ESTIMATOR)
    assert [n.kind for n in kept] == ["goal", "next"]


def test_notes_that_copy_the_prompt_back_are_dropped() -> None:
    notes = parse_notes(
        "GOAL: What the user wants done.\n"
        "FACT: Files:\n"
        "FACT: src/app.py: edit_file -> ok\n"
        'FACT: tool calls: run({"command": "ls"})\n'
        "FACT: [user]\n"
        "FACT: shell\n"
        "FACT: src/app.py\n"
        "FACT: User wants the real fix",
        seq=1,
    )
    record = "Record:\nFiles:\n- src/app.py: edit_file -> ok"
    kept = drop_echoes(notes, ("What the user wants done.", record))
    assert [n.text for n in kept] == ["User wants the real fix"]


def test_a_note_that_copies_a_cut_tool_result_is_dropped() -> None:
    # the model copies the head of a result it was shown cut, marker and all
    cut = TOOL_RESULT_CUT_MARKER.format(more=166)
    notes = parse_notes(f"FACT: 16:10:42 IN{cut}\nFACT: The status log shows no outage.", seq=1)
    kept = drop_echoes(notes, ())
    assert [n.text for n in kept] == ["The status log shows no outage."]


def test_a_sentence_that_copies_a_carried_line_is_cut_from_a_note() -> None:
    instruction = "- Email them the receipt for ticket CVT-97782; don't forget that."
    notes = parse_notes(
        "NEXT: Call them back on Thursday. Email them the receipt for ticket CVT-97782; "
        "don't forget that.\n"
        "NEXT: Email them the receipt for ticket CVT-97782; don't forget that.\n"
        "DECISION: Fine. We treat it as a currency mismatch.\n"
        "GOAL: Customer Dr. Okafor was charged twice. Handle it.",
        seq=1,
    )
    pinned = "- Customer Dr. Okafor was charged twice. Handle it. Never refund above 1250."
    shown = ("The user's standing instructions:", instruction, pinned, "Fine.")
    kept = drop_echoes(notes, shown)
    assert [n.text for n in kept] == [
        "Call them back on Thursday.",
        "Fine. We treat it as a currency mismatch.",  # a short sentence is no copy
    ]  # and "Handle it." is all a copy of the pinned message would leave: dropped


def test_a_new_note_that_another_note_already_says_is_left_out() -> None:
    earlier = (Note(kind="next", text="Deploy to staging-5, not staging-8.", seq=4),)
    reply = (
        "## Decisions\n- Next I will write the regression test `test_replay`; not written yet.\n"
        "## Next steps\n- Write the regression test `test_replay`.\n"
        "- Deploy to staging-8.\n- Deploy to staging-9."
    )
    merged = merge_notes(earlier, parse_notes(reply, seq=9))
    assert [n.text for n in merged] == [
        "Deploy to staging-5, not staging-8.",
        "Next I will write the regression test `test_replay`; not written yet.",
        "Deploy to staging-9.",
    ]
