"""Databases on a Citus cluster for the suite's Citus lane (``pytest --citus``).

``EPISODIC_TEST_CITUS_URL`` names a cluster's coordinator (``.ci/run`` starts a local one on
127.0.0.1:9700 with ``../shared/vendor/citus/build.sh``; a laptop may point it at any cluster,
e.g. the ``citus`` profile of docker-compose.yml). Citus refuses to clone a template, and a
database's nodes and extension are its own, so each test database is made whole: created on
every node, the extension created on every node, the nodes registered, then migrated, which
distributes the schema (episodic/store/postgres/citus.py).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import asyncpg
from sqlalchemy.engine import make_url

from episodic.store.postgres.citus import CITUS_INSTALLED, WORKER_NODES, on_node
from tests.support import asyncpg_dsn

CITUS_URL_VARIABLE = "EPISODIC_TEST_CITUS_URL"
#: The group roles episodic's migrations grant to.
RUNTIME_ROLES = ("episodic_app", "episodic_worker", "episodic_all_tenants", "episodic_eraser")
#: Read at import, before the tests' environment is scrubbed.
CITUS_URL = os.environ.get(CITUS_URL_VARIABLE)
#: Shards per table in the test databases: enough that conversations spread over both
#: workers, few enough that creating a database stays quick.
TEST_SHARD_COUNT = 4
NOT_CONFIGURED = (
    f"no Citus cluster: set {CITUS_URL_VARIABLE} to a coordinator the tests may create "
    "databases on (.ci/run starts one with ../shared/vendor/citus/build.sh)"
)


@dataclass(frozen=True)
class Node:
    host: str
    port: int


def _on(server: str, *, database: str | None = None, node: Node | None = None) -> str:
    url = make_url(server)
    if database is not None:
        url = url.set(database=database)
    if node is not None:
        url = url.set(host=node.host, port=node.port)
    return asyncpg_dsn(url.render_as_string(hide_password=False))


async def worker_nodes(coordinator: str) -> list[Node]:
    """The cluster's workers, as its maintenance database registers them."""
    admin = await asyncpg.connect(_on(coordinator))
    try:
        rows = await admin.fetch(WORKER_NODES)
    finally:
        await admin.close()
    return [Node(row["nodename"], row["nodeport"]) for row in rows]


async def nodes_of(database_dsn: str) -> list[str]:
    """DSNs of every node a notification from ``database_dsn``'s database may be sent on: the
    database itself, and on Citus each worker (where delegated calls run)."""
    connection = await asyncpg.connect(database_dsn)
    try:
        citus = await connection.fetchval(CITUS_INSTALLED)
        rows = await connection.fetch(WORKER_NODES) if citus else []
    finally:
        await connection.close()
    return [database_dsn] + [
        on_node(database_dsn, row["nodename"], row["nodeport"]) for row in rows
    ]


async def node_port_of(database_dsn: str, conversation_id: object) -> int | None:
    """The port of the node holding the conversation's shard (None: not distributed)."""
    connection = await asyncpg.connect(database_dsn)
    try:
        if not await connection.fetchval(CITUS_INSTALLED):
            return None
        port: int = await connection.fetchval(
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) "
            "WHERE p.shardid = get_shard_id_for_distribution_column("
            "'episodic_conversations', $1::uuid)",
            conversation_id,
        )
        return port
    finally:
        await connection.close()


