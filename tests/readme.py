"""The README's sections and fenced blocks, for the tests that run them as written."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The database the README's shell blocks name; a test runs them against its own instead.
README_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"


def section(heading: str) -> str:
    """The text under ``heading`` (a ``## `` or ``### `` title, matched from its start) up to
    the next heading of the same or a higher level; a ``#`` line inside a fenced block (a
    shell comment) is no heading."""
    lines = README.read_text(encoding="utf-8").splitlines(keepends=True)
    found: list[str] = []
    level = 0
    fenced_now = False
    for line in lines:
        if line.startswith("```"):
            fenced_now = not fenced_now
        title = re.match(r"(#+) (.*)", line) if not fenced_now else None
        if level and title and len(title.group(1)) <= level:
            break
        if level:
            found.append(line)
        elif title and title.group(2).startswith(heading):
            level = len(title.group(1))
    assert level, f"README.md has no section {heading!r}"
    return "".join(found)


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the ```language blocks in ``text``, in order (```python and ```py are
    different languages: the first are programs, the second fragments)."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def user_environment() -> dict[str, str]:
    """The environment of a user whose venv is active: this process's, without episodic's or
    OpenAI's variables, with the venv's ``episodic`` and ``python`` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPISODIC_", "OPENAI_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


async def run_shell(script: str, *, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """``script`` under ``bash -e`` in a session of its own, so whatever it leaves running (a
    server or worker it failed to stop) ends with it; returns its exit code and output."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-e",
        "-c",
        script,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode is not None
    return process.returncode, output.decode()
