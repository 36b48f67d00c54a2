"""Everything only PostgreSQL uses: the backend, its SQL (``schema.sql``, the current
definition of every table and function, and ``queries``, the statements that call them), the
connection pool, the append coalescer, the wake-up listener and Citus."""

from episodic.store.postgres.backend import PostgresBackend

__all__ = ["PostgresBackend"]
