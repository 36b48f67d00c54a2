"""The work log: what the log shows the agent did, folded without a model (episodic.worklog)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from episodic import Message, ToolCall
from episodic.tokens import CharHeuristic
from episodic.worklog import (
    INSTRUCTIONS_HEADER,
    WORKLOG_HEADER,
    WorkLog,
    render_instructions,
    render_worklog,
)

ESTIMATOR = CharHeuristic()


def _call(seq: int, call_id: str, name: str, **args: object) -> Message:
    call = ToolCall(id=call_id, name=name, args=args)  # type: ignore[arg-type]
    return Message(role="assistant", tool_calls=(call,), seq=seq)


def _result(seq: int, call_id: str, text: str, *, is_error: bool = False) -> Message:
    return Message(role="tool", tool_call_id=call_id, content=text, is_error=is_error, seq=seq)


def _user(seq: int, text: str) -> Message:
    return Message(role="user", content=text, seq=seq)


SESSION = [
    _user(1, "Fix the double post. A rule for this session: never add a new HTTP client."),
    _call(2, "c1", "run", command="pytest tests/test_sync.py::test_twice -x"),
    _result(
        3,
        "c1",
        "10:01:02 INFO sync.worker[0] request AB-12345 handled in 12 ms\n"
        "FAILED tests/test_sync.py::test_twice - SyncError: LEDGER-E4242: posted twice\n"
        "1 failed, 41 passed in 3.2s",
    ),
    _call(4, "c2", "edit_file", path="src/ledger/sync_42.py", change="guard replays"),
    _result(5, "c2", "ok"),
    _call(6, "c3", "update_account", plan="Team"),
    _result(7, "c3", "updated"),
    _call(8, "c4", "edit_file", path="src/ledger/readme.md"),
]


def test_a_fold_records_files_commands_failures_changes_and_calls_still_open() -> None:
    log = WorkLog().fold(SESSION)
    assert [(f.path, f.action, f.outcome) for f in log.files] == [
        ("src/ledger/sync_42.py", "edit_file", "ok")
    ]
    (command,) = log.commands
    assert command.command == "pytest tests/test_sync.py::test_twice -x"
    assert command.outcome == "1 failed, 41 passed in 3.2s"
    assert command.failed
    # the failure's code is kept, routine log chatter is not
    assert [i.value for i in log.identifiers] == ["LEDGER-E4242"]
    assert [c.call for c in log.changes] == ["update_account(plan=Team)"]
    # a call without a result is open, not a file touched: planned is not done
    assert [c.id for c in log.open_calls] == ["c4"]
    assert [i.text for i in log.instructions] == [
        "A rule for this session: never add a new HTTP client."
    ]


def test_an_error_result_is_shown_as_an_error_and_a_rerun_replaces_what_the_last_run_printed() -> (
    None
):
    log = WorkLog().fold(SESSION)
    log = log.fold(
        [
            _call(9, "c5", "edit_file", path="src/ledger/sync_42.py"),
            _result(10, "c5", "permission denied", is_error=True),
            _call(11, "c6", "run", command="pytest tests/test_sync.py::test_twice -x"),
            _result(12, "c6", "42 passed in 3.0s"),
        ]
    )
    (file,) = log.files
    assert (file.times, file.outcome) == (2, "error: permission denied")
    (command,) = log.commands
    assert (command.runs, command.outcome, command.failed) == (2, "42 passed in 3.0s", False)
    # the code came from the run that the new run replaced
    assert log.identifiers == ()


def test_a_result_after_the_cut_still_finds_its_call() -> None:
    before = WorkLog().fold(SESSION)
    after = before.fold([_result(9, "c4", "ok")])
    assert after.open_calls == ()
    assert [f.path for f in after.files] == ["src/ledger/sync_42.py", "src/ledger/readme.md"]


def test_the_rendering_keeps_its_budget_puts_failures_first_and_counts_what_it_left_out() -> None:
    log = WorkLog().fold(SESSION)
    whole = render_worklog(log, 10_000, ESTIMATOR)
    assert whole.startswith(WORKLOG_HEADER)
    for text in (
        "src/ledger/sync_42.py",
        "LEDGER-E4242",
        "update_account(plan=Team)",
        "edit_file(",
    ):
        assert text in whole
    assert "more in the log" not in whole
    assert "never add a new HTTP client" not in whole  # instructions are rendered apart
    small = render_worklog(log, ESTIMATOR.count(whole) // 2, ESTIMATOR)
    assert ESTIMATOR.count(small) <= ESTIMATOR.count(whole) // 2 + ESTIMATOR.count(
        "(9 more in the log.)"
    )
    assert "more in the log.)" in small
    # every section's first entry before any section's second: the failing command is in
    assert "1 failed, 41 passed" in small
    assert render_worklog(WorkLog(), 1_000, ESTIMATOR) == ""
    assert render_worklog(log, 1, ESTIMATOR) == ""


def test_what_was_said_about_reproducing_it_is_carried_as_said_unless_a_command_says_it() -> None:
    steps = "It reproduces when you open Invoices, filter by Unpaid, then click Send reminders."
    messages = [
        *SESSION,
        Message(role="assistant", content=f"Found ticket WTG-74937. {steps} It is a bug.", seq=9),
        Message(role="assistant", content="Reproduced; the fix goes in src/sync.py.", seq=10),
        Message(
            role="assistant",
            content="Reproduced with `pytest tests/test_sync.py::test_twice -x` above.",
            seq=11,
        ),
        Message(role="tool", tool_call_id="c4", content="It reproduces when you run it.", seq=12),
    ]
    log = WorkLog().fold(messages[:10]).fold(messages[10:])  # across a boundary
    assert [r.text for r in log.reproductions] == [
        steps,
        "Reproduced with `pytest tests/test_sync.py::test_twice -x` above.",
    ]  # not a bare "Reproduced", not a tool's output
    text = render_worklog(log, 10_000, ESTIMATOR)
    assert f"- {steps}" in text
    # the command's own line says it, with what it printed
    assert "Reproduced with" not in text


def test_standing_instructions_render_apart_and_skip_what_is_shown_beside_them() -> None:
    log = WorkLog().fold(SESSION)
    text = render_instructions(log, 1_000, ESTIMATOR)
    assert text.startswith(INSTRUCTIONS_HEADER)
    assert "A rule for this session: never add a new HTTP client." in text
    assert render_instructions(log, 1_000, ESTIMATOR, shown=[SESSION[0].text]) == ""
    assert render_instructions(log, 3, ESTIMATOR) == ""


_texts = st.sampled_from(
    ["ok", "updated", "FAILED x - E-1234 boom", "12:00:00 INFO ABC-9 fine", "1 passed", ""]
)


@st.composite
def _sessions(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    open_ids: list[str] = []
    for seq in range(1, draw(st.integers(0, 24)) + 1):
        move = draw(st.sampled_from(["user", "call", "result"]))
        if move == "result" and open_ids:
            call_id = open_ids.pop(draw(st.integers(0, len(open_ids) - 1)))
            messages.append(_result(seq, call_id, draw(_texts), is_error=draw(st.booleans())))
        elif move == "call":
            call_id = f"c{seq}"
            open_ids.append(call_id)
            kind = draw(st.sampled_from(["edit", "run", "other"]))
            if kind == "edit":
                messages.append(_call(seq, call_id, "edit", path=draw(st.sampled_from("ab"))))
            elif kind == "run":
                messages.append(_call(seq, call_id, "run", command=draw(st.sampled_from("xy"))))
            else:
                messages.append(_call(seq, call_id, "set", value=draw(st.integers(0, 2))))
        else:
            messages.append(_user(seq, draw(st.sampled_from(["hi", "Never push.", "Go on."]))))
    return messages


@settings(max_examples=200, deadline=None)
@given(_sessions(), st.data())
def test_folding_in_steps_is_folding_at_once(messages: list[Message], data: st.DataObject) -> None:
    """A cascade of compactions merges the record exactly: folding up to each cut and then
    what follows gives the record of folding everything at once."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(messages)), max_size=3)))
    log = WorkLog()
    start = 0
    for cut in [*cuts, len(messages)]:
        log = log.fold(messages[start:cut])
        start = cut
    assert log == WorkLog().fold(messages)
    assert WorkLog.model_validate_json(log.model_dump_json()) == log


