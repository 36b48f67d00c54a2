"""The append contract, on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

import pytest

from episodic import (
    ConflictError,
    DuplicateToolCallError,
    EpisodicStore,
    IdempotencyMismatchError,
    Message,
    MessageEvent,
    NotFoundError,
    OrphanToolResultError,
    ToolCall,
    Usage,
    ValidationError,
)
from episodic.store.projection import rebuild_head
from tests.support import counters_of, snapshot


def call(call_id: str, name: str = "run", **args: object) -> ToolCall:
    return ToolCall(id=call_id, name=name, args=dict(args))


async def test_append_returns_stored_events_with_seqs(store: EpisodicStore) -> None:
    conv = await store.create_conversation(tenant_id="acme", metadata={"model": "gpt-4.1"})
    first = await store.append(conv, [Message.user("Fix the failing test")])
    second = await store.append(
        conv,
        [
            Message.assistant(None, tool_calls=[call("c1", cmd="pytest")]),
            Message.tool_result("c1", "1 failed", name="run", is_error=True),
        ],
        usage=Usage(input_tokens=120, output_tokens=30),
    )
    assert [e.seq for e in first + second] == [1, 2, 3]
    assert second[1].message.tool_call_id == "c1"
    assert second[1].message.seq == 3
    assert second[0].usage == Usage(input_tokens=120, output_tokens=30)
    stored = await store.read_events(conv)
    assert stored == first + second


async def test_read_events_pages_by_seq(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user(f"m{i}") for i in range(10)])
    page = await store.read_events(conv, after_seq=3, limit=4)
    assert [e.seq for e in page] == [4, 5, 6, 7]
    assert await store.read_events(conv, after_seq=10) == []


async def test_concurrent_single_appends_are_gapless(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    start = asyncio.Event()

    async def writer(w: int) -> list[int]:
        await start.wait()
        seqs = []
        for i in range(250):
            [event] = await store.append(conv, [Message.user(f"writer {w} message {i}")])
            seqs.append(event.seq)
        return seqs

    tasks = [asyncio.create_task(writer(w)) for w in range(8)]
    await asyncio.sleep(0)
    start.set()
    per_writer = await asyncio.gather(*tasks)

    events = await store.read_events(conv, limit=10_000)
    assert [e.seq for e in events] == list(range(1, 2001))
    assert sorted(s for seqs in per_writer for s in seqs) == list(range(1, 2001))
    for w, seqs in enumerate(per_writer):
        # Each writer's appends are in the log in its program order.
        assert seqs == sorted(seqs)
        texts = [e.message.text for e in events if isinstance(e, MessageEvent)]
        mine = [t for t in texts if t.startswith(f"writer {w} ")]
        assert mine == [f"writer {w} message {i}" for i in range(250)]


async def test_concurrent_batches_never_interleave(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    start = asyncio.Event()

    async def batch(name: str) -> list[int]:
        await start.wait()
        events = await store.append(conv, [Message.user(f"{name}{i}") for i in range(500)])
        return [e.seq for e in events]

    tasks = [asyncio.create_task(batch(n)) for n in "ab"]
    await asyncio.sleep(0)
    start.set()
    a, b = await asyncio.gather(*tasks)
    for seqs in (a, b):
        assert seqs == list(range(seqs[0], seqs[0] + 500))
    assert sorted(a + b) == list(range(1, 1001))
    events = await store.read_events(conv, limit=2000)
    for seqs, name in ((a, "a"), (b, "b")):
        block = [e for e in events if e.seq in set(seqs)]
        assert all(isinstance(e, MessageEvent) and e.message.text.startswith(name) for e in block)


async def test_same_idempotency_key_fifty_times_concurrently_writes_once(
    store: EpisodicStore,
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("before")])
    batch = [Message.user("retry me"), Message.assistant("ok")]
    start = asyncio.Event()

    async def send() -> list[int]:
        await start.wait()
        events = await store.append(conv, batch, idempotency_key="req-17")
        return [e.seq for e in events]

    tasks = [asyncio.create_task(send()) for _ in range(50)]
    await asyncio.sleep(0)
    start.set()
    results = await asyncio.gather(*tasks)
    assert all(r == [2, 3] for r in results)
    events = await store.read_events(conv)
    assert [e.seq for e in events] == [1, 2, 3]

    with pytest.raises(IdempotencyMismatchError) as raised:
        await store.append(conv, [Message.user("something else")], idempotency_key="req-17")
    assert raised.value.key == "req-17"
    assert [e.seq for e in await store.read_events(conv)] == [1, 2, 3]


async def test_replay_returns_the_original_events(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    first = await store.append(conv, [Message.user("hi")], idempotency_key="k")
    await store.append(conv, [Message.user("later")])
    again = await store.append(conv, [Message.user("hi")], idempotency_key="k", expected_seq=0)
    assert again == first


async def test_client_ids_make_retries_idempotent(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    batch = [Message.user("hello", client_id="m-1"), Message.assistant("hi", client_id="m-2")]
    first = await store.append(conv, batch)
    assert await store.append(conv, batch) == first
    with pytest.raises(IdempotencyMismatchError):
        await store.append(conv, [Message.user("other", client_id="m-2")])
    with pytest.raises(ValidationError):
        await store.append(
            conv, [Message.user("a", client_id="x"), Message.user("b", client_id="x")]
        )
    assert len(await store.read_events(conv)) == 2


async def test_stale_expected_seq_conflicts_and_writes_nothing(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("one")], expected_seq=0)
    await store.append(conv, [Message.user("two")], expected_seq=1)
    before = await snapshot(database_url)
    with pytest.raises(ConflictError) as raised:
        await store.append(conv, [Message.user("stale")], expected_seq=1)
    assert (raised.value.expected_seq, raised.value.actual_seq) == (1, 2)
    assert await snapshot(database_url) == before


async def test_open_tool_calls_are_tracked_and_closed_as_abandoned(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(
        conv,
        [
            Message.user("look around"),
            Message.assistant("checking", tool_calls=[call("b"), call("a"), call("c")]),
            Message.tool_result("c", "done", name="run"),
        ],
    )
    head = await store.get_conversation(conv)
    assert head.open_tool_calls == {"a": 2, "b": 2}
    completed = await store.mark_run_completed(conv)
    assert completed.abandoned_tool_call_ids == ("a", "b")
    assert completed.seq == 4
    head = await store.get_conversation(conv)
    assert head.open_tool_calls == {}
    assert head.user_messages_since_run_completed == 0
    assert head.run_completed_since_boundary == 1
    with pytest.raises(OrphanToolResultError) as raised:
        await store.append(conv, [Message.tool_result("a", "late", name="run")])
    assert raised.value.abandoned
    assert "abandoned" in str(raised.value)


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("unknown_conversation", NotFoundError),
        ("orphan_result", OrphanToolResultError),
        ("already_answered", OrphanToolResultError),
        ("duplicate_open_call_id", DuplicateToolCallError),
        ("duplicate_call_id_in_batch", DuplicateToolCallError),
        ("result_before_its_call", OrphanToolResultError),
        ("result_for_abandoned_call", OrphanToolResultError),
        ("too_large", ValidationError),
        ("empty_batch", ValidationError),
        ("not_a_message", ValidationError),
        ("unpaired_surrogate", ValidationError),
        ("bad_conversation_id", ValidationError),
        ("negative_expected_seq", ValidationError),
        ("malformed_openai_content", ValidationError),
        ("unknown_role", ValidationError),
    ],
)
async def test_invalid_input_is_refused_and_changes_nothing(
    store: EpisodicStore, database_url: str, case: str, error: type[Exception]
) -> None:
    conv = await store.create_conversation(tenant_id="acme")
    await store.append(
        conv,
        [
            Message.user("start"),
            Message.assistant(None, tool_calls=[call("open1"), call("done1")]),
            Message.tool_result("done1", "ok", name="run"),
        ],
    )
    other = await store.create_conversation(tenant_id="acme")
    await store.append(other, [Message.assistant(None, tool_calls=[call("gone")])])
    await store.mark_run_completed(other)
    before = await snapshot(database_url)
    small = EpisodicStore(store._backend, estimator=store.estimator, max_message_bytes=1_000)

    attempts = {
        "unknown_conversation": lambda: store.append(uuid4(), [Message.user("x")]),
        "orphan_result": lambda: store.append(conv, [Message.tool_result("nope", "x")]),
        "already_answered": lambda: store.append(conv, [Message.tool_result("done1", "again")]),
        "duplicate_open_call_id": lambda: store.append(
            conv, [Message.assistant(None, tool_calls=[call("open1")])]
        ),
        "duplicate_call_id_in_batch": lambda: store.append(
            conv,
            [
                Message.assistant(None, tool_calls=[call("n1")]),
                Message.assistant(None, tool_calls=[call("n1")]),
            ],
        ),
        "result_before_its_call": lambda: store.append(
            conv,
            [Message.tool_result("n2", "early"), Message.assistant(None, tool_calls=[call("n2")])],
        ),
        "result_for_abandoned_call": lambda: store.append(
            other, [Message.tool_result("gone", "late")]
        ),
        "too_large": lambda: small.append(conv, [Message.user("x" * 2_000)]),
        "empty_batch": lambda: store.append(conv, []),
        "not_a_message": lambda: store.append(conv, [{"role": "user", "content": "hi"}]),  # type: ignore[list-item]
        "unpaired_surrogate": lambda: store.append(conv, [Message.user("bad \ud800 text")]),
        "bad_conversation_id": lambda: store.append("not-a-uuid", [Message.user("x")]),
        "negative_expected_seq": lambda: store.append(conv, [Message.user("x")], expected_seq=-1),
        "malformed_openai_content": lambda: store.append(
            conv, [Message.from_openai({"role": "user", "content": 42})]
        ),
        "unknown_role": lambda: store.append(
            conv, [Message.from_openai({"role": "wizard", "content": "hi"})]
        ),
    }
    with pytest.raises(error):
        await attempts[case]()
    assert await snapshot(database_url) == before


async def test_head_is_the_fold_of_the_log(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.user("b")])
    await store.append(
        conv,
        [Message.assistant("calling", tool_calls=[call("x1"), call("x2")])],
        usage=Usage(input_tokens=1_000, output_tokens=12),
    )
    await store.append(conv, [Message.tool_result("x1", "result " * 50, name="run")])
    await store.mark_run_completed(conv)
    await store.append(
        conv, [Message.user("again"), Message.assistant(None, tool_calls=[call("y")])]
    )
    await store.append(conv, [Message.user("more")], usage=Usage(input_tokens=5_000))

    head = await store.get_conversation(conv)
    assert rebuild_head(await store.read_events(conv)) == counters_of(head)
    assert head.total_user_messages == 4
    assert head.user_messages_since_run_completed == 2
    assert head.open_tool_calls == {"y": 7}
    assert head.usage_input_tokens == 5_000


async def test_create_conversation_with_a_given_id(store: EpisodicStore) -> None:
    wanted = uuid4()
    assert await store.create_conversation(conversation_id=str(wanted)) == wanted
    with pytest.raises(ConflictError):
        await store.create_conversation(conversation_id=wanted)
    head = await store.get_conversation(wanted)
    assert isinstance(head.conversation_id, UUID)
    assert head.tenant_id == "default"
    with pytest.raises(ValidationError):
        await store.create_conversation(tenant_id="")
    with pytest.raises(NotFoundError):
        await store.read_events(uuid4())


async def test_every_message_shape_reads_back_as_written(store: EpisodicStore) -> None:
    from episodic import ImageBlock, TextBlock
    from episodic.models import NativePayload, RawBlock

    conv = await store.create_conversation()
    written = [
        Message.user(
            (
                TextBlock(text="what is in this picture?"),
                ImageBlock(url="data:image/png;base64,AAAA", detail="low", alt="a cat"),
                RawBlock(data={"type": "input_audio", "input_audio": {"data": "UklGR"}}),
            ),
            client_id="u-1",
            metadata={"lang": "en"},
        ),
        Message.assistant(
            "Looking.",
            tool_calls=[
                ToolCall(
                    id="v1", name="vision", args={"q": "cat?"}, arguments_json='{"q" : "cat?"}'
                )
            ],
            reasoning="The user wants a description.",
            native=NativePayload(protocol="anthropic", data={"signature": "opaque"}),
        ),
        Message.tool_result("v1", "a tabby cat \x00 on a mat ✓ 🐈", name="vision", is_error=False),
        Message.system("be brief"),
    ]
    await store.append(conv, written)
    events = await store.read_events(conv)
    read = [
        e.message.model_copy(update={"seq": None, "created_at": None, "token_estimate": None})
        for e in events
        if isinstance(e, MessageEvent)
    ]
    assert read == written
