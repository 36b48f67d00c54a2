"""The SQLite backend: the embedded default, for trying episodic out and single-process use.
Each decision it makes that a PL/pgSQL function also makes is a pure twin at the top of
``episodic.store``, named after its SQL."""

from episodic.store.sqlite.backend import SqliteBackend

__all__ = ["SqliteBackend"]
