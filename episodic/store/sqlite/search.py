"""store.search on SQLite: one conversation's messages indexed with FTS5 for the one query.

The index lives in a temporary table of the searching connection and is dropped after the
query, so nothing is kept beside the log: an append does no indexing work, and an erasure has
nothing else to remove. The work is the PostgreSQL backend's (postgres/queries.py,
SEARCH_EVENTS): the text of each message (its content, its tool calls' names and arguments,
its tool name, and a tool result's call) parsed per search; FTS5 finds which message holds
which term (FTS5's Porter stemmer standing in for PostgreSQL's English configuration) and
episodic.search.rank_hits ranks them as PostgreSQL's statement does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from episodic.models import StoredEvent
from episodic.search import prefix_forms, rank_hits
from episodic.store.codec import EVENT_COLUMNS, decode_event_row
from episodic.store.schema import events

# A message's searchable text: every string of its content, its tool calls (but their ids:
# the element [1][n]'s key "id"), their arguments' JSON (the arguments' names too) and its tool
# name; a tool result's also its call's name and arguments as JSON (the newest call with its
# id before it), as PostgreSQL's statement reads them.
_MESSAGE_TEXT = """
(SELECT group_concat(j.value, ' ')
   FROM json_tree(json_array(
            m.payload -> '$.content', m.payload -> '$.tool_calls', m.payload -> '$.name',
            (SELECT group_concat(json_extract(c.value, '$.args'), ' ')
               FROM json_each(m.payload, '$.tool_calls') AS c),
            m.said)) AS j
  WHERE j.type = 'text' AND NOT (j.key = 'id' AND j.path GLOB '$[[]1][[][0-9]*]'))
"""

_INDEX = f"""
WITH msgs AS MATERIALIZED (
    SELECT e.seq, e.payload
      FROM episodic_events e
     WHERE e.conversation_id = :conversation_id AND e.kind = 'message'
       AND e.seq > (SELECT coalesce(max(c.seq), 0) FROM episodic_events c
                     WHERE c.conversation_id = :conversation_id AND c.kind = 'clear')
       -- one read of the retractions, not one per message (that was quadratic in the log)
       AND e.seq NOT IN (SELECT json_extract(r.payload, '$.retracted_seq')
                           FROM episodic_events r
                          WHERE r.conversation_id = :conversation_id
                            AND r.kind = 'retraction')
),
calls AS MATERIALIZED (
    SELECT m.seq, json_extract(c.value, '$.id') AS id,
           json_array(c.value -> '$.name', c.value -> '$.args',
                      c.value -> '$.arguments_json') AS said
      FROM msgs m, json_each(m.payload, '$.tool_calls') AS c
),
answered AS MATERIALIZED (
    -- SQLite takes the bare column from the row that holds the max: the newest call
    SELECT m.seq, k.said, max(k.seq)
      FROM msgs m JOIN calls k ON k.id = json_extract(m.payload, '$.tool_call_id')
                              AND k.seq < m.seq
     GROUP BY m.seq
),
texts AS (
    SELECT m.seq, m.payload, a.said FROM msgs m LEFT JOIN answered a ON a.seq = m.seq
)
INSERT INTO temp.{{table}} (rowid, body)
SELECT m.seq, {_MESSAGE_TEXT} FROM texts AS m
"""


async def search_events(
    conn: AsyncConnection, conversation_id: UUID, terms: Sequence[str], limit: int
) -> list[StoredEvent]:
    """The conversation's messages holding any of ``terms``, ranked by
    :func:`episodic.search.rank_hits`; at most ``limit``."""
    if not terms:
        return []
    table = f"episodic_search_{uuid4().hex}"
    await conn.execute(
        text(f"CREATE VIRTUAL TABLE temp.{table} USING fts5(body, tokenize = 'porter unicode61')")
    )
    params: dict[str, Any] = {"conversation_id": conversation_id.hex}
    try:
        await conn.execute(text(_INDEX.format(table=table)), params)
        documents = await conn.scalar(text(f"SELECT count(*) FROM temp.{table}"))
        matches = []
        for index, term in enumerate(terms):
            # Each term a phrase (FTS5's own syntax, AND, NEAR, *, is never read from a
            # query), a long word a prefix too, as on PostgreSQL.
            forms = ['"' + form.replace('"', '""') + '"' for form in prefix_forms(term)]
            params[f"term{index}"] = (
                " OR ".join(f"{form}*" for form in forms) if forms else '"' + term + '"'
            )
            matches.append(
                f"SELECT rowid, {index} FROM temp.{table} WHERE {table} MATCH :term{index}"
            )
        hits = await conn.execute(text(" UNION ALL ".join(matches)), params)
        best = rank_hits(((row[0], row[1]) for row in hits), documents or 0, limit)
        if not best:
            return []
        rows = await conn.execute(
            select(*(events.c[name] for name in EVENT_COLUMNS)).where(
                events.c.conversation_id == conversation_id, events.c.seq.in_(best)
            )
        )
        found = {row[0]: decode_event_row(conversation_id, row) for row in rows}
        return [found[seq] for seq in best if seq in found]
    finally:
        await conn.execute(text(f"DROP TABLE temp.{table}"))
