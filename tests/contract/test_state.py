"""State beside the log, on both backends: each change is a state event, the head's state
and the tenant's shared scopes are the fold of those events (and the head's counters still
the fold of the whole log), a retry applies its change once, a refusal writes nothing, and a
deletion hides a conversation and closes it to writes while its log is kept."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episodic import (
    ConversationDeletedError,
    EpisodicStore,
    IdempotencyMismatchError,
    Message,
    NotFoundError,
    StateChange,
    ValidationError,
)
from episodic.policy import EpisodicCompactionConfig
from episodic.store.projection import counters_of, rebuild_head
from episodic.store.state import rebuild_shared_state, rebuild_state
from tests.conftest import isolated_settings
from tests.support import snapshot

SCOPES = ("app", "user:a", "user:b")
KEYS = ("k", "flag", "profile")
#: text the database's JSON can hold (no NUL, no lone surrogate: both are refused, and tested)
texts = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=5)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    # (PostgreSQL's jsonb reads 1e16 back as an integer, as it does for ADK's own service)
    st.floats(-1e6, 1e6, allow_nan=False),
    texts,
    st.dictionaries(st.sampled_from(("name", "role")), texts, max_size=2),
)
deltas = st.dictionaries(st.sampled_from(KEYS), values, max_size=3)
changes = st.builds(
    StateChange,
    conversation=deltas,
    shared=st.dictionaries(st.sampled_from(SCOPES), deltas, max_size=2),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.one_of(st.none(), changes)),
        st.tuples(st.just("append"), st.integers(0, 2), changes, st.sampled_from([None, "r1"])),
        st.tuples(st.just("delete"), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=14,
)


async def _play(url: str, plan: list[tuple[Any, ...]]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    store = (await EpisodicStore.open(url, settings=isolated_settings())).for_tenant(tenant)
    try:
        conversations: list[uuid.UUID] = []
        own: dict[uuid.UUID, dict[str, Any]] = {}
        shared: dict[str, dict[str, Any]] = {}
        deleted: set[uuid.UUID] = set()

        def apply(cid: uuid.UUID, change: StateChange | None) -> None:
            if change is None:
                return
            own[cid].update(change.conversation)
            for scope, delta in change.shared.items():
                if delta:
                    shared.setdefault(scope, {}).update(delta)

        for index, step in enumerate(plan):
            if step[0] == "create":
                cid = await store.create_conversation(state=step[1], app_name="a", user_id="u")
                conversations.append(cid)
                own[cid] = {}
                apply(cid, step[1])
            elif step[0] == "append" and conversations:
                cid = conversations[step[1] % len(conversations)]
                if cid in deleted:
                    with pytest.raises(ConversationDeletedError):
                        await store.append(cid, [Message.user("x")], state=step[2])
                    continue
                key = f"{step[3]}-{index}" if step[3] else None
                await store.append(cid, [Message.user("x")], state=step[2], idempotency_key=key)
                if key is not None:  # a retry replays: nothing written, nothing applied again
                    await store.append(cid, [Message.user("x")], state=step[2], idempotency_key=key)
                apply(cid, step[2])
            elif step[0] == "delete" and conversations:
                cid = conversations[step[1] % len(conversations)]
                written = await store.delete_conversation(cid)
                assert (written is None) == (cid in deleted)
                deleted.add(cid)

        everything = []
        for cid in conversations:
            events = await store.read_events(cid, limit=10_000)
            everything.extend(events)
            head = await store.get_conversation(cid)
            assert counters_of(head) == rebuild_head(events)
            assert head.state == rebuild_state(events) == own[cid]
            assert (head.deleted_at is not None) == (cid in deleted)
            if cid not in deleted:
                found = await store.read_state(cid, shared=list(SCOPES))
                assert found.conversation == own[cid]
                assert found.last_seq == head.last_seq
        stored = (await store.read_state(None, shared=list(SCOPES))).shared
        assert stored == rebuild_shared_state(everything) == shared
        listed = await store.list_by_user("a", "u")
        assert {c.conversation_id for c in listed} == set(conversations) - deleted
    finally:
        await store.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=steps)
def test_state_and_head_are_the_fold_of_the_log(database_url: str, plan: list[Any]) -> None:
    asyncio.run(_play(database_url, plan))


async def test_a_retry_with_another_state_change_is_refused(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(
        conv, [Message.user("x")], state=StateChange(conversation={"k": 1}), idempotency_key="r"
    )
    with pytest.raises(IdempotencyMismatchError):
        await store.append(
            conv,
            [Message.user("x")],
            state=StateChange(conversation={"k": 2}),
            idempotency_key="r",
        )
    assert (await store.read_state(conv)).conversation == {"k": 1}


@pytest.mark.parametrize(
    "case",
    [
        "not_a_change",
        "nul_in_value",
        "nul_in_key",
        "non_finite",
        "oversized",
        "long_scope",
        "bad_touched_at",
        "app_without_user",
        "deleted",
    ],
)
async def test_a_refused_state_change_writes_nothing(
    store: EpisodicStore, database_url: str, case: str
) -> None:
    conv = await store.create_conversation()
    gone = await store.create_conversation()
    await store.delete_conversation(gone)
    before = await snapshot(database_url)
    big = "x" * store.max_message_bytes
    attempts: dict[str, Any] = {
        "not_a_change": lambda: store.append(conv, [Message.user("x")], state={"k": 1}),
        "nul_in_value": lambda: store.append(
            conv, [Message.user("x")], state=StateChange(conversation={"k": "a\x00b"})
        ),
        "nul_in_key": lambda: store.append(
            conv, [Message.user("x")], state=StateChange(shared={"s": {"a\x00": 1}})
        ),
        "non_finite": lambda: store.append(
            conv,
            [Message.user("x")],
            state=StateChange.model_construct(conversation={"k": math.inf}, shared={}),
        ),
        "oversized": lambda: store.append(
            conv, [Message.user("x")], state=StateChange(conversation={"k": big})
        ),
        "long_scope": lambda: store.append(
            conv, [Message.user("x")], state=StateChange(shared={"s" * 600: {"k": 1}})
        ),
        "bad_touched_at": lambda: store.append(conv, [Message.user("x")], touched_at=math.nan),
        "app_without_user": lambda: store.create_conversation(app_name="a"),
        "deleted": lambda: store.append(
            gone, [Message.user("x")], state=StateChange(conversation={"k": 1})
        ),
    }
    error = ConversationDeletedError if case == "deleted" else ValidationError
    with pytest.raises(error):
        await attempts[case]()
    assert await snapshot(database_url) == before


async def test_a_deleted_conversation_is_hidden_and_its_log_kept(store: EpisodicStore) -> None:
    conv = await store.create_conversation(app_name="a", user_id="u")
    await store.append(conv, [Message.user("kept")])
    deletion = await store.delete_conversation(conv)
    assert deletion is not None
    assert deletion.seq == 2
    assert await store.delete_conversation(conv) is None
    assert [e.kind for e in await store.read_events(conv)] == ["message", "deletion"]
    assert await store.list_by_user("a") == []
    for attempt in (
        lambda: store.load_context(conv),
        lambda: store.read_state(conv),
        lambda: store.mark_run_completed(conv),
        lambda: store.clear(conv),
    ):
        with pytest.raises(NotFoundError):
            await attempt()
    with pytest.raises(ConversationDeletedError, match="was deleted"):
        await store.append(conv, [Message.user("late")])
    head = await store.get_conversation(conv)
    assert head.deleted_at is not None


async def test_listing_pages_by_user_then_id(store: EpisodicStore) -> None:
    made = sorted(
        [
            ((user, await store.create_conversation(app_name="app", user_id=user)))
            for user in ("b", "a", "c", "a", "")
        ],
        key=lambda pair: (pair[0], pair[1]),
    )
    await store.create_conversation(app_name="other", user_id="a")
    seen = []
    page = await store.list_by_user("app", limit=2)
    while page:
        seen.extend((c.user_id, c.conversation_id) for c in page)
        page = await store.list_by_user("app", limit=2, after=page[-1])
    assert seen == made
    only_a = await store.list_by_user("app", "a")
    assert [c.conversation_id for c in only_a] == [cid for user, cid in made if user == "a"]


async def test_a_deleted_conversation_leaves_the_compaction_queue_for_good(
    store: EpisodicStore,
) -> None:
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("one"), Message.user("two")])
    assert (await store.get_conversation(conv)).due_since is not None
    await store.delete_conversation(conv)
    assert (await store.get_conversation(conv)).due_since is None
    assert await store.mark_due_by_age() == 0
    assert await store.claim_due("w", limit=10, lease_seconds=30) == []
    assert await store.claim_conversation(conv, "w", lease_seconds=30) is None
    assert conv not in {c.conversation_id for c in await store.list_conversations()}


async def test_concurrent_writers_to_one_scope_rebuild_as_applied(store: EpisodicStore) -> None:
    """Appends from many conversations racing to change the same shared key: the stored
    scope is the fold of the log's state events in their order (each stamped once its
    scope is locked), whoever won each race."""
    conversations = [await store.create_conversation() for _ in range(6)]

    async def writer(index: int, conv: Any) -> None:
        for turn in range(8):
            change = StateChange(shared={"app": {"k": f"{index}.{turn}", f"w{index}": turn}})
            await store.append(conv, [Message.user("x")], state=change)

    await asyncio.gather(*(writer(i, c) for i, c in enumerate(conversations)))
    events = [e for c in conversations for e in await store.read_events(c, limit=1_000)]
    stored = (await store.read_state(None, shared=["app"])).shared
    assert stored == rebuild_shared_state(events)
    assert {stored["app"][f"w{i}"] for i in range(6)} == {7}
