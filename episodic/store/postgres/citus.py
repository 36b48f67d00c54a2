"""Citus: the schema distributed over a cluster's nodes, sharded by conversation.

``episodic migrate`` on a database with the ``citus`` extension runs the revisions with
``citus.multi_shard_modify_mode = 'sequential'`` (a function command after a parallel
multi-shard one in the same transaction is refused otherwise) and then, in the same
transaction, :func:`distribute`: the plan below applied to whatever is not yet distributed as
planned. Every step reads the catalog first, so migrating again changes nothing, and a
revision that re-creates a function (which loses its delegation) gets it back in the
transaction that re-created it. On plain PostgreSQL none of this runs.

The plan:

- the heads, the log and the attempts ledger: distributed by ``conversation_id``, co-located,
  so a conversation's rows sit in one shard group on one node;
- the shared state and the erasure ledger: reference tables, a copy on every node, since
  they are keyed by tenant, not conversation (every conversation of a tenant reads its shared
  state), and both are small and written rarely;
- the revision table: stays on the coordinator;
- every function that takes ``p_conversation_id``: delegated to the node holding the
  conversation (the request path's one call then runs there, next to the rows), except the
  ones that must also write the reference table or several shard groups
  (:data:`COORDINATOR_FUNCTIONS`); every other function is propagated to all nodes (the
  triggers and RLS helpers run on the shards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url

from episodic.errors import ConfigurationError

#: Citus's own default; ``EPISODIC_CITUS_SHARD_COUNT`` chooses another when distributing.
DEFAULT_SHARD_COUNT = 32
CONVERSATION_COLUMN = "conversation_id"
#: (table, distribution column, co-located with) in the order they are distributed
DISTRIBUTED_TABLES = (
    ("episodic_conversations", CONVERSATION_COLUMN, "none"),
    ("episodic_events", CONVERSATION_COLUMN, "episodic_conversations"),
    ("episodic_compaction_attempts", CONVERSATION_COLUMN, "episodic_conversations"),
)
#: Kept whole on every node: a delegated call reads them where it runs (a conversation's
#: shard group holds no tenant-wide rows), and they are small and written rarely.
REFERENCE_TABLES = ("episodic_shared_state", "episodic_erasures")
DELEGATION_ARGUMENT = "p_conversation_id"
#: Functions with a conversation argument that run where they are called. The erasure writes
#: the ledger (a reference table, written on every node) besides the conversation's rows.
#: ``episodic_read_state`` is called with a NULL conversation to read shared state alone, and
#: Citus 13.2 delegating a call whose distribution argument is NULL crashes the coordinator's
#: backend (signal 11, seen here); run there, it routes its one head read.
COORDINATOR_FUNCTIONS = frozenset({"episodic_erase_conversation", "episodic_read_state"})

CITUS_INSTALLED = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"
NODES = "SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND isactive"
UNDISTRIBUTED_TABLE = """
SELECT to_regclass(:table) IS NOT NULL
   AND NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = to_regclass(:table))
"""
# Each episodic function with the distribution argument index Citus holds for it (NULL: none
# or not distributed), whether it is distributed at all, and the index it should have.
FUNCTIONS = """
SELECT p.oid::regprocedure::text AS signature, p.proname AS name,
       d.objid IS NOT NULL AS distributed, d.distribution_argument_index AS held,
       array_position(p.proargnames, :argument) - 1 AS argument
  FROM pg_proc p
  LEFT JOIN pg_dist_object d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
 WHERE p.proname LIKE 'episodic\\_%' AND p.pronamespace = 'public'::regnamespace
 ORDER BY p.oid
"""
#: What ``episodic status`` says about the store's distribution.
LAYOUT = """
SELECT EXISTS (SELECT FROM pg_dist_partition
                WHERE logicalrelid = 'episodic_conversations'::regclass) AS distributed,
       (SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND isactive) AS nodes,
       (SELECT count(*) FROM pg_dist_shard
         WHERE logicalrelid = 'episodic_conversations'::regclass) AS shards
