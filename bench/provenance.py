"""Where the figures come from: the episodic checkout measured, and clean stops on signals."""

from __future__ import annotations

import subprocess
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


__all__ = ["episodic_source", "terminate"]
