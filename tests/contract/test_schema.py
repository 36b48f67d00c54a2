"""The current schema file and the migrations describe the same database.

One database is migrated from empty to head; another is built from
``episodic/store/postgres/schema.sql`` alone. Their catalogs are compared: the definition of every
``episodic_*`` function (``pg_get_functiondef``, body included) and its privileges, every
composite type's fields, every table's columns, constraints, indexes, triggers, policies,
row-level security flags, storage options and grants. Any difference fails with a diff that
names the object.
"""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from episodic.store.postgres.queries import schema_sql
from tests.conftest import _admin, _with_database
from tests.support import asyncpg_dsn

LIKE = r"episodic\_%"

#: Each query gives (object, description) rows: what the comparison reads of the catalog.
CATALOG = {
    "function": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               pg_get_functiondef(p.oid) || E'\\n-- privileges: ' || COALESCE(p.proacl::text, '')
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema() AND p.proname LIKE $1
    """,
    "column": """
        SELECT table_name || '.' || column_name,
               concat_ws(' ', ordinal_position, data_type, character_maximum_length,
                         'nullable=' || is_nullable, 'default=' || column_default)
          FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name LIKE $1
    """,
    "constraint": """
        SELECT conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
          FROM pg_constraint
         WHERE conrelid::regclass::text LIKE $1
    """,
    "index": """
        SELECT tablename || '.' || indexname, indexdef
          FROM pg_indexes
         WHERE schemaname = current_schema() AND tablename LIKE $1
    """,
    "trigger": """
        SELECT tgrelid::regclass::text || '.' || tgname, pg_get_triggerdef(oid)
          FROM pg_trigger
         WHERE NOT tgisinternal AND tgrelid::regclass::text LIKE $1
    """,
    "policy": """
        SELECT tablename || '.' || policyname,
               concat_ws(' ', permissive, roles::text, cmd, 'using=' || qual,
                         'check=' || with_check)
          FROM pg_policies
         WHERE schemaname = current_schema() AND tablename LIKE $1
    """,
    "type": """
        SELECT t.typname,
               string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '
                          ORDER BY a.attnum)
          FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
         WHERE t.typtype = 'c' AND t.typnamespace = current_schema()::regnamespace
           AND t.typname LIKE $1 AND a.attnum > 0
           AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c'
         GROUP BY t.typname
    """,
    "table options": """
        SELECT relname,
               concat_ws(' ', 'enabled=' || relrowsecurity, 'forced=' || relforcerowsecurity,
                         'options=' || array_to_string(reloptions, ','))
          FROM pg_class
         WHERE relkind = 'r' AND relnamespace = current_schema()::regnamespace
           AND relname LIKE $1
    """,
    "table grant": """
        SELECT c.relname || ' to ' || a.grantee::regrole::text,
               string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
          FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relname LIKE $1
           AND a.grantee <> c.relowner
         GROUP BY c.relname, a.grantee
    """,
    "column grant": """
        SELECT c.relname || '.' || t.attname || ' to ' || a.grantee::regrole::text,
               string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
          FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid, aclexplode(t.attacl) a
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relname LIKE $1
           AND t.attacl IS NOT NULL
         GROUP BY c.relname, t.attname, a.grantee
    """,
}


#: A Citus shard placement on this node (episodic_erasures_102024, its constraints and
#: triggers): the distribution's copy of a table, not part of the schema.
SHARD = re.compile(r"^episodic_[a-z_]+_\d+\b")


async def catalog(url: str) -> dict[str, str]:
    """The database's episodic objects: ``"kind name"`` to its definition."""
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        objects = {}
        for kind, query in CATALOG.items():
            for name, description in await connection.fetch(query, LIKE):
                if not SHARD.match(name):
                    objects[f"{kind} {name}"] = description
        return objects
    finally:
        await connection.close()


def drift(migrated: dict[str, str], current: dict[str, str]) -> str:
    """What differs, object by object, migrations against schema.sql ('' when nothing)."""
    report = []
    for name in sorted(migrated.keys() | current.keys()):
        if name not in current:
            report.append(f"only in the migrated database: {name}")
        elif name not in migrated:
            report.append(f"only in schema.sql: {name}")
        elif migrated[name] != current[name]:
            lines = difflib.unified_diff(
                migrated[name].splitlines(),
                current[name].splitlines(),
                fromfile=f"{name} (migrations, upgrade head)",
                tofile=f"{name} (episodic/store/postgres/schema.sql)",
                lineterm="",
            )
            report.append("\n".join(lines))
    return "\n\n".join(report)


@pytest.fixture
async def from_schema_file(postgres_server: str) -> AsyncIterator[str]:
    """A database built from schema.sql alone (no Alembic)."""
    name = f"episodic_schema_{uuid.uuid4().hex[:12]}"
    await _admin(postgres_server, f'CREATE DATABASE "{name}"')
    url = _with_database(postgres_server, name)
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await connection.execute(schema_sql())
    finally:
        await connection.close()
    try:
        yield url
    finally:
        await _admin(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_the_migrated_database_is_the_schema_file(
    postgres_url: str, from_schema_file: str
) -> None:
    migrated, current = await catalog(postgres_url), await catalog(from_schema_file)
    assert any(name.startswith("function episodic_append(") for name in current)
    assert current["type episodic_append_request"].startswith("conversation_id uuid, ")
    difference = drift(migrated, current)
    assert not difference, f"the migrations and schema.sql disagree:\n{difference}"


async def test_a_changed_function_body_is_drift(from_schema_file: str, postgres_url: str) -> None:
    """The comparison sees a body that differs by one comment, and names the function."""
    connection = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        definition = await connection.fetchval(
            "SELECT pg_get_functiondef('episodic_set_tenant(text)'::regprocedure)"
        )
        await connection.execute(definition.replace("BEGIN", "BEGIN\n    -- drift", 1))
    finally:
        await connection.close()
    difference = drift(await catalog(postgres_url), await catalog(from_schema_file))
    assert difference.startswith("--- function episodic_set_tenant(p_tenant text) (migrations")
    assert "\n-    -- drift\n" in difference
    assert difference.count("--- ") == 1  # nothing else


async def test_every_function_names_its_parameters(postgres_url: str) -> None:
    """No episodic_* function takes an unnamed parameter, and every input is p_..."""
    connection = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        rows = await connection.fetch(
            """
            SELECT p.oid::regprocedure::text AS signature,
                   p.pronargs AS inputs, p.proargnames AS names, p.proargmodes::text[] AS modes
              FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE $1
            """,
            LIKE,
        )
    finally:
        await connection.close()
    assert len(rows) >= 10
    bad = []
    for row in rows:
        names, modes = list(row["names"] or []), list(row["modes"] or [])
        inputs = [
            name
            for position, name in enumerate(names)
            if not modes or modes[position] in ("i", "b", "v")
        ]
        if row["inputs"] and (len(inputs) != row["inputs"] or not all(inputs)):
            bad.append(f"{row['signature']}: unnamed parameters {names}")
        elif any(not name.startswith("p_") for name in inputs):
            bad.append(f"{row['signature']}: inputs not named p_...: {inputs}")
    assert bad == []