async def create_distributed_database(
    coordinator: str, name: str, *, owner: str | None = None
) -> None:
    """An empty database on every node with the citus extension and the nodes registered,
    ready for ``episodic migrate`` to distribute."""
    url = make_url(coordinator)
    here = Node(url.host or "127.0.0.1", url.port or 5432)
    workers = await worker_nodes(coordinator)
    if not workers:
        raise RuntimeError(f"{here.host}:{here.port} is no Citus coordinator with workers")
    admin = await asyncpg.connect(_on(coordinator))
    try:
        await admin.execute("SET citus.enable_create_database_propagation = on")
        await admin.execute(f'CREATE DATABASE "{name}"' + (f" OWNER {owner}" if owner else ""))
    finally:
        await admin.close()
    for node in (here, *workers):
        connection = await asyncpg.connect(_on(coordinator, database=name, node=node))
        try:
            await connection.execute("CREATE EXTENSION IF NOT EXISTS citus")
        finally:
            await connection.close()
    connection = await asyncpg.connect(_on(coordinator, database=name))
    try:
        await connection.execute("SELECT citus_set_coordinator_host($1, $2)", here.host, here.port)
        for node in workers:
            await connection.execute("SELECT citus_add_node($1, $2)", node.host, node.port)
        if owner is not None:
            await connection.execute(_share_roles(owner))
    finally:
        await connection.close()


def _share_roles(owner: str) -> str:
    """What a superuser runs before a non-superuser owner migrates (README, "Scaling out with
    Citus"): a table owned by the owner and granted to the runtime roles is distributed and
    dropped, which records the roles as distributed in this database. Otherwise the owner's
    own create_distributed_table would propagate them, which only a superuser may do."""
    return f"""
        CREATE TABLE episodic_roles_probe (id int);
        ALTER TABLE episodic_roles_probe OWNER TO {owner};
        GRANT SELECT ON episodic_roles_probe TO {", ".join(RUNTIME_ROLES)};
        SELECT create_distributed_table('episodic_roles_probe', 'id');
        DROP TABLE episodic_roles_probe;
    """


#: episodic's tables and their shards (name_<shard id>) on one node.
_LOCAL_TABLES = r"""
SELECT c.oid::regclass::text FROM pg_class c
 WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
   AND c.relname ~ ('^episodic_(conversations|events|compaction_attempts|shared_state|'
                    'erasures)(_[0-9]+)?$')
"""


async def empty_distributed_database(coordinator: str, name: str) -> None:
    """Make a used test database as it was just after its migration: every session on it
    ended, every row gone, on every node. Creating and distributing a database takes seconds
    on a cluster; this, a fraction of one. Each node truncates its own shards with the
    append-only triggers skipped (the replica role); a TRUNCATE of the distributed table
    under that role would reach no shard."""
    url = make_url(coordinator)
    here = Node(url.host or "127.0.0.1", url.port or 5432)
    admin = await asyncpg.connect(_on(coordinator, database=name))
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
    finally:
        await admin.close()
    for node in (here, *await worker_nodes(coordinator)):
        connection = await asyncpg.connect(
            _on(coordinator, database=name, node=node),
            server_settings={
                "citus.override_table_visibility": "off",
                "citus.enable_manual_changes_to_shards": "on",
            },
        )
        try:
            tables = [row[0] for row in await connection.fetch(_LOCAL_TABLES)]
            async with connection.transaction():
                await connection.execute("SET LOCAL session_replication_role = 'replica'")
                await connection.execute(f"TRUNCATE {', '.join(tables)}")
        finally:
            await connection.close()


async def drop_distributed_database(coordinator: str, name: str) -> None:
    """Drop the database on every node. FORCE ends client sessions, not Citus's maintenance
    daemon, which may be connected to it for a moment (recovering two-phase commits): then
    the drop is tried again, for up to 30 s."""
    admin = await asyncpg.connect(_on(coordinator))
    try:
        await admin.execute("SET citus.enable_create_database_propagation = on")
        for attempt in range(60):
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except asyncpg.ObjectInUseError:
                if attempt == 59:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await admin.close()


__all__ = [
    "CITUS_URL",
    "CITUS_URL_VARIABLE",
    "NOT_CONFIGURED",
    "TEST_SHARD_COUNT",
    "Node",
    "create_distributed_database",
    "drop_distributed_database",
    "empty_distributed_database",
    "node_port_of",
    "nodes_of",
    "worker_nodes",
]
