"""The pure modules import no database driver, migration tool, HTTP client or provider SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PURE_MODULES = [
    "episodic.compaction",
    "episodic.policy",
    "episodic.loop",
    "episodic.models",
    "episodic.tokens",
    "episodic.rendering",
    "episodic.formats.openai_chat",
    "episodic.formats.responses",
    "episodic.formats.anthropic",
    "episodic.formats.cliver",
]
FORBIDDEN = {"sqlalchemy", "asyncpg", "aiosqlite", "alembic", "httpx", "openai", "anthropic"}
PACKAGE_DIR = Path(__file__).resolve().parents[2] / "episodic"

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
