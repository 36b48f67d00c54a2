"""Pinned instructions: a user message appended with ``pinned`` is carried word for word by
every later handoff, until an ``unpin`` event names its seq. The message's flag lives in its
payload; the new kind of event is the only change to the tables.

(Frozen once it ships: the current definitions are episodic/store/postgres/schema.sql and
episodic/store/schema.py.)
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0015_unpin"
down_revision: str | None = "0014_api_keys"


def _load_revision(filename: str) -> Any:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_NINTH = _load_revision("0009_retractions_and_clears.py")
_TWELFTH = _load_revision("0012_erasure.py")
EARLIER_KINDS: str = _load_revision("0011_state_listings_deletion.py").KINDS
KINDS = EARLIER_KINDS[:-1] + ", 'unpin')"


def upgrade() -> None:
    _kinds(KINDS)


def downgrade() -> None:
    _kinds(EARLIER_KINDS)


def _kinds(kinds: str) -> None:
    _NINTH._kinds(kinds)
    if op.get_bind().dialect.name != "sqlite":
        return
    # SQLite copied the table, and 0009 put back the append-only triggers of its time, which
    # refuse every DELETE: the log's delete trigger is again the one 0012 made, which lets
    # an erasure's rows go.
    table, trigger, refusal = _TWELFTH.SQLITE_DELETE_TRIGGERS[0]
    assert table == "episodic_events"
    op.execute(f"DROP TRIGGER {trigger}")
    op.execute(
        f"CREATE TRIGGER {trigger} BEFORE DELETE ON {table} "
        f"WHEN NOT {_TWELFTH._sqlite_condition(table)} "
        f"BEGIN SELECT RAISE(ABORT, '{refusal}'); END"
    )
