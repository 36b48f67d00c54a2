"""Claims share the queue: a worker whose first candidates another worker is leasing at that
moment claims past them, neither waiting for them nor coming back with fewer than it could
have had (on PostgreSQL and on Citus, where candidates are picked without locks)."""

from __future__ import annotations

import asyncpg

from episodic import EpisodicStore, Message
from episodic.policy import EpisodicCompactionConfig
from tests.support import asyncpg_dsn


async def test_a_claim_looks_past_candidates_another_claim_is_leasing(
    pg_store: EpisodicStore, postgres_url: str
) -> None:
    pg_store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    due = []
    for _ in range(6):  # due in this order: the queue's order
        conversation = await pg_store.create_conversation()
        await pg_store.append(conversation, [Message.user("due at once")])
        due.append(conversation)
    leasing = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        async with leasing.transaction():
            # another worker's claim in flight, holding the four first in the queue (one row
            # per statement, as a claim locks them)
            for conversation in due[:4]:
                await leasing.execute(
                    "SELECT FROM episodic_conversations WHERE conversation_id = $1 FOR UPDATE",
                    conversation,
                )
            claims = await pg_store.claim_due("w", limit=2, lease_seconds=30)
    finally:
        await leasing.close()
    assert sorted(c.conversation_id for c in claims) == sorted(due[4:])
