"""The pure modules import no database driver, migration tool, HTTP client or provider SDK."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "episodic"


def _pure_contract() -> dict[str, Any]:
    """import-linter's "Pure modules do no I/O" contract in pyproject.toml: the one list of
    the pure modules and what they may not import, which this test checks at run time too
    (import-linter reads the source; this sees what importing a module really loads)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["name"] == "Pure modules do no I/O"
    ]
    return contract


def _modules(names: list[str]) -> list[str]:
    """Each module named, a package as its modules."""
    found = []
    for name in names:
        path = ROOT.joinpath(*name.split("."))
        if path.is_dir():
            found += [f"{name}.{f.stem}" for f in sorted(path.glob("*.py")) if f.stem != "__init__"]
        else:
            found.append(name)
    return found


PURE_MODULES = _modules(_pure_contract()["source_modules"])
#: the third-party libraries among the forbidden modules (episodic's own are import-linter's)
FORBIDDEN = {m for m in _pure_contract()["forbidden_modules"] if not m.startswith("episodic")}

# The package's __init__ re-exports the store, which does import SQLAlchemy; registering a
# bare package object first loads each module without it, so only the module's own imports
# are measured.
PROBE = """
import json, sys, types
package = types.ModuleType("episodic")
package.__path__ = [sys.argv[1]]
sys.modules["episodic"] = package
import importlib
importlib.import_module(sys.argv[2])
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(module: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, str(PACKAGE_DIR), module],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = set(json.loads(completed.stdout))
    assert module.split(".")[0] in loaded
    assert loaded & FORBIDDEN == set()
