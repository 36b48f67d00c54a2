"""The handoff state a boundary stores, between releases: the writer leaves fields at their
defaults out, and the reader leaves out fields it does not know, at any depth, so during a
rolling upgrade each release's worker builds on the other's boundaries (T17)."""

from __future__ import annotations

import pytest

from episodic.compaction import HandoffState
from episodic.errors import ValidationError
from episodic.notes import Note
from episodic.worklog import CommandEntry, Reproduction, WorkLog

STATE = HandoffState(
    notes=(Note(kind="decision", text="use a unique index", seq=4),),
    worklog=WorkLog(
        commands=(
            CommandEntry(command="pytest -x", runs=2, seq=7, outcome="1 failed", failed=True),
        ),
        reproductions=(Reproduction(text="It reproduces when you open Billing.", seq=3),),
    ),
)


def test_a_stored_state_reads_back_as_it_was() -> None:
    assert HandoffState.from_stored(STATE.stored()) == STATE


def test_fields_at_their_defaults_are_not_written() -> None:
    """A release that predates a field reads the state until the field has a value."""
    assert HandoffState().stored() == {}
    stored = HandoffState(worklog=WorkLog(commands=STATE.worklog.commands)).stored()
    assert set(stored["worklog"]) == {"commands"}


def test_fields_a_newer_release_added_are_left_out_at_every_depth() -> None:
    stored = STATE.stored()
    stored["handoff_version"] = 9
    stored["worklog"]["screenshots"] = [{"path": "a.png", "seq": 2}]
    stored["worklog"]["commands"][0]["exit_code"] = 1
    stored["notes"][0]["confidence"] = 0.5
    assert HandoffState.from_stored(stored) == STATE


def test_a_known_field_with_a_wrong_value_is_still_refused() -> None:
    stored = STATE.stored()
    stored["worklog"]["commands"][0]["runs"] = 0
    with pytest.raises(ValidationError, match="runs"):
        HandoffState.from_stored(stored)