def test_a_pinned_message_is_one_instruction_kept_until_unpinned() -> None:
    pinned = Message(role="user", content="Reply in French.\nCite the ticket.", seq=9, pinned=True)
    many = [_user(10 + n, f"Always use tool number {n}.") for n in range(150)]
    log = WorkLog().fold([pinned, *many])
    # the whole message, word for word, and never trimmed with the detected ones
    assert log.instructions[0].text == "Reply in French.\nCite the ticket."
    assert log.instructions[0].pinned
    assert len(log.instructions) == 1 + 100
    rendered = render_instructions(log, 10_000, ESTIMATOR).splitlines()
    # the pins first, then the detected sentences, newest first
    assert rendered[1:4] == [
        "- Reply in French.",
        "Cite the ticket.",
        "- Always use tool number 149.",
    ]
    only_pins = render_instructions(log, ESTIMATOR.count("\n".join(rendered[:3])) + 2, ESTIMATOR)
    assert only_pins.splitlines()[1:3] == ["- Reply in French.", "Cite the ticket."]
    detected = render_instructions(WorkLog().fold(many), 10_000, ESTIMATOR)
    assert detected.splitlines()[1] == "- Always use tool number 149."  # the newest first
    # an unpin seen at any later compaction drops it from the carried log
    later = log.fold([_user(200, "next")], unpinned=[9])
    assert not any(i.pinned for i in later.instructions)
    assert not WorkLog().fold(many, detect_instructions=False).instructions