"""
#: The workers, where delegated calls run and so where their NOTIFYs are sent.
WORKER_NODES = """
SELECT nodename, nodeport FROM pg_dist_node
 WHERE noderole = 'primary' AND isactive AND groupid <> 0
 ORDER BY nodeid
"""


def on_node(dsn: str, host: str, port: int) -> str:
    """``dsn`` (user, password, database, options) pointed at another node of the cluster."""
    # A coordinator named by several hosts (a primary and its standbys) has them in the
    # query, where they would outrank the node's own.
    node = make_url(dsn).difference_update_query(["host", "target_session_attrs"])
    return node.set(host=host, port=port).render_as_string(hide_password=False)


def citus_installed(connection: Connection) -> bool:
    return bool(_run(connection, CITUS_INSTALLED).scalar())


def prepare_migration(connection: Connection) -> None:
    """Inside the migration's transaction, before the revisions run: one connection per node
    for everything (Citus refuses a DROP/CREATE FUNCTION after a parallel DDL otherwise)."""
    _run(connection, "SET LOCAL citus.multi_shard_modify_mode = 'sequential'")


@dataclass(frozen=True, slots=True)
class Distribution:
    """What :func:`distribute` changed."""

    tables: tuple[str, ...]
    functions: tuple[str, ...]


def distribute(connection: Connection, *, shard_count: int = DEFAULT_SHARD_COUNT) -> Distribution:
    """Distribute what the plan says and is not yet so; in the caller's transaction."""
    if shard_count < 1:
        raise ConfigurationError(f"the Citus shard count must be at least 1, not {shard_count}")
    if not _run(connection, NODES).scalar():
        raise ConfigurationError(
            "this database has the citus extension but no nodes: run "
            "citus_set_coordinator_host(...) and citus_add_node(...) in it, then migrate again"
        )
    # The log's append-only triggers are copied to every shard; Citus asks for this to
    # distribute a table that has triggers (they then fire on the shards as on a table).
    _run(connection, "SET LOCAL citus.enable_unsafe_triggers = on")
    tables: list[str] = []
    for table, column, colocate_with in DISTRIBUTED_TABLES:
        if _undistributed(connection, table):
            # A co-located table takes its group's shard count (Citus refuses both).
            shards = ", shard_count => :shards" if colocate_with == "none" else ""
            _run(
                connection,
                "SELECT create_distributed_table(:table, :column, "
                f"colocate_with => :colocate{shards})",
                {
                    "table": table,
                    "column": column,
                    "colocate": colocate_with,
                    "shards": shard_count,
                },
            )
            tables.append(table)
    for table in REFERENCE_TABLES:
        if _undistributed(connection, table):
            _run(connection, "SELECT create_reference_table(:table)", {"table": table})
            tables.append(table)
    functions: list[str] = []
    for row in _run(connection, FUNCTIONS, {"argument": DELEGATION_ARGUMENT}).all():
        delegated = row.argument is not None and row.name not in COORDINATOR_FUNCTIONS
        if delegated and row.held == row.argument:
            continue
        if not delegated and row.distributed and row.held is None:
            continue
        if delegated:
            _run(
                connection,
                "SELECT create_distributed_function(:signature, :argument, "
                "colocate_with => 'episodic_conversations')",
                {"signature": row.signature, "argument": DELEGATION_ARGUMENT},
            )
        else:
            _run(
                connection,
                "SELECT create_distributed_function(:signature)",
                {"signature": row.signature},
            )
        functions.append(row.signature)
    return Distribution(tables=tuple(tables), functions=tuple(functions))


def _run(connection: Connection, sql: str, parameters: dict[str, object] | None = None) -> Any:
    return connection.execute(text(sql), parameters or {})


def _undistributed(connection: Connection, table: str) -> bool:
    return bool(_run(connection, UNDISTRIBUTED_TABLE, {"table": table}).scalar())


__all__ = [
    "COORDINATOR_FUNCTIONS",
    "DEFAULT_SHARD_COUNT",
    "DISTRIBUTED_TABLES",
    "LAYOUT",
    "REFERENCE_TABLES",
    "WORKER_NODES",
    "Distribution",
    "citus_installed",
    "distribute",
    "prepare_migration",
]
