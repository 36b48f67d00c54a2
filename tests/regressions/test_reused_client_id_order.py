"""A batch that reuses several client ids is refused naming the first of them in the batch's
order, on both backends (hypothesis found PostgreSQL naming the index's first, and the Python
twin the batch's)."""

from __future__ import annotations

import pytest

from episodic import EpisodicStore, IdempotencyMismatchError, Message


async def test_the_first_reused_client_id_in_the_batch_is_named(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a", client_id="m1"), Message.user("a", client_id="m2")])
    with pytest.raises(IdempotencyMismatchError) as raised:
        await store.append(
            conv, [Message.user("a", client_id="m2"), Message.user("a", client_id="m1")]
        )
    assert raised.value.key == "m2"
