"""The scripted session ``episodic demo`` plays, read from ``session.json`` beside this file.

It is data: a developer and a coding agent turning a red CI pipeline green, with long, varied
tool output and fixed call ids, so every run of the demo stores the same log and prints the
same figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from pydantic import JsonValue

SESSION_FILE = "session.json"


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    id: str
    name: str
    args: dict[str, JsonValue]
    #: None: the tool never answered (the run ends with the call open)
    result: str | None
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    """One model call: what the assistant said and the tools it called (in parallel)."""

    text: str | None
    calls: tuple[ScriptedCall, ...] = ()


@dataclass(frozen=True, slots=True)
class ScriptedRun:
    """A user request and the agent's turns answering it; the run completes at its end."""

    request: str
    turns: tuple[ScriptedTurn, ...]


def scripted_session() -> list[ScriptedRun]:
    """The session's runs, in order."""
    text = files("episodic.demo").joinpath(SESSION_FILE).read_text(encoding="utf-8")
    return [_run(run) for run in json.loads(text)["runs"]]


def _run(run: dict[str, Any]) -> ScriptedRun:
    return ScriptedRun(
        request=run["request"],
        turns=tuple(
            ScriptedTurn(
                text=turn["text"],
                calls=tuple(ScriptedCall(**call) for call in turn.get("calls", ())),
            )
            for turn in run["turns"]
        ),
    )


__all__ = ["ScriptedCall", "ScriptedRun", "ScriptedTurn", "scripted_session"]
