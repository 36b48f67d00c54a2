"""Input the store must refuse with ``episodic.errors.ValidationError`` before writing, found by
the T10 fuzz (``tests/reliability/test_t10_fuzz.py``), shrunk to one call each.

Each test asserts the documented behaviour ("every refusal is a typed exception from
``episodic.errors`` and leaves the store exactly as it was") and is a strict xfail while the
bug stands: when the library is fixed the test passes, the xfail turns into a failure, and the
marker (and the matching ``KNOWN_BUGS`` entry in the fuzz module) must be removed.

Run: ``EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
.venv/bin/pytest tests/regressions -q``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from episodic import EpisodicStore, Message, ToolCall, Usage
from episodic.errors import ValidationError
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


@pytest.mark.xfail(
    strict=True,
    reason="BUG-1: append stores a Message built with model_construct (role 'wizard'); every "
    "later load_context/read_events of the conversation raises pydantic's ValidationError",
)
async def test_append_refuses_a_message_with_an_unknown_role(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(url, lambda: store.append(conv, [unvalidated(role="wizard")]))
    await store.load_context(conv)  # the conversation must stay readable


@pytest.mark.xfail(
    strict=True,
    reason="BUG-1: a user message carrying tool_calls (model_construct) is committed and then "
    "append raises pydantic's ValidationError: an error after a write, and a poisoned log",
)
async def test_append_refuses_an_invalid_shape_and_writes_nothing(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    bad = unvalidated(tool_calls=(ToolCall(id="c1", name="t"),))
    await refused_and_unchanged(url, lambda: store.append(conv, [bad]))
    await store.read_events(conv)


# ---- BUG-2: provider usage is not bounded ------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="BUG-2: Usage(input_tokens=2**63) reaches the driver (asyncpg DataError / "
    "sqlite OverflowError) instead of a ValidationError",
)
async def test_append_refuses_usage_beyond_bigint(opened: tuple[EpisodicStore, str]) -> None:
    store, url = opened
    conv = await store.create_conversation()
    usage = Usage(input_tokens=2**63)
    await refused_and_unchanged(url, lambda: store.append(conv, [Message.user("x")], usage=usage))


@pytest.mark.xfail(
    strict=True,
    reason="BUG-2: Usage(input_tokens=2**63-1) overflows the head's bigint arithmetic "
    "(asyncpg NumericValueOutOfRangeError, SQLSTATE 22003, untranslated)",
)
async def test_append_refuses_usage_that_overflows_the_head(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    usage = Usage(input_tokens=2**63 - 1)
    await refused_and_unchanged(url, lambda: store.append(conv, [Message.user("x")], usage=usage))


# ---- BUG-3: the queue's entry points do not validate their arguments ---------------------


@pytest.mark.xfail(
    strict=True,
    reason="BUG-3: claim_conversation accepts lease_seconds=0 (and negative): a lease that "
    "has expired when granted; claim_due refuses the same value",
)
async def test_claim_conversation_refuses_a_non_positive_lease(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(url, lambda: store.claim_conversation(conv, "w", lease_seconds=0))


@pytest.mark.parametrize("lease", [float("nan"), float("inf")])
@pytest.mark.xfail(
    strict=True,
    reason="BUG-3: claim_conversation(lease_seconds=nan/inf) reaches the database "
    "(DatetimeFieldOverflowError on PostgreSQL, OverflowError/ValueError on SQLite)",
)
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
    ],
    ids=["limit-none", "lease-none", "limit-2**63", "lease-nan"],
)
@pytest.mark.xfail(
    strict=True,
    reason="BUG-3: claim_due checks only `limit < 1 or lease_seconds <= 0`: None raises "
    "TypeError, 2**63 and nan reach the driver",
)
async def test_claim_due_refuses_bad_arguments(
    opened: tuple[EpisodicStore, str], kwargs: dict[str, Any]
) -> None:
    store, url = opened
    await refused_and_unchanged(url, lambda: store.claim_due("w", **kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [{"owner": {}}, {"owner": "w\ud800"}, {"reason": b"r"}, {"reason": "r\udfff"}],
    ids=["owner-dict", "owner-surrogate", "reason-bytes", "reason-surrogate"],
)
@pytest.mark.xfail(
    strict=True,
    reason="BUG-3: claim_conversation passes owner and reason to the database unchecked: "
    "asyncpg DataError on PostgreSQL; SQLite stores them",
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


@pytest.mark.xfail(
    strict=True,
    reason="BUG-4: a tenant_id with a lone surrogate reaches the driver (asyncpg DataError / "
    "UnicodeEncodeError on SQLite); _check_tenant checks NUL but not UTF-8 encodability",
)
async def test_create_conversation_refuses_a_surrogate_tenant(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    await refused_and_unchanged(url, lambda: store.create_conversation(tenant_id="t\ud800"))


@pytest.mark.xfail(
    strict=True,
    reason="BUG-4: an idempotency key with a lone surrogate reaches the driver (asyncpg "
    "DataError / UnicodeEncodeError on SQLite); prepare_batch checks NUL and length only",
)
async def test_append_refuses_a_surrogate_idempotency_key(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(
        url, lambda: store.append(conv, [Message.user("x")], idempotency_key="k\udfff")
    )


@pytest.mark.xfail(
    strict=True,
    reason="BUG-4: a lone surrogate in a metadata key is silently replaced by U+FFFD when "
    "the message is dumped to JSON (pydantic), so the stored key differs from the one sent; "
    "the same character in a value is refused",
)
async def test_append_refuses_or_keeps_a_surrogate_metadata_key(
    opened: tuple[EpisodicStore, str],
) -> None:
    store, url = opened
    conv = await store.create_conversation()
    await refused_and_unchanged(
        url, lambda: store.append(conv, [Message.user("x", metadata={"k\ud800": 1})])
    )


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
    ],
)
@pytest.mark.xfail(
    strict=True,
    reason="BUG-5: write_boundary validates summary/covers>=1/retained items/reason/retention "
    "only: covers over 2**63-1 reaches the driver, wrong types for model, prompt_version, "
    "usage, pressure, retained and tokens_before raise pydantic ValidationError, "
    "AttributeError or TypeError, and a negative tokens_before is stored",
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
    await refused_and_unchanged(url, lambda: store.write_boundary(conv, **kwargs))


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
        _deep_raw_block,
    ],
    ids=["none", "str", "tool_calls-float", "deep-raw-block"],
)
@pytest.mark.xfail(
    strict=True,
    reason="BUG-6: Message.from_openai raises TypeError/ValueError for a non-mapping or a "
    "non-list tool_calls, and pydantic's ValidationError for a raw block nested past "
    "pydantic's depth limit (blocks are built outside the try that converts ValueError)",
)
def test_from_openai_refuses_with_validation_error(make: Callable[[], Any]) -> None:
    with pytest.raises(ValidationError):
        Message.from_openai(make())
