"""What no answer of the HTTP API may hold: a database's statement or its words, the names of
episodic's tables, a driver's name, a Python traceback. A server error names its class and
the request's id; the rest is for the server's log."""

from __future__ import annotations

from episodic.store.schema import metadata

#: pieces of text that only the internals write
MARKERS: tuple[str, ...] = (
    "[SQL:",
    "[parameters:",
    "SELECT ",
    "INSERT INTO",
    "UPDATE episodic",
    "DELETE FROM",
    'relation "',
    "DETAIL:",
    "sqlalche.me",
    "sqlalchemy.",
    "asyncpg.",
    "sqlite3.",
    "psycopg",
    "Traceback (most recent call last)",
    'File "/',
    *sorted(metadata.tables),
    "alembic_version",
)


def leaks_in(text: str) -> list[str]:
    """The markers ``text`` holds (none: nothing of the internals)."""
    return [marker for marker in MARKERS if marker in text]


__all__ = ["MARKERS", "leaks_in"]
