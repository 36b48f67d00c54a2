"""store.search on SQLite: one conversation's messages indexed with FTS5 for the one query.

The index lives in a temporary table of the searching connection and is dropped after the
query, so nothing is kept beside the log: an append does no indexing work, and an erasure has
nothing else to remove. The work is the PostgreSQL backend's (postgres/queries.py,
SEARCH_EVENTS): the text of each message (its content, its tool calls' names and arguments,
its tool name) parsed per search, the most of the query's words first, then the newest.
FTS5's Porter stemmer stands in for PostgreSQL's English configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from episodic.models import StoredEvent
from episodic.store.codec import EVENT_COLUMNS, decode_event_row
from episodic.store.schema import events

# A message's searchable text: every string under its content, tool calls and tool name.
_MESSAGE_TEXT = """
(SELECT group_concat(j.value, ' ')
   FROM json_tree(json_array(e.payload -> '$.content', e.payload -> '$.tool_calls',
                             e.payload -> '$.name')) AS j
  WHERE j.type = 'text')
"""

_INDEX = f"""
INSERT INTO temp.{{table}} (rowid, body)
SELECT e.seq, {_MESSAGE_TEXT}
  FROM episodic_events e
 WHERE e.conversation_id = :conversation_id AND e.kind = 'message'
   AND e.seq > (SELECT coalesce(max(c.seq), 0) FROM episodic_events c
                 WHERE c.conversation_id = :conversation_id AND c.kind = 'clear')
   AND NOT EXISTS (SELECT 1 FROM episodic_events r
                    WHERE r.conversation_id = :conversation_id AND r.kind = 'retraction'
                      AND json_extract(r.payload, '$.retracted_seq') = e.seq)
"""


async def search_events(
    conn: AsyncConnection, conversation_id: UUID, terms: Sequence[str], limit: int
) -> list[StoredEvent]:
    """The conversation's messages holding any of ``terms``, the most of them first, then the
    newest; at most ``limit``."""
    if not terms:
        return []
    table = f"episodic_search_{uuid4().hex}"
    await conn.execute(
        text(f"CREATE VIRTUAL TABLE temp.{table} USING fts5(body, tokenize = 'porter unicode61')")
    )
    params: dict[str, Any] = {"conversation_id": conversation_id.hex, "limit": limit}
    try:
        await conn.execute(text(_INDEX.format(table=table)), params)
        matched = []
        for index, term in enumerate(terms):
            # Each word a phrase: FTS5's own syntax (AND, NEAR, *) is never read from a query.
            params[f"term{index}"] = '"' + term.replace('"', '""') + '"'
            matched.append(
                f"(s.rowid IN (SELECT rowid FROM temp.{table} WHERE {table} MATCH :term{index}))"
            )
        columns = ", ".join(f"e.{name}" for name in EVENT_COLUMNS)
        rows = await conn.execute(
            text(
                f"SELECT {columns} FROM ("
                f" SELECT s.rowid AS seq, {' + '.join(matched)} AS matched FROM temp.{table} s"
                ") h JOIN episodic_events e"
                " ON e.conversation_id = :conversation_id AND e.seq = h.seq"
                " WHERE h.matched > 0 ORDER BY h.matched DESC, e.seq DESC LIMIT :limit"
            ).columns(*(events.c[name] for name in EVENT_COLUMNS)),  # typed as the table's
            params,
        )
        return [decode_event_row(conversation_id, row) for row in rows]
    finally:
        await conn.execute(text(f"DROP TABLE temp.{table}"))
