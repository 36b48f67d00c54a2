"""Rows become models without a second validation (store/codec.py): that shortcut must build
exactly the model validation would, for messages of every shape the log can hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from episodic.context import boundary_messages
from episodic.models import (
    BoundaryEvent,
    ImageBlock,
    Message,
    MessageEvent,
    NativePayload,
    RawBlock,
    TextBlock,
    ToolCall,
    Usage,
)
from episodic.store.codec import (
    boundary_from_payload,
    decode_event,
    decode_tail,
    epoch_seconds,
    instant,
    message_from_payload,
)

texts = st.text(max_size=30)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
objects = st.dictionaries(texts, json_values, max_size=3)
blocks = st.one_of(
    st.builds(TextBlock, text=texts),
    st.builds(
        ImageBlock,
        url=texts,
        detail=st.none() | texts,
        alt=st.none() | texts,
    ),
    st.builds(RawBlock, data=objects),
)
contents = st.one_of(texts, st.lists(blocks, max_size=3).map(tuple))
calls = st.lists(
    st.builds(
        ToolCall,
        id=st.text(min_size=1, max_size=8),
        name=st.text(min_size=1, max_size=8),
        args=objects,
        arguments_json=st.none() | texts,
    ),
    max_size=3,
    unique_by=lambda call: call.id,
).map(tuple)
common: dict[str, Any] = {
    "metadata": objects,
    "client_id": st.none() | st.text(min_size=1, max_size=8),
    "name": st.none() | texts,
    "reasoning": st.none() | texts,
    "native": st.none() | st.builds(NativePayload, protocol=st.text(min_size=1), data=objects),
}
messages = st.one_of(
    st.builds(Message.user, contents, **common),
    st.builds(
        lambda content, tool_calls, **kw: Message.assistant(content, tool_calls=tool_calls, **kw),
        st.none() | contents,
        calls,
        **common,
    ),
    st.builds(
        lambda call_id, content, is_error, **kw: Message.tool_result(
            call_id, content, is_error=is_error, **kw
        ),
        st.text(min_size=1, max_size=8),
        contents,
        st.booleans(),
        **common,
    ),
    st.builds(Message.system, texts, **common),
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def validated(payload: str, seq: int, tokens: int) -> Message:
    body = orjson.loads(payload)
    return Message.model_validate({**body, "seq": seq, "created_at": NOW, "token_estimate": tokens})


@settings(max_examples=600, deadline=None)
@given(message=messages, seq=st.integers(1, 2**40), tokens=st.integers(0, 10**6))
def test_a_stored_payload_decodes_to_what_validation_builds(
    message: Message, seq: int, tokens: int
) -> None:
    payload = orjson.dumps(message.stored_fields()).decode()
    trusted = message_from_payload(
        orjson.loads(payload), seq=seq, created_at=NOW, token_estimate=tokens
    )
    expected = validated(payload, seq, tokens)
    assert trusted == expected
    assert trusted.model_dump() == expected.model_dump()
    assert trusted.stored_fields() == message.stored_fields()
    assert type(trusted.content) is type(expected.content)
    assert trusted.to_openai() == expected.to_openai()
    # Nested models are models, not dicts, and equal field by field.
    for got, want in zip(trusted.tool_calls, expected.tool_calls, strict=True):
        assert isinstance(got, ToolCall)
        assert got == want
    if isinstance(expected.content, tuple):
        assert [type(b) for b in trusted.content] == [type(b) for b in expected.content]  # type: ignore[union-attr]


usages = st.none() | st.builds(
    Usage,
    input_tokens=st.integers(0, 10**6),
    output_tokens=st.integers(0, 10**6),
)
ENVELOPE = {"conversation_id", "seq", "created_at", "token_estimate", "kind"}


@settings(max_examples=300, deadline=None)
@given(
    summary=st.text(min_size=1, max_size=40),
    retained=st.lists(st.text(min_size=1, max_size=10), max_size=3),
    pressure=objects,
    usage=usages,
    optional=st.fixed_dictionaries(
        {},
        optional={
            "model": st.none() | texts,
            "prompt_version": st.none() | texts,
            "tokens_before": st.none() | st.integers(0, 10**6),
            "tokens_after": st.none() | st.integers(0, 10**6),
            # A framework's own compaction: items in place of the summary (estimates below).
            "handoff_items": st.none()
            | st.lists(
                st.builds(lambda text: {"role": "user", "content": text}, texts)
                | st.just({"type": "compaction", "id": "cmp", "encrypted_content": "x"}),
                max_size=3,
            ).map(tuple),
        },
    ),
    dropped=st.sets(
        st.sampled_from(
            [
                "retained",
                "retained_token_estimates",
                "pressure",
                "usage",
                "model",
                "handoff_token_estimates",
            ]
        )
    ),
)
def test_a_stored_boundary_decodes_to_what_validation_builds(
    summary: str,
    retained: list[str],
    pressure: dict[str, Any],
    usage: Usage | None,
    optional: dict[str, Any],
    dropped: set[str],
) -> None:
    """As store/boundaries.py writes it, and as an earlier revision's payload, without the
    fields added since (``dropped``): the trusted construction equals validation."""
    conversation = uuid4()
    event = BoundaryEvent(
        conversation_id=conversation,
        seq=7,
        created_at=NOW,
        token_estimate=42,
        summary=summary,
        covers_through_seq=6,
        retained=tuple(retained),
        retained_token_estimates=tuple(range(len(retained))),
        reason="context_pressure",
        pressure=pressure,
        usage=usage,
        handoff_token_estimates=tuple(range(len(optional.get("handoff_items") or ()))),
        **optional,
    )
    body = event.model_dump(mode="json", exclude=ENVELOPE)
    for name in dropped:
        body.pop(name, None)
    payload = orjson.dumps(body).decode()
    envelope = {"conversation_id": conversation, "seq": 7, "created_at": NOW, "token_estimate": 42}
    expected = BoundaryEvent.model_validate({**orjson.loads(payload), **envelope})
    trusted = boundary_from_payload(orjson.loads(payload), conversation, 7, NOW, 42)
    assert trusted == expected
    assert trusted.model_dump() == expected.model_dump()
    assert type(trusted.retained) is tuple
    assert type(trusted.usage) is type(expected.usage)
    # The handoff and retained messages a load builds of it, as validation builds them.
    if expected.handoff_items is not None:
        assert type(trusted.handoff_items) is tuple
        estimates = expected.handoff_token_estimates
        if len(estimates) != len(expected.handoff_items):  # a payload without them
            estimates = (0,) * len(expected.handoff_items)
        assert boundary_messages(trusted) == [
            Message.from_responses_item(item).model_copy(update={"token_estimate": n})
            for item, n in zip(expected.handoff_items, estimates, strict=True)
        ]
        return
    tokens = expected.retained_token_estimates
    if len(tokens) != len(expected.retained):
        tokens = (0,) * len(expected.retained)
    assert boundary_messages(trusted) == [
        Message.user(summary).as_stored(seq=7, created_at=NOW, token_estimate=42 - sum(tokens)),
        *(
            Message.user(text).model_copy(update={"token_estimate": n})
            for text, n in zip(expected.retained, tokens, strict=True)
        ),
    ]


def test_a_decoded_message_copies_and_updates_like_a_validated_one() -> None:
    payload = orjson.dumps(Message.user("hello", metadata={"a": 1}).stored_fields()).decode()
    trusted = message_from_payload(orjson.loads(payload), seq=3, created_at=NOW, token_estimate=2)
    copied = trusted.model_copy(update={"token_estimate": 9})
    assert copied.token_estimate == 9
    assert trusted.token_estimate == 2  # the original is untouched
    assert trusted.model_fields_set == set(Message.model_fields)
    assert copied.model_fields_set >= {"token_estimate"}
    trusted.metadata["b"] = 2  # each message owns its metadata dict
    other = message_from_payload(orjson.loads(payload), seq=3, created_at=NOW, token_estimate=2)
    assert other.metadata == {"a": 1}


def test_events_and_tails_decode_with_their_usage() -> None:
    conversation = uuid4()
    payload = orjson.dumps(Message.user("hi").stored_fields()).decode()
    usage = orjson.dumps(Usage(input_tokens=7).model_dump()).decode()
    event = decode_event(
        conversation,
        seq=1,
        kind="message",
        created_at=NOW,
        token_estimate=1,
        payload=payload,
        usage=usage,
    )
    assert isinstance(event, MessageEvent)
    assert event == MessageEvent(
        conversation_id=conversation,
        seq=1,
        created_at=NOW,
        token_estimate=1,
        message=validated(payload, 1, 1),
        usage=Usage(input_tokens=7),
    )
    later = datetime(2026, 11, 30, 12, 0, 1, 999_999, tzinfo=UTC)
    rows = [  # EVENT_COLUMNS, created_at in seconds since the epoch
        (1, "message", NOW.timestamp(), 1, payload, usage),
        (2, "run_completed", NOW.timestamp(), 0, '{"abandoned_tool_call_ids": []}', None),
        (3, "message", later.timestamp(), 1, payload, None),
    ]
    light = decode_tail(conversation, rows, last_seq=2, boundary_seq=None, with_events=False)
    full = decode_tail(conversation, rows, last_seq=2, boundary_seq=None, with_events=True)
    again = validated(payload, 3, 1).model_copy(update={"created_at": later})
    assert light.messages == full.messages == [event.message, again]
    assert light.events is None
    assert full.events is not None
    assert [e.kind for e in full.events] == ["message", "run_completed", "message"]
    assert [e.created_at for e in full.events] == [NOW, NOW, later]


#: 2**33 seconds after the epoch: the year 2242, where a double's spacing reaches 2 µs.
EXACT_UNTIL_US = 2**33 * 1_000_000


@given(st.integers(-EXACT_UNTIL_US, EXACT_UNTIL_US - 1))
def test_instants_survive_epoch_seconds_to_the_microsecond(microseconds: int) -> None:
    """load_context reads created_at as a double (seconds since the epoch) and rebuilds the
    datetime: every microsecond up to the year 2242 comes back as it was."""
    value = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=microseconds)
    # microseconds / 1e6 is what PostgreSQL's date_part('epoch', ...) computes.
    assert instant(microseconds / 1_000_000) == value
    assert instant(epoch_seconds(value)) == value
    assert instant(epoch_seconds(value.replace(tzinfo=None))) == value
