"""Node and npm for the tests that run TypeScript (the generated-types client in
tests/server/typescript, the package in clients/typescript): found on PATH or the test is
skipped (failed under EPISODIC_TEST_REQUIRE_EXTRAS=1), packages installed with ``npm ci`` from
the package's lock into its node_modules, npm's cache outside the checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.acceptance.test_cli import clean_env
from tests.support import REQUIRE_EXTRAS

#: outside the checkout and the user's own npm cache, and kept between runs
NPM_CACHE = Path(tempfile.gettempdir()) / "episodic-tests-npm-cache"
MIN_NODE = 20
NPM_CI_TIMEOUT = 300
STEP_TIMEOUT = 300


def require_node(what: str) -> dict[str, str]:
    """The environment Node and npm run in; skip (or fail under EPISODIC_TEST_REQUIRE_EXTRAS)
    without them. ``what`` says what they are for."""
    node, npm, npx = (shutil.which(tool) for tool in ("node", "npm", "npx"))
    problem = None
    if node is None or npm is None or npx is None:
        problem = "needs Node and npm on PATH"
    else:
        version = subprocess.run(
            [node, "--version"], capture_output=True, encoding="utf-8", timeout=30, check=False
        ).stdout.strip()
        found = re.match(r"v(\d+)\.", version)
        if found is None or int(found.group(1)) < MIN_NODE:
            problem = f"needs Node {MIN_NODE}+, not {version or 'an unknown version'}"
    if problem is not None:
        message = f"{problem} to {what}"
        if REQUIRE_EXTRAS:
            pytest.fail(f"{message}; EPISODIC_TEST_REQUIRE_EXTRAS=1", pytrace=False)
        pytest.skip(message)
    assert node is not None
    path = os.environ.get("PATH", "")
    node_dir = str(Path(node).parent)
    return clean_env(
        PATH=path if node_dir in path.split(os.pathsep) else node_dir + os.pathsep + path,
        HOME=os.environ.get("HOME") or tempfile.gettempdir(),
        npm_config_cache=str(NPM_CACHE),
        npm_config_update_notifier="false",
        npm_config_fund="false",
        npm_config_audit="false",
        NO_COLOR="1",
    )


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run(
    command: Sequence[str],
    cwd: Path,
    env: dict[str, str],
    timeout: int = STEP_TIMEOUT,
    *,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``command`` in ``cwd``; a non-zero exit (when ``check``) or a timeout fails the test
    with its output."""
    try:
        done = subprocess.run(
            list(command),
            cwd=cwd,
            env=env,
            capture_output=True,
            encoding="utf-8",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr)
        pytest.fail(f"{' '.join(command)} took over {timeout} s:\n{output}")
    if check:
        assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n" + (
            done.stdout + done.stderr
        )
    return done


def npx(package: Path, *args: str, env: dict[str, str], timeout: int = STEP_TIMEOUT) -> str:
    """A tool of the locked packages in ``package``'s node_modules (--no: npx never fetches
    one)."""
    return run(["npx", "--no", "--", *args], package, env, timeout).stdout


def install(package: Path, env: dict[str, str]) -> None:
    """npm ci when node_modules is missing or older than package-lock.json. Install scripts
    are not run: none of the packages needs one."""
    lock = package / "package-lock.json"
    installed = package / "node_modules" / ".package-lock.json"
    if installed.exists() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return
    run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], package, env, NPM_CI_TIMEOUT)
