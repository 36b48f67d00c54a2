"""The README cannot drift from the API: its Python blocks run as tests, and the compose file
it points to is valid."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme import README, ROOT, fenced, section

#: Its blocks run together, with a worker and a model, in tests/acceptance/test_quickstart.py.
QUICKSTART = "Quickstart"


def python_blocks() -> list[str]:
    """The ```python blocks, each a complete program, outside the quickstart. (```py blocks
    are fragments shown for illustration, needing a model or an agent; ```bash blocks are
    commands.)"""
    everything = fenced(README.read_text(encoding="utf-8"), "python")
    quickstart = fenced(section(QUICKSTART), "python")
    return [block for block in everything if block not in quickstart]


def test_the_readme_has_runnable_examples() -> None:
    assert python_blocks(), "README.md has no ```python block"


@pytest.mark.parametrize("index", range(len(python_blocks())))
async def test_readme_python_block_runs(database_url: str, tmp_path: Path, index: int) -> None:
    script = tmp_path / f"readme_{index}.py"
    script.write_text(python_blocks()[index], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISODIC_")}
    env["EPISODIC_DATABASE_URL"] = database_url
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, output.decode()


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def test_compose_file_is_valid() -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("no docker compose client on this machine (the plugin or docker-compose)")
    result = subprocess.run(
        [*command, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def _pip_installs(text: str) -> list[str]:
    """Each ``pip install`` in ``text`` as the command a person types: no interpreter path,
    no ``--quiet``, pip's own upgrade left out."""
    found = []
    for match in re.finditer(r"pip install ([^\n&;`]*)", text):
        words = [w for w in match.group(1).split() if w not in ("--quiet", "-q")]
        if words != ["--upgrade", "pip"]:
            found.append("pip install " + " ".join(words))
    return found


def test_ci_installs_exactly_what_the_readme_says() -> None:
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    try_it = readme.split("## Try it", 1)[1].split("\n## ", 1)[0]
    (install,) = _pip_installs(try_it)
    assert install == 'pip install -e ".[dev]"'
    assert _pip_installs(ci) == [install]


def test_ci_runs_the_readme_test_command() -> None:
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    section = readme.split("## Run the tests", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```bash\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    test_command = commands[0].strip().splitlines()[-1]
    assert test_command in ci.splitlines()
