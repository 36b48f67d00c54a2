"""``load_stored_context``, the context a server answers in episodic's own JSON without a
model per stored message, is ``load_context``'s: on messages of every shape (the codec's
generated ones: blocks, calls, metadata with nested nulls, native payloads, reasoning), on
PostgreSQL and SQLite. (tests/contract/test_context_properties.py checks the same on random
agent runs with boundaries, run completions and late results.)"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episodic import BoundaryRequest, EpisodicStore, Message
from episodic.errors import EpisodicError
from tests.support import assert_stored_context_is
from tests.unit.test_codec import messages

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(batches=st.lists(st.lists(messages, min_size=1, max_size=4), min_size=1, max_size=4))
async def test_a_stored_context_is_the_loaded_context(
    store: EpisodicStore, batches: list[list[Message]]
) -> None:
    conversation = await store.create_conversation()
    for batch in batches:
        try:
            await store.append(conversation, batch)
        except EpisodicError:
            continue  # a batch the store refuses (a reused client id, ...) writes nothing
    assert_stored_context_is(
        await store.load_stored_context(conversation), await store.load_context(conversation)
    )


async def test_a_stored_context_behind_a_boundary_is_the_loaded_context(
    store: EpisodicStore,
) -> None:
    conversation = await store.create_conversation()
    first = await store.append(
        conversation, [Message.user("fix the refund job"), Message.assistant("on it")]
    )
    await store.write_boundary(
        conversation,
        BoundaryRequest(
            summary="the refund job posts twice",
            covers_through_seq=first[-1].seq,
            retained=["fix the refund job"],
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    await store.append(conversation, [Message.user("and the test?")])
    stored = await store.load_stored_context(conversation)
    assert_stored_context_is(stored, await store.load_context(conversation))
    # the handoff and the retained message are models, the tail a stored view
    assert [type(m).__name__ for m in stored.messages] == ["Message", "Message", "StoredMessage"]
