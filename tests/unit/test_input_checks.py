"""The input checks that run before any SQL: shared text and number checks, the re-validation
of messages and usage in ``prepare_batch``, ``BoundaryRequest``, ``Message.from_openai`` and
the translation of out-of-range SQLSTATEs. No database; the store-level reproductions are in
``tests/regressions/test_t10_input_validation.py``."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import orjson
import pytest

from episodic.errors import ValidationError
from episodic.models import (
    MAX_TOKEN_COUNT,
    ImageBlock,
    Message,
    NativePayload,
    RawBlock,
    TextBlock,
    ToolCall,
    Usage,
)
from episodic.store.batch import prepare_batch
from episodic.store.boundaries import BoundaryRequest
from episodic.store.checks import check_int, check_text, checked_usage
from episodic.store.codec import encode_json
from episodic.store.db_errors import translated_errors
from episodic.tokens import estimator_from_name

ESTIMATOR = estimator_from_name("chars")


def prepare(messages: Any, **kwargs: Any) -> Any:
    return prepare_batch(
        uuid4(), messages, estimator=ESTIMATOR, max_message_bytes=1 << 20, **kwargs
    )


def constructed(**fields: Any) -> Message:
    """A Message built without validation, as buggy caller code can."""
    return Message.model_construct(**{"role": "user", "content": "x", **fields})


# ---- check_text / check_int ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "non-empty string"),
        (b"k", "non-empty string"),
        ("", "non-empty string"),
        ("k" * 9, "at most 8"),
        ("a\x00b", "NUL"),
        ("ab\ud800", "lone surrogate at index 2"),
    ],
)
def test_check_text_refuses(value: object, words: str) -> None:
    with pytest.raises(ValidationError, match=words) as caught:
        check_text(value, field="owner", max_length=8)
    assert caught.value.field == "owner"


def test_check_text_accepts_text_a_column_can_hold() -> None:
    assert check_text("wörker 🧪", field="owner", max_length=9) == "wörker 🧪"
    assert check_text("", field="model", max_length=9, min_length=0) == ""


@pytest.mark.parametrize("value", [True, 1.0, "1", -1, 11, None])
def test_check_int_refuses(value: object) -> None:
    with pytest.raises(ValidationError, match="integer from 0 to 10"):
        check_int(value, field="n", low=0, high=10)


# ---- usage ------------------------------------------------------------------------------------


def test_usage_counts_are_bounded_by_the_model() -> None:
    assert MAX_TOKEN_COUNT < 2**53
    Usage(input_tokens=MAX_TOKEN_COUNT)
    with pytest.raises(ValueError, match="less than or equal"):
        Usage(output_tokens=MAX_TOKEN_COUNT + 1)


@pytest.mark.parametrize(
    "usage",
    [
        Usage.model_construct(input_tokens=2**63),
        Usage.model_construct(input_tokens=-1),
        Usage.model_construct(input_tokens="5"),
        {"input_tokens": 1},
    ],
)
def test_checked_usage_refuses_what_skipped_validation(usage: object) -> None:
    with pytest.raises(ValidationError) as caught:
        checked_usage(usage)
    assert caught.value.field == "usage"


def test_prepare_batch_stores_the_validated_usage() -> None:
    batch = prepare([Message.user("x")], usage=Usage(input_tokens=3))
    assert batch.usage == Usage(input_tokens=3)
    assert batch.usage_input_tokens == 3


# ---- messages in prepare_batch --------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        constructed(role="wizard"),
        constructed(content=5),
        constructed(content=None),
        constructed(tool_calls=(ToolCall(id="c", name="t"),)),
        constructed(role="tool", content="r"),  # no tool_call_id
        constructed(role="tool", content="r", tool_call_id="c", is_error="yes"),
        constructed(role="system", content=(TextBlock(text="x"),)),
        constructed(
            role="assistant",
            tool_calls=(ToolCall.model_construct(id=5, name="t", args={}, arguments_json=None),),
        ),
        constructed(metadata={"a": {1, 2}}),
        Message.user("x").model_copy(update={"role": "wizard"}),
    ],
    ids=[
        "unknown-role",
        "content-int",
        "user-without-content",
        "user-with-calls",
        "tool-without-id",
        "is_error-str",
        "system-blocks",
        "call-id-int",
        "metadata-set",
        "model_copy-update",
    ],
)
def test_prepare_batch_refuses_a_message_that_skipped_validation(message: Message) -> None:
    with pytest.raises(ValidationError, match="not a valid message") as caught:
        prepare([Message.user("ok"), message])
    assert caught.value.field == "messages[1]"


def test_prepare_batch_keeps_a_valid_message_built_without_validation() -> None:
    batch = prepare([constructed(tool_calls=None)])
    assert batch.messages == (Message.user("x"),)
    assert batch.payloads == ['{"role":"user","content":"x"}']


@pytest.mark.parametrize(
    "metadata", [{"k\ud800": 1}, {"a": {"k\udfff": 1}}, {"a": [{"\ud83d": None}]}]
)
def test_prepare_batch_refuses_a_surrogate_in_a_metadata_key(metadata: dict[str, Any]) -> None:
    # JSON mode would have stored U+FFFD in its place
    with pytest.raises(ValidationError, match="surrogates"):
        prepare([Message.user("x", metadata=metadata)])


def test_prepare_batch_refuses_a_surrogate_idempotency_key() -> None:
    with pytest.raises(ValidationError, match="lone surrogate") as caught:
        prepare([Message.user("x")], idempotency_key="k\udfff")
    assert caught.value.field == "idempotency_key"


VALID = [
    Message.user("hi"),
    Message.user(()),
    Message.user(
        (TextBlock(text="t"), ImageBlock(url="u", alt="a"), RawBlock(data={"type": "audio"}))
    ),
    Message.assistant(
        "a",
        tool_calls=[ToolCall(id="c", name="n", args={"q": [1, None]}, arguments_json="{bad")],
        reasoning="r",
        native=NativePayload(protocol="p", data={"k": 1.5}),
    ),
    Message.tool_result("c", "r", name="n", is_error=True, client_id="id"),
    Message.system("s", metadata={"nested": {"list": [True, None]}}),
]


@pytest.mark.parametrize("message", VALID)
def test_the_payload_is_the_json_of_stored_fields(message: Message) -> None:
    # Unchanged bytes: request hashes of batches stored before the re-validation still match.
    [payload] = prepare([message]).payloads
    assert payload == orjson.dumps(message.stored_fields()).decode()
    assert Message.model_validate(orjson.loads(payload)) == message


def test_stored_fields_keep_empty_content() -> None:
    assert Message.user(()).stored_fields() == {"role": "user", "content": []}
    assert Message.model_validate(Message.user(()).stored_fields()) == Message.user(())


def test_python_stored_fields_keep_keys_exactly() -> None:
    message = Message.user("x", metadata={"k\ud800": 1})
    assert message.stored_fields(mode="python")["metadata"] == {"k\ud800": 1}


def test_a_system_message_is_estimated_at_zero_tokens() -> None:
    # kept in the log, never loaded: it adds nothing to any context's estimate
    batch = prepare([Message.system("You are careful. " * 50), Message.user("hi")])
    assert batch.token_estimates[0] == 0
    assert batch.token_estimates[1] > 0
    assert batch.token_sum == batch.token_estimates[1]


# ---- NaN and infinity ---------------------------------------------------------------------------

NAN = float("nan")
INF = float("inf")

#: (message fields with a non-finite float, the path prepare_batch names, what it is)
NON_FINITE: list[Any] = [
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": (ToolCall.model_construct(id="c1", name="f", args={"x": NAN}),),
        },
        "messages[1].tool_calls[0].args.x",
        "NaN",
        id="args",
    ),
    pytest.param(
        {"metadata": {"score": [1.5, {"deep": -INF}]}},
        "messages[1].metadata.score[1].deep",
        "infinite",
        id="metadata",
    ),
    pytest.param(
        {"native": NativePayload.model_construct(protocol="p", data={"logprob": -INF})},
        "messages[1].native.data.logprob",
        "infinite",
        id="native-data",
    ),
    pytest.param(
        {"content": (RawBlock.model_construct(type="raw", data={"type": "audio", "t": NAN}),)},
        "messages[1].content[0].data.t",
        "NaN",
        id="raw-block",
    ),
    pytest.param(
        {"metadata": {"odd key": INF}},
        "messages[1].metadata['odd key']",
        "infinite",
        id="metadata-odd-key",
    ),
]


@pytest.mark.parametrize(("fields", "path", "what"), NON_FINITE)
def test_prepare_batch_refuses_nan_and_infinity(
    fields: dict[str, Any], path: str, what: str
) -> None:
    # Built without validation, which would have refused them: orjson would store null.
    with pytest.raises(ValidationError) as caught:
        prepare([Message.user("ok"), constructed(**fields)])
    assert str(caught.value).startswith(f"{path} is {what}; JSON has no NaN or infinity")
    assert caught.value.field == path


@pytest.mark.parametrize(
    ("build", "path"),
    [
        pytest.param(
            lambda: ToolCall(id="c1", name="f", args={"x": NAN}), "args.x", id="tool-call-args"
        ),
        pytest.param(
            lambda: Message.assistant(
                None, tool_calls=[{"id": "c", "name": "f", "args": {"x": NAN}}]
            ),
            "tool_calls[0].args.x",
            id="message-args",
        ),
        pytest.param(
            lambda: Message.user("x", metadata={"a": [1, {"list": INF}]}),
            "metadata.a[1].list",
            id="metadata",
        ),
        pytest.param(
            lambda: NativePayload(protocol="p", data={"v": [[-INF]]}), "data.v[0][0]", id="native"
        ),
        pytest.param(lambda: RawBlock(data={"type": "x", "v": NAN}), "data.v", id="raw-block"),
        pytest.param(
            lambda: Message.model_validate(
                {"role": "user", "content": "x", "metadata": {"f": NAN}}
            ),
            "metadata.f",
            id="model_validate",
        ),
    ],
)
def test_models_refuse_nan_and_infinity(build: Any, path: str) -> None:
    with pytest.raises(ValidationError, match="JSON has no NaN or infinity") as caught:
        build()
    assert f"{path} is " in str(caught.value)
    assert [p["type"] for p in caught.value.errors()] == ["finite_number"]


def test_from_openai_refuses_nan_from_a_dict() -> None:
    # JSON text cannot carry NaN, but a dict built in Python can
    with pytest.raises(ValidationError, match=r"tool_calls\[0\]\.args\.x is NaN"):
        Message.from_openai(
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"x": NAN}}}],
            }
        )


def test_finite_floats_and_nulls_are_stored_as_given() -> None:
    message = Message.user("null", metadata={"f": 1.5, "big": 1e308, "n": None, "null": [None]})
    [payload] = prepare([message]).payloads
    assert orjson.loads(payload)["metadata"] == {
        "f": 1.5,
        "big": 1e308,
        "n": None,
        "null": [None],
    }


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": NAN}, "metadata.a"),
        ({"a": {"b": [0, INF]}}, "metadata.a.b[1]"),
        ({"a": (1, (NAN,))}, "metadata.a[1][0]"),
        ({"1x": -INF}, "metadata['1x']"),
    ],
)
def test_encode_json_refuses_nan_and_infinity(value: Any, path: str) -> None:
    with pytest.raises(ValidationError, match="JSON has no NaN or infinity") as caught:
        encode_json(value, what="metadata")
    assert str(caught.value).startswith(f"{path} is ")
    assert caught.value.field == path


def test_encode_json_keeps_null_and_the_word() -> None:
    assert encode_json({"a": None, "b": "null", "c": [1.5]}, what="x") == (
        '{"a":null,"b":"null","c":[1.5]}'
    )


# ---- BoundaryRequest ---------------------------------------------------------------------------


def request(**overrides: Any) -> BoundaryRequest:
    kwargs: dict[str, Any] = {
        "summary": "s",
        "covers_through_seq": 1,
        "retained": ["kept"],
        "reason": "manual_recovery",
        "retention": "recent_user_messages",
        "expected_boundary_seq": None,
        "lease_token": None,
        "usage": None,
        "model": None,
        "prompt_version": None,
        "tokens_before": None,
        "pressure": None,
        **overrides,
    }
    made = BoundaryRequest(**kwargs)
    made.check_size(100)  # the store's max_message_bytes
    return made


def test_boundary_request_converts_what_it_checked() -> None:
    made = request(usage=Usage(input_tokens=2), model="", tokens_before=MAX_TOKEN_COUNT)
    assert made.retained == ("kept",)
    assert made.usage == Usage(input_tokens=2)
    assert made.pressure is None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"summary": "s" * 99}, "summary"),  # 101 bytes encoded, quotes included
        ({"summary": "é" * 50}, "summary"),
        ({"covers_through_seq": 2**63}, "covers_through_seq"),
        ({"expected_boundary_seq": -1}, "expected_boundary_seq"),
        ({"retained": "text"}, "retained"),
        ({"retained": [1]}, "retained"),
        ({"reason": 5}, "reason"),
        ({"reason": ""}, "reason"),
        ({"lease_token": str(uuid4())}, "lease_token"),
        ({"model": 5}, "model"),
        ({"prompt_version": "v\ud800"}, "prompt_version"),
        ({"tokens_before": -1}, "tokens_before"),
        ({"tokens_before": MAX_TOKEN_COUNT + 1}, "tokens_before"),
        ({"usage": Usage.model_construct(input_tokens=-1)}, "usage"),
        ({"pressure": {"estimated_context_tokens": 1}}, "pressure"),
    ],
)
def test_boundary_request_refuses(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**overrides)
    assert caught.value.field == field


# ---- Message.from_openai ---------------------------------------------------------------------


def deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize(
    "data",
    [
        None,
        "user",
        [("role", "user")],
        {"role": "assistant", "content": None, "tool_calls": 1.5},
        {"role": "assistant", "content": None, "tool_calls": {"id": "a"}},
        {"role": "user", "content": [{"type": "x", "v": deep(1_000)}]},
        {"role": "user", "content": "x", "extra": deep(1_000)},
    ],
    ids=["none", "str", "pairs", "calls-float", "calls-dict", "deep-block", "deep-native"],
)
def test_from_openai_refuses_with_validation_error(data: Any) -> None:
    with pytest.raises(ValidationError):
        Message.from_openai(data)


def test_from_openai_keeps_the_field_of_its_own_refusals() -> None:
    with pytest.raises(ValidationError) as caught:
        Message.from_openai({"role": "wizard"})
    assert caught.value.field == "role"
    with pytest.raises(ValidationError) as caught:
        Message.from_openai({"role": "assistant", "tool_calls": "abc"})
    assert caught.value.field == "tool_calls"


def test_from_openai_reads_no_calls_as_none() -> None:
    message = Message.from_openai({"role": "assistant", "content": "a", "tool_calls": None})
    assert message.tool_calls == ()


# ---- translation --------------------------------------------------------------------------------


class _DriverError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"driver failure {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize("sqlstate", ["22003", "22008"])
def test_out_of_range_sqlstates_are_validation_errors(sqlstate: str) -> None:
    with pytest.raises(ValidationError, match="cannot store"), translated_errors():
        raise _DriverError(sqlstate)
