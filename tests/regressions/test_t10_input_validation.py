"""Input the store must refuse with ``episodic.errors.ValidationError`` before writing, found by
the T10 fuzz (``tests/reliability/test_t10_fuzz.py``), shrunk to one call each.

Each test asserts the documented behaviour ("every refusal is a typed exception from
``episodic.errors`` and leaves the store exactly as it was"). They were strict xfails while
the bugs (BUG-1 to BUG-6 of the fuzz report) stood; the library is fixed and they stay as
plain regression tests, with the fuzz module's ``KNOWN_BUGS`` emptied.

Run: ``EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
.venv/bin/pytest tests/regressions -q``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import uuid4

import pytest

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall, Usage, messages_from_openai
from episodic.errors import ConflictError, ValidationError
from episodic.models import MAX_TOKEN_COUNT
from tests.conftest import isolated_settings
from tests.support import snapshot


@pytest.fixture
async def opened(database_url: str) -> AsyncIterator[tuple[EpisodicStore, str]]:
    store = await EpisodicStore.open(database_url, settings=isolated_settings())
    try:
        yield store, database_url
    finally:
        await store.close()


async def refused_and_unchanged(url: str, call: Callable[[], Awaitable[Any]]) -> None:
    """``call`` raises an episodic ValidationError and no table changed."""
    before = await snapshot(url)
    with pytest.raises(ValidationError):
        await call()
    assert await snapshot(url) == before


def unvalidated(**fields: Any) -> Message:
    base = dict(Message.user("x"))
    base.update(fields)
    return Message.model_construct(**base)


# ---- BUG-1: append trusts any Message instance, even one built without validation --------


async def test_append_refuses_a_message_with_an_unknown_role(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(url, lambda: store.append(conv, [unvalidated(role="wizard")]))
    await store.load_context(conv)  # the conversation must stay readable


async def test_append_refuses_an_invalid_shape_and_writes_nothing(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    bad = unvalidated(tool_calls=(ToolCall(id="c1", name="t"),))
    await refused_and_unchanged(url, lambda: store.append(conv, [bad]))
    await store.read_events(conv)


async def test_append_refuses_a_tool_result_without_its_call_id(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    bad = unvalidated(role="tool", content="r")  # was a bare assert in prepare_batch
    await refused_and_unchanged(url, lambda: store.append(conv, [bad]))


async def test_append_keeps_a_valid_message_built_without_validation(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, _ = opened
    conv = await store.create_conversation()
    [event] = await store.append(conv, [unvalidated(content=(), tool_calls=None)])
    [back] = await store.read_events(conv)
    assert back.message == event.message
    assert back.message.content == ()  # empty content is kept, not dropped as a default


# ---- BUG-2: provider usage is not bounded ------------------------------------------------


def test_usage_counts_are_bounded() -> None:
    assert Usage(input_tokens=MAX_TOKEN_COUNT).input_tokens == MAX_TOKEN_COUNT
    with pytest.raises(ValidationError):
        Usage(input_tokens=MAX_TOKEN_COUNT + 1)


# Usage itself refuses these counts now; model_construct gets them past it, as buggy caller
# code can, and append must still refuse them before any SQL.


async def test_append_refuses_usage_beyond_bigint(opened: tuple[EpisodicStore, str]) -> None:
    store, url = opened
    conv = await store.create_conversation()
    usage = Usage.model_construct(input_tokens=2**63)
    await refused_and_unchanged(url, lambda: store.append(conv, [Message.user("x")], usage=usage))


async def test_append_refuses_usage_that_overflows_the_head(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    usage = Usage.model_construct(input_tokens=2**63 - 1)
    await refused_and_unchanged(url, lambda: store.append(conv, [Message.user("x")], usage=usage))


# ---- BUG-3: the queue's entry points do not validate their arguments ---------------------


async def test_claim_conversation_refuses_a_non_positive_lease(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(url, lambda: store.claim_conversation(conv, "w", lease_seconds=0))


@pytest.mark.parametrize("lease", [float("nan"), float("inf")])
async def test_claim_conversation_refuses_a_non_finite_lease(
    opened: tuple[EpisodicStore, str], lease: float
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(
        url, lambda: store.claim_conversation(conv, "w", lease_seconds=lease)
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": None, "lease_seconds": 1.0},
        {"limit": 1, "lease_seconds": None},
        {"limit": 2**63, "lease_seconds": 1.0},
        {"limit": 1, "lease_seconds": float("nan")},
        {"limit": 1, "lease_seconds": 2**64},
        {"limit": True, "lease_seconds": 1.0},
    ],
    ids=["limit-none", "lease-none", "limit-2**63", "lease-nan", "lease-2**64", "limit-bool"],
)
async def test_claim_due_refuses_bad_arguments(
    opened: tuple[EpisodicStore, str], kwargs: dict[str, Any]
) -> None:
    store, url = opened
    await refused_and_unchanged(url, lambda: store.claim_due("w", **kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"owner": {}},
        {"owner": "w\ud800"},
        {"owner": "w\x00"},
        {"owner": ""},
        {"reason": b"r"},
        {"reason": "r\udfff"},
        {"reason": "r" * 513},
    ],
    ids=[
        "owner-dict",
        "owner-surrogate",
        "owner-nul",
        "owner-empty",
        "reason-bytes",
        "reason-surrogate",
        "reason-long",
    ],
)
async def test_claim_conversation_refuses_a_bad_owner_or_reason(
    opened: tuple[EpisodicStore, str], kwargs: dict[str, Any]
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    args = {"owner": "w", "reason": "manual_recovery", **kwargs}
    await refused_and_unchanged(
        url,
        lambda: store.claim_conversation(
            conv, args["owner"], lease_seconds=1.0, reason=args["reason"]
        ),
    )


# ---- BUG-4: lone surrogates in values stored as database text ----------------------------


async def test_create_conversation_refuses_a_surrogate_tenant(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    await refused_and_unchanged(url, lambda: store.create_conversation(tenant_id="t\ud800"))


async def test_append_refuses_a_surrogate_idempotency_key(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(
        url, lambda: store.append(conv, [Message.user("x")], idempotency_key="k\udfff")
    )


async def test_append_refuses_or_keeps_a_surrogate_metadata_key(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(
        url, lambda: store.append(conv, [Message.user("x", metadata={"k\ud800": 1})])
    )


async def test_append_refuses_a_surrogate_key_nested_in_metadata(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    message = Message.user("x", metadata={"outer": [{"k\udfff": 1}]})
    await refused_and_unchanged(url, lambda: store.append(conv, [message]))


# ---- BUG-5: write_boundary leaves arguments unchecked ------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"covers_through_seq": 2**64},
        {"model": 5},
        {"prompt_version": ["v1"]},
        {"usage": {"input_tokens": 1}},
        {"pressure": {"estimated_context_tokens": 1}},
        {"retained": 3.5},
        {"tokens_before": -1},
        {"tokens_before": "many"},
        {"tokens_before": MAX_TOKEN_COUNT + 1},
        {"usage": Usage.model_construct(input_tokens=2**63)},
        {"reason": 5},
        {"reason": ""},
        {"model": "m\x00"},
        {"prompt_version": "v\ud800"},
        {"lease_token": "not-a-uuid"},
        {"lease_token": str(uuid4())},
        {"handoff_items": "a compaction"},
        {"handoff_items": [{"content": "no type, no role"}]},
        {"handoff_items": [{"role": "user", "content": "x"}], "retained": ["y"]},
        {"handoff_items": [{"type": "compaction", "encrypted_content": "\ud800"}]},
        {"expected_last_seq": -1},
    ],
    ids=[
        "covers-2**64",
        "model-int",
        "prompt_version-list",
        "usage-dict",
        "pressure-dict",
        "retained-float",
        "tokens_before-negative",
        "tokens_before-str",
        "tokens_before-huge",
        "usage-unvalidated",
        "reason-int",
        "reason-empty",
        "model-nul",
        "prompt_version-surrogate",
        "lease_token-str",
        "lease_token-uuid-text",
        "handoff_items-str",
        "handoff_items-untyped",
        "handoff_items-with-retained",
        "handoff_items-surrogate",
        "expected_last_seq-negative",
    ],
)
async def test_write_boundary_refuses_bad_arguments(
    opened: tuple[EpisodicStore, str], bad: dict[str, Any]
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.user("b")])
    kwargs: dict[str, Any] = {
        "summary": "s",
        "covers_through_seq": 1,
        "reason": "manual_recovery",
        "expected_boundary_seq": None,
        **bad,
    }
    await refused_and_unchanged(url, lambda: store.write_boundary(conv, BoundaryRequest(**kwargs)))


async def test_a_boundary_that_expects_another_end_of_the_log_writes_nothing(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.user("b")])
    before = await snapshot(url)
    request = BoundaryRequest(
        summary="",
        handoff_items=[{"type": "compaction", "encrypted_content": "x"}],
        covers_through_seq=2,
        reason="openai_responses_compaction",
        expected_boundary_seq=None,
        expected_last_seq=1,
    )
    with pytest.raises(ConflictError, match="ends at seq 2, not the expected 1"):
        await store.write_boundary(conv, request)
    assert await snapshot(url) == before


async def test_write_boundary_refuses_a_summary_over_the_message_limit(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("a"), Message.user("b")])
    summary = "s" * (store.max_message_bytes + 1)
    await refused_and_unchanged(
        url,
        lambda: store.write_boundary(
            conv,
            BoundaryRequest(
                summary=summary,
                covers_through_seq=1,
                reason="manual_recovery",
                expected_boundary_seq=None,
            ),
        ),
    )


# ---- BUG-6: Message.from_openai lets untyped errors out ----------------------------------


def _deep_raw_block() -> dict[str, Any]:
    deep: Any = 1
    for _ in range(1_000):
        deep = {"k": deep}
    return {"role": "user", "content": [{"type": "x", "v": deep}]}


@pytest.mark.parametrize(
    "make",
    [
        lambda: None,
        lambda: "user",
        lambda: {"role": "assistant", "content": None, "tool_calls": 1.5},
        lambda: {"role": "assistant", "content": None, "tool_calls": "abc"},
        _deep_raw_block,
        lambda: {"role": "user", "content": "x", "extra": _deep_raw_block()},
    ],
    ids=["none", "str", "tool_calls-float", "tool_calls-str", "deep-raw-block", "deep-native"],
)
def test_from_openai_refuses_with_validation_error(make: Callable[[], Any]) -> None:
    with pytest.raises(ValidationError):
        Message.from_openai(make())


@pytest.mark.parametrize(
    "items", [None, "user", [None], [{"role": "tool", "tool_call_id": [], "content": "x"}]]
)
def test_messages_from_openai_refuses_with_validation_error(items: Any) -> None:
    with pytest.raises(ValidationError):
        messages_from_openai(items)
