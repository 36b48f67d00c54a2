"""The PostgreSQL side of episodic in one place: ``schema.sql`` here is the current definition
of every table, index, trigger, policy, grant and function, readable top to bottom. The
migrations are frozen history; a test compares a database migrated to head with one built
from this file."""

from __future__ import annotations

from importlib.resources import files

SCHEMA_FILE = "schema.sql"


def schema_sql() -> str:
    """The text of ``schema.sql``."""
    return files("episodic.store.sql").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


def named_call(function: str, parameters: tuple[str, ...], *, columns: str = "*") -> str:
    """``SELECT columns FROM function(p_a => $1, p_b => $2, ...)``: a call that names each
    argument, so the SQL says which value is which; the caller passes the values in the order
    of ``parameters``."""
    arguments = ", ".join(f"{name} => ${index}" for index, name in enumerate(parameters, 1))
    return f"SELECT {columns} FROM {function}({arguments})"


__all__ = ["SCHEMA_FILE", "named_call", "schema_sql"]
