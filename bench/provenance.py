"""Where the figures come from: the episodic checkout measured, and clean stops on signals."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType


def episodic_source() -> str:
    """Where ``episodic`` was imported from, and its git commit when that is a checkout."""
    import episodic

    root = Path(episodic.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "episodic", "migrations"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return f"{root} at {commit}{' with uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return str(root)


def terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that reproduces this run (``python -m <module> ...``), from the current
    directory."""
    python = sys.executable or "python"
    if not os.path.relpath(python).startswith(".."):
        python = os.path.relpath(python)
    rest = sys.argv[1:] if argv is None else argv
    return f"cd {shlex.quote(os.getcwd())} && {shlex.join([python, '-m', module, *rest])}"


def run_facts(meta: Mapping[str, str]) -> list[str]:
    """The markdown lines that say when, where and how a run was made."""
    return [
        f"- date: {meta['date']}",
        f"- machine: {meta['nproc']} CPUs (nproc), {meta['memory']} memory",
        f"- PostgreSQL: {meta['postgres']}",
        f"- episodic: {meta['episodic']}",
        f"- command: `{meta['command']}`",
        f"- runtime: {meta['runtime']}",
    ]


__all__ = ["command_line", "episodic_source", "run_facts", "terminate"]
