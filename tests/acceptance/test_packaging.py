"""What a user installs: a wheel with its types, its license and its migrations, a version
the code knows, and types another project's ``mypy --strict`` can use."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

import episodic

ROOT = Path(__file__).resolve().parents[2]
#: The name on PyPI ("episodic" there is an unrelated library); the import name is episodic.
DISTRIBUTION = "episodic-store"
#: The wheel's file and dist-info prefix: the name normalized as the wheel spec says.
DIST_INFO = "episodic_store"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel built from this checkout (hatchling, from the dev extra, no download)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(out)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (built,) = out.glob(f"{DIST_INFO}-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_ships_types_license_and_migrations(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "episodic/py.typed" in names
    assert f"{DIST_INFO}-{episodic.__version__}.dist-info/licenses/LICENSE" in names
    migrations = {n for n in names if n.startswith("episodic/_migrations/versions/")}
    shipped = sorted(Path(n).stem for n in migrations if n.endswith(".py"))
    from episodic.store.migrate import REVISIONS

    assert shipped == sorted(REVISIONS)
    metadata = wheel.read(f"{DIST_INFO}-{episodic.__version__}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata


def test_the_license_file_is_the_declared_license() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_the_version_is_the_installed_distributions() -> None:
    assert episodic.__version__ == version(DISTRIBUTION)


CORRECT = """\
from episodic import Context, EpisodicStore, Message, NotFoundError


async def tokens(store: EpisodicStore, conversation: str) -> int:
    try:
        context: Context = await store.load_context(conversation)
    except NotFoundError as error:
        return len(str(error.conversation_id))
    await store.append(conversation, [Message.user("hello")], idempotency_key="k")
    return context.estimated_tokens
"""

WRONG = """\
from episodic import EpisodicStore


async def tokens(store: EpisodicStore) -> str:
    context = await store.load_context("x")
    return context.estimated_tokens
"""


def _mypy(project: Path, source: str) -> subprocess.CompletedProcess[str]:
    (project / "app.py").write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "app.py"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )


def test_another_project_type_checks_against_episodic(tmp_path: Path) -> None:
    """Without py.typed mypy would skip episodic ("missing library stubs or py.typed
    marker") and every value from it would be Any."""
    project = tmp_path / "app"
    project.mkdir()
    good = _mypy(project, CORRECT)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(project, WRONG)
    assert bad.returncode == 1
    assert 'Incompatible return value type (got "int", expected "str")' in bad.stdout
    assert "py.typed" not in bad.stdout


def test_the_distribution_name_installs_this_project(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    """``pip install episodic-store`` into an empty venv, from the built wheel alone, installs
    this project's ``episodic`` package (no dependencies: only the name is being checked)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    assert wheel.filename is not None
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--find-links", str(Path(wheel.filename).parent), DISTRIBUTION],
        check=True,
        capture_output=True,
    )  # fmt: skip
    probe = subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m, pathlib; d = m.distribution('episodic-store');"
         "print(d.version); print(d.metadata['Summary']);"
         "print(sorted({pathlib.PurePath(str(f)).parts[0] for f in d.files or []}))"],
        check=True,
        capture_output=True,
        text=True,
    )  # fmt: skip
    installed_version, summary, top_levels = probe.stdout.splitlines()
    assert installed_version == episodic.__version__
    assert "AI-agent conversations" in summary
    assert "'episodic'" in top_levels


#: ``pip install`` of a bare ``episodic`` (with extras or a version) gets the unrelated
#: library that holds the name on PyPI. Spelled in pieces so this file does not match itself.
TAKEN_NAME = re.compile(r"(?<![\w./-])" + "episodic" + r"(?=\[|==|>=|~=|['\"\s]|$)")


def test_no_install_line_names_the_taken_distribution() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if (
            path.suffix not in {".md", ".py", ".toml", ".txt", ".yml", ".yaml", ""}
            or not path.is_file()
        ):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            installed = [
                word.strip("'\"")
                for match in re.finditer(r"pip install ([^\n&;`|]*)", line)
                for word in match.group(1).split()
            ]
            extra = re.search(r"(?<![\w-])" + "episodic" + r"\[[a-z]", line)
            if extra or any(TAKEN_NAME.match(word) for word in installed):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == [], "\n".join(offenders)
