"""episodic.models: constructors, shape rules, views, and the OpenAI chat-completions mapping."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import orjson
import pydantic
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from episodic import messages_from_openai
from episodic.compaction import CompactionConfig
from episodic.context import Context
from episodic.errors import ValidationError
from episodic.models import (
    DEVELOPER_ROLE,
    OPENAI_CHAT_PROTOCOL,
    BoundaryEvent,
    Conversation,
    ImageBlock,
    Message,
    MessageEvent,
    NativePayload,
    RawBlock,
    RunCompletedEvent,
    TextBlock,
    ToolCall,
    Usage,
)
from episodic.policy import EpisodicCompactionConfig

T0 = datetime(2024, 1, 1, tzinfo=UTC)
RUN = ToolCall(id="c1", name="run", args={"cmd": "pytest"})
READ = ToolCall(id="c2", name="read", args={"path": "a.py"})

# ---- constructors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(
            Message.user("Fix the failing test"),
            {"role": "user", "content": "Fix the failing test", "tool_calls": ()},
            id="user",
        ),
        pytest.param(
            Message.user((TextBlock(text="look"), ImageBlock(url="https://x/y.png"))),
            {
                "role": "user",
                "content": (TextBlock(text="look"), ImageBlock(url="https://x/y.png")),
            },
            id="user-blocks",
        ),
        pytest.param(
            Message.assistant("Running the tests."),
            {"role": "assistant", "content": "Running the tests.", "tool_calls": ()},
            id="assistant-text",
        ),
        pytest.param(
            Message.assistant(None, tool_calls=iter([RUN, READ])),
            {"role": "assistant", "content": None, "tool_calls": (RUN, READ)},
            id="assistant-calls-from-iterator",
        ),
        pytest.param(
            Message.assistant(reasoning="think first", client_id="m-1"),
            {"role": "assistant", "content": None, "reasoning": "think first", "client_id": "m-1"},
            id="assistant-empty-with-fields",
        ),
        pytest.param(
            Message.tool_result("c1", "1 failed", name="run", is_error=True),
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": "1 failed",
                "name": "run",
                "is_error": True,
            },
            id="tool-result-error",
        ),
        pytest.param(
            Message.tool_result("c1", ""),
            {"role": "tool", "tool_call_id": "c1", "content": "", "name": None, "is_error": False},
            id="tool-result-empty",
        ),
        pytest.param(
            Message.system("Be brief.", metadata={"source": "config"}),
            {"role": "system", "content": "Be brief.", "metadata": {"source": "config"}},
            id="system",
        ),
    ],
)
def test_constructors_set_role_and_fields(message: Message, expected: dict[str, Any]) -> None:
    for field, value in expected.items():
        assert getattr(message, field) == value, field
    assert message.seq is None
    assert message.created_at is None
    assert message.token_estimate is None


# ---- shape validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        pytest.param({"role": "tool", "content": "out"}, "tool_call_id", id="tool-without-call-id"),
        pytest.param(
            {"role": "tool", "tool_call_id": "c1"}, "needs content", id="tool-without-content"
        ),
        pytest.param(
            {"role": "user", "content": "hi", "tool_calls": (RUN,)},
            "only assistant messages carry tool_calls",
            id="tool-calls-on-user",
        ),
        pytest.param(
            {"role": "tool", "tool_call_id": "c1", "content": "x", "tool_calls": (RUN,)},
            "only assistant messages carry tool_calls",
            id="tool-calls-on-tool",
        ),
        pytest.param(
            {"role": "system", "content": (TextBlock(text="Be brief."),)},
            "must be a string",
            id="system-with-blocks",
        ),
        pytest.param({"role": "system"}, "needs content", id="system-without-content"),
        pytest.param({"role": "user"}, "needs content", id="user-without-content"),
        pytest.param(
            {"role": "user", "content": "hi", "is_error": True},
            "only tool results can be marked is_error",
            id="is-error-on-user",
        ),
        pytest.param(
            {"role": "assistant", "content": "hi", "is_error": True},
            "only tool results can be marked is_error",
            id="is-error-on-assistant",
        ),
        pytest.param(
            {"role": "user", "content": "hi", "tool_call_id": "c1"},
            "only tool results carry tool_call_id",
            id="call-id-on-user",
        ),
        pytest.param(
            {"role": "assistant", "tool_calls": (RUN, RUN.model_copy(update={"name": "other"}))},
            "must be unique",
            id="duplicate-call-ids",
        ),
        pytest.param({"role": "bot", "content": "hi"}, "role", id="unknown-role"),
        pytest.param({"role": "user", "content": "hi", "colour": "red"}, "colour", id="extra-key"),
        pytest.param(
            {"role": "tool", "tool_call_id": "", "content": "x"},
            "at least 1",
            id="empty-tool-call-id",
        ),
        pytest.param(
            {"role": "user", "content": "hi", "client_id": ""}, "at least 1", id="empty-client-id"
        ),
        pytest.param(
            {"role": "user", "content": ({"type": "video", "url": "u"},)},
            "video",
            id="unknown-block-type",
        ),
    ],
)
def test_invalid_shapes_are_refused(fields: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint) as caught:
        Message(**fields)
    assert not isinstance(caught.value, pydantic.ValidationError)
    assert caught.value.errors(), "pydantic's details are kept"


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: Message.tool_result("", "x"), id="tool-result-empty-id"),
        pytest.param(lambda: Message.assistant(None, tool_calls=[RUN, RUN]), id="dup-calls"),
        pytest.param(lambda: Message.system("x", tool_call_id="c1"), id="system-call-id"),
        pytest.param(lambda: ToolCall(id="", name="run"), id="call-empty-id"),
        pytest.param(lambda: ToolCall(id="c1", name=""), id="call-empty-name"),
        pytest.param(lambda: ToolCall(id="c" * 513, name="run"), id="call-id-too-long"),
        pytest.param(lambda: ToolCall(id="c1", name="f", args={"x": object()}), id="not-json"),
    ],
)
def test_constructors_validate(build: Any) -> None:
    with pytest.raises(ValidationError):
        build()


# ---- one ValidationError ------------------------------------------------------------------

_EVENT = {"conversation_id": uuid4(), "seq": 1, "created_at": T0, "token_estimate": 1}
_HEAD: dict[str, Any] = {
    "conversation_id": uuid4(),
    "tenant_id": "t",
    "created_at": T0,
    "metadata": {},
    "last_seq": 0,
    "boundary_seq": None,
    "covers_through_seq": 0,
    "total_user_messages": 0,
    "user_messages_since_boundary": 0,
    "run_completed_since_boundary": 0,
    "user_messages_since_run_completed": 0,
    "context_tokens": 0,
    "usage_input_tokens": None,
    "tokens_since_usage": 0,
    "open_tool_calls": {},
}

REFUSED: list[Any] = [
    pytest.param(lambda: Message.user(None), "Message", id="user-none"),
    pytest.param(lambda: Message.user(1), "Message", id="user-int"),
    pytest.param(lambda: Message(role="bogus", content="x"), "Message", id="bogus-role"),
    pytest.param(lambda: Message.assistant(tool_calls=[1]), "Message", id="assistant-call-int"),
    pytest.param(lambda: Message.tool_result("", "x"), "Message", id="tool-result-empty-id"),
    pytest.param(lambda: Message.system(5), "Message", id="system-int"),
    pytest.param(lambda: ToolCall(id="", name="run"), "ToolCall", id="tool-call"),
    pytest.param(lambda: Usage(input_tokens=-1), "Usage", id="usage"),
    pytest.param(lambda: TextBlock(text=1), "TextBlock", id="text-block"),
    pytest.param(lambda: ImageBlock(url=None), "ImageBlock", id="image-block"),
    pytest.param(lambda: RawBlock(data=5), "RawBlock", id="raw-block"),
    pytest.param(lambda: NativePayload(protocol="", data={}), "NativePayload", id="native"),
    pytest.param(lambda: MessageEvent(**_EVENT, message=5), "MessageEvent", id="message-event"),
    pytest.param(
        lambda: RunCompletedEvent(**_EVENT, abandoned_tool_call_ids=5),
        "RunCompletedEvent",
        id="run-completed-event",
    ),
    pytest.param(lambda: BoundaryEvent(**_EVENT, summary="s"), "BoundaryEvent", id="boundary"),
    pytest.param(lambda: Conversation(**{**_HEAD, "last_seq": "x"}), "Conversation", id="head"),
    pytest.param(
        lambda: EpisodicCompactionConfig(trigger_unfinished_turns=-1),
        "EpisodicCompactionConfig",
        id="episodic-compaction-config",
    ),
    pytest.param(
        lambda: CompactionConfig(recent_user_token_budget=-1), "CompactionConfig", id="config"
    ),
    pytest.param(
        lambda: Context(
            conversation_id=uuid4(), messages=(), boundary=None, estimated_tokens="x", last_seq=0
        ),
        "Context",
        id="context",
    ),
    pytest.param(lambda: Message.model_validate({"role": "x"}), "Message", id="model_validate"),
    pytest.param(lambda: Message.model_validate(5), "Message", id="model_validate-not-a-dict"),
    pytest.param(
        lambda: Usage.model_validate_json('{"input_tokens": -1}'), "Usage", id="validate_json"
    ),
    pytest.param(lambda: Usage.model_validate_json("{"), "Usage", id="validate_json-broken"),
    pytest.param(
        lambda: Usage.model_validate_strings({"input_tokens": "x"}), "Usage", id="strings"
    ),
]


@pytest.mark.parametrize(("build", "model"), REFUSED)
def test_every_model_refuses_with_episodic_validation_error(build: Any, model: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build()
    error = caught.value
    assert type(error) is ValidationError
    assert not isinstance(error, pydantic.ValidationError)
    assert isinstance(error, ValueError)
    text = str(error)
    assert re.fullmatch(rf"invalid {model}: .+ \(\d+ problems?\)", text), text
    assert "\n" not in text
    problems = error.errors()
    assert problems
    assert all({"type", "loc", "msg"} <= set(p) for p in problems)
    assert text.endswith(f"({len(problems)} problem{'s' if len(problems) > 1 else ''})")
    assert error.__suppress_context__, "no pydantic traceback chained to the caller's"


def test_refusal_details_are_pydantics() -> None:
    data = {"role": "tool", "content": 5, "colour": "red"}
    with pytest.raises(pydantic.ValidationError) as original:
        Message.__pydantic_validator__.validate_python(data)
    with pytest.raises(ValidationError) as caught:
        Message(**data)
    assert caught.value.errors() == original.value.errors(include_url=False)
    assert caught.value.field is None  # two fields are wrong
    # a caller may keep the details: they are plain dicts, copied on each call
    caught.value.errors().clear()
    assert caught.value.errors()


def test_refusal_message_names_the_path_and_counts_the_problems() -> None:
    with pytest.raises(ValidationError) as caught:
        Message(role="bogus", content="x")
    assert str(caught.value) == (
        "invalid Message: role: Input should be 'user', 'assistant', 'tool' or 'system' (1 problem)"
    )
    assert caught.value.field == "role"

    with pytest.raises(ValidationError) as caught:
        Message.assistant(tool_calls=[{"id": "", "name": "run"}])
    assert str(caught.value) == (
        "invalid Message: tool_calls[0].id: String should have at least 1 character (1 problem)"
    )
    assert caught.value.field == "tool_calls"

    # a model validator's own words, without pydantic's "Value error, " prefix
    with pytest.raises(ValidationError) as caught:
        Message.user(None)
    assert str(caught.value) == "invalid Message: a user message needs content (1 problem)"

    # at most three problems spelled out; errors() has them all
    with pytest.raises(ValidationError) as caught:
        Usage(input_tokens=-1, output_tokens=-1, cache_read_tokens=-1, reasoning_tokens=-1, x=1)
    assert str(caught.value).endswith("; and 2 more (5 problems)")
    assert len(caught.value.errors()) == 5


def test_strict_validation_stays_strict() -> None:
    # The base's __init__ is not a custom init to pydantic: validation does not go through it
    # (it would, and lose strict=True, without the flag that says so).
    data = {"role": "tool", "tool_call_id": "c1", "content": "x", "is_error": "yes"}
    assert Message.model_validate(data).is_error is True
    with pytest.raises(ValidationError, match="is_error: Input should be a valid boolean"):
        Message.model_validate(data, strict=True)
    with pytest.raises(ValidationError, match="tool_calls: Input should be a valid tuple"):
        Message.model_validate({"role": "assistant", "tool_calls": [RUN]}, strict=True)


def test_from_openai_refusals_name_the_whole_path() -> None:
    with pytest.raises(ValidationError) as caught:
        Message.from_openai(
            {"role": "assistant", "tool_calls": [{"id": "", "function": {"name": "f"}}]}
        )
    assert str(caught.value) == (
        "not a valid chat-completions message: invalid Message: tool_calls[0].id: "
        "String should have at least 1 character (1 problem)"
    )
    assert caught.value.field == "tool_calls"
    assert [p["loc"] for p in caught.value.errors()] == [("tool_calls", 0, "id")]


def test_validation_errors_are_value_errors() -> None:
    # Callers catching ValueError (as the agent core does) see shape errors too.
    with pytest.raises(ValueError, match="tool_call_id"):
        Message(role="tool", content="x")


def test_assistant_may_be_empty() -> None:
    # Some providers return an assistant turn with neither text nor calls; it is storable.
    message = Message(role="assistant")
    assert message.content is None
    assert message.text == ""


# ---- frozen -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance", "field", "value"),
    [
        pytest.param(Message.user("hi"), "content", "changed", id="message-content"),
        pytest.param(Message.user("hi"), "seq", 3, id="message-seq"),
        pytest.param(RUN, "args", {}, id="tool-call"),
        pytest.param(TextBlock(text="a"), "text", "b", id="text-block"),
        pytest.param(ImageBlock(url="u"), "alt", "a cat", id="image-block"),
        pytest.param(NativePayload(protocol="p", data={}), "protocol", "q", id="native"),
    ],
)
def test_models_are_frozen(instance: pydantic.BaseModel, field: str, value: Any) -> None:
    before = instance.model_dump()
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        setattr(instance, field, value)
    assert instance.model_dump() == before


# ---- text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "text"),
    [
        pytest.param(Message.user("plain"), "plain", id="str"),
        pytest.param(Message.user(""), "", id="empty-str"),
        pytest.param(Message.assistant(None, tool_calls=[RUN]), "", id="none"),
        pytest.param(
            Message.user((TextBlock(text="one"), TextBlock(text="two"))), "one\ntwo", id="blocks"
        ),
        pytest.param(
            Message.user((ImageBlock(url="https://x/c.png", alt="a cat on a mat"),)),
            "a cat on a mat",
            id="image-alt",
        ),
        pytest.param(
            Message.user((ImageBlock(url="data:image/png;base64,AA"),)),
            "[image]",
            id="image-no-alt",
        ),
        pytest.param(Message.user((ImageBlock(url="u", alt=""),)), "[image]", id="image-empty-alt"),
        pytest.param(
            Message.user((RawBlock(data={"type": "input_audio", "input_audio": {}}),)),
            "[input_audio]",
            id="raw",
        ),
        pytest.param(Message.user((RawBlock(data={"blob": 1}),)), "[attachment]", id="raw-untyped"),
        pytest.param(
            Message.tool_result(
                "c1",
                (
                    TextBlock(text="see"),
                    ImageBlock(url="u", alt="chart"),
                    RawBlock(data={"type": "file"}),
                ),
            ),
            "see\nchart\n[file]",
            id="mixed",
        ),
    ],
)
def test_text(message: Message, text: str) -> None:
    assert message.text == text


# ---- stored fields ------------------------------------------------------------------------

STORED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("message", "stored"),
    [
        pytest.param(Message.user("hi"), {"role": "user", "content": "hi"}, id="user"),
        pytest.param(
            Message.assistant(None, tool_calls=[RUN]),
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "name": "run", "args": {"cmd": "pytest"}}],
            },
            id="assistant-call",
        ),
        pytest.param(
            Message.assistant(
                None,
                tool_calls=[ToolCall(id="c1", name="run", arguments_json="{bad")],
                reasoning="because",
            ),
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "name": "run", "args": {}, "arguments_json": "{bad"}],
                "reasoning": "because",
            },
            id="assistant-raw-arguments",
        ),
        pytest.param(
            Message.tool_result("c1", "boom", name="run", is_error=True),
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": "boom",
                "name": "run",
                "is_error": True,
            },
            id="tool-error",
        ),
        pytest.param(
            Message.user("hi", client_id="u-1", metadata={"lang": "en"}),
            {"role": "user", "content": "hi", "client_id": "u-1", "metadata": {"lang": "en"}},
            id="client-id-metadata",
        ),
        pytest.param(
            Message.system("Be brief.", native=NativePayload(protocol="x", data={"k": [1]})),
            {
                "role": "system",
                "content": "Be brief.",
                "native": {"protocol": "x", "data": {"k": [1]}},
            },
            id="native",
        ),
    ],
)
def test_stored_fields(message: Message, stored: dict[str, Any]) -> None:
    assert message.stored_fields() == stored
    loaded = message.as_stored(seq=7, created_at=STORED, token_estimate=12)
    assert (loaded.seq, loaded.created_at, loaded.token_estimate) == (7, STORED, 12)
    # What the store sets never goes into the payload...
    assert loaded.stored_fields() == stored
    # ...the payload is plain JSON...
    assert orjson.loads(orjson.dumps(stored)) == stored
    # ...and it reads back as the same message.
    assert Message.model_validate(stored) == message


# ---- OpenAI chat-completions --------------------------------------------------------------

LOSSLESS: list[Any] = [
    pytest.param({"role": "user", "content": "Fix the failing test"}, id="user-str"),
    pytest.param({"role": "user", "content": "hi", "name": "alice"}, id="user-named"),
    pytest.param({"role": "user", "content": "日本語 — ünïcödé 🎉\x00"}, id="user-unicode"),
    pytest.param(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://example.com/cat.png", "detail": "high"},
                },
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        id="user-text-and-images",
    ),
    pytest.param(
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {"type": "text", "text": "cached", "cache_control": {"type": "ephemeral"}},
                {"type": "image_url", "image_url": {"url": "u", "detail": "low", "x": 1}},
            ],
        },
        id="user-unmodelled-blocks",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"cmd":"pytest -x"}'},
                },
                {
                    "id": "call_def",
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": '{"path":"a.py","lines":[1,20]}',
                    },
                },
            ],
        },
        id="assistant-two-calls",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"cmd": "ls", "all": true'},
                }
            ],
        },
        id="assistant-invalid-json-arguments",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{\n  "cmd": "ls",  "n" : 1\n}'},
                }
            ],
        },
        id="assistant-non-canonical-whitespace",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
                {"id": "c", "type": "function", "function": {"name": "h", "arguments": "{}"}},
                {
                    "id": "d",
                    "type": "function",
                    "function": {"name": "i", "arguments": '{"city":"M\\u00fcnchen"}'},
                },
            ],
        },
        id="assistant-odd-arguments",
    ),
    pytest.param({"role": "tool", "tool_call_id": "call_abc", "content": "1 failed"}, id="tool"),
    pytest.param(
        {
            "role": "tool",
            "tool_call_id": "call_abc",
            "content": [{"type": "text", "text": "ok"}],
        },
        id="tool-blocks",
    ),
    pytest.param({"role": "system", "content": "You are a careful engineer."}, id="system"),
    pytest.param({"role": "developer", "content": "Be terse."}, id="developer"),
    pytest.param({"role": "assistant", "content": ""}, id="assistant-empty-string"),
    pytest.param(
        {"role": "assistant", "content": "Done.", "refusal": None, "annotations": []},
        id="assistant-unknown-keys",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": "Sure.",
            "audio": {"id": "audio_1", "expires_at": 1700000000, "transcript": "Sure."},
            "function_call": None,
        },
        id="assistant-audio",
    ),
    pytest.param(
        {"role": "assistant", "content": "42", "reasoning_content": "6 times 7 is 42."},
        id="assistant-reasoning-content",
    ),
    pytest.param(
        {"role": "assistant", "content": "42", "reasoning_content": [{"type": "opaque"}]},
        id="assistant-non-string-reasoning",
    ),
]


@pytest.mark.parametrize("data", LOSSLESS)
def test_openai_round_trip_is_lossless(data: dict[str, Any]) -> None:
    original = copy.deepcopy(data)
    message = Message.from_openai(data)
    assert data == original, "from_openai must not mutate its input"
    assert message.to_openai(include_reasoning=True) == data
    # The stored form carries everything too.
    assert Message.model_validate(message.model_dump()) == message


@pytest.mark.parametrize(
    ("data", "check"),
    [
        pytest.param(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"cmd":"pytest"}'},
                    }
                ],
            },
            {"args": {"cmd": "pytest"}, "arguments_json": None},
            id="canonical-json-parsed",
        ),
        pytest.param(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"cmd": "pytest"}'},
                    }
                ],
            },
            {"args": {"cmd": "pytest"}, "arguments_json": '{"cmd": "pytest"}'},
            id="whitespace-parsed-and-kept",
        ),
        pytest.param(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"cmd": "py'},
                    }
                ],
            },
            {"args": {}, "arguments_json": '{"cmd": "py'},
            id="invalid-json-kept-verbatim",
        ),
    ],
)
def test_openai_arguments_are_parsed(data: dict[str, Any], check: dict[str, Any]) -> None:
    (call,) = Message.from_openai(data).tool_calls
    assert call.args == check["args"]
    assert call.arguments_json == check["arguments_json"]


def test_openai_fields_map_onto_the_model() -> None:
    message = Message.from_openai(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "", "format": "mp3"}},
            ],
            "refusal": None,
        }
    )
    assert message.content == (
        TextBlock(text="look"),
        ImageBlock(url="https://x/y.png", detail="low"),
        RawBlock(data={"type": "input_audio", "input_audio": {"data": "", "format": "mp3"}}),
    )
    assert message.native == NativePayload(protocol=OPENAI_CHAT_PROTOCOL, data={"refusal": None})

    thinking = Message.from_openai({"role": "assistant", "content": "x", "reasoning_content": "r"})
    assert thinking.reasoning == "r"
    assert thinking.native is None


# Conversions that are intentionally not the identity: each row is (input, what to_openai gives).
NOT_IDENTITY: list[Any] = [
    # reasoning_content is only sent back on request (OpenAI refuses it).
    pytest.param(
        {"role": "assistant", "content": "42", "reasoning_content": "6*7"},
        {"role": "assistant", "content": "42"},
        id="reasoning-omitted-by-default",
    ),
    # Normalizations: content is always present, "type" is always "function", an empty
    # tool_calls list is not sent.
    pytest.param({"role": "assistant"}, {"role": "assistant", "content": None}, id="no-content"),
    pytest.param(
        {"role": "assistant", "content": "ok", "tool_calls": []},
        {"role": "assistant", "content": "ok"},
        id="empty-tool-calls",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        id="call-type-added",
    ),
]


@pytest.mark.parametrize(("data", "expected"), NOT_IDENTITY)
def test_openai_normalizations(data: dict[str, Any], expected: dict[str, Any]) -> None:
    assert Message.from_openai(data).to_openai() == expected


def test_developer_role_is_system_and_kept() -> None:
    # chat-completions' "developer" role is the newer name for "system"; episodic has one
    # role, and keeps the word in native so to_openai gives it back.
    data = {"role": "developer", "content": "Be terse."}
    message = Message.from_openai(data)
    assert message.role == "system"
    assert message.content == "Be terse."
    assert message.native == NativePayload(
        protocol=OPENAI_CHAT_PROTOCOL, data={"role": DEVELOPER_ROLE}
    )
    assert message.to_openai() == data
    # and through the stored form
    stored = Message.model_validate(orjson.loads(orjson.dumps(message.stored_fields())))
    assert stored.to_openai() == data
    assert Message.from_openai(Message.system("Be terse.").to_openai()).to_openai() == {
        "role": "system",
        "content": "Be terse.",
    }


def test_only_a_system_message_is_given_back_as_developer() -> None:
    # native cannot turn another role into "developer", nor override the role at all
    native = NativePayload(protocol=OPENAI_CHAT_PROTOCOL, data={"role": DEVELOPER_ROLE})
    assert Message.user("hi", native=native).to_openai()["role"] == "user"
    other = NativePayload(protocol=OPENAI_CHAT_PROTOCOL, data={"role": "user"})
    assert Message.system("s", native=other).to_openai()["role"] == "system"
    foreign = NativePayload(protocol="anthropic", data={"role": DEVELOPER_ROLE})
    assert Message.system("s", native=foreign).to_openai()["role"] == "system"


def test_messages_from_openai_names_tool_results_after_their_calls() -> None:
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix tests."},
        {"role": "user", "content": "Fix it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "source"},
        {"role": "tool", "tool_call_id": "c1", "content": "1 failed"},
        {"role": "tool", "tool_call_id": "c9", "content": "who called me?"},
    ]
    messages = messages_from_openai(items)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert [(m.tool_call_id, m.name) for m in messages[3:]] == [
        ("c2", "read"),
        ("c1", "run"),
        ("c9", None),
    ]
    # Names are episodic's own; chat-completions tool messages do not carry them back.
    assert [m.to_openai() for m in messages] == items


def test_messages_from_openai_only_names_after_the_call_is_seen() -> None:
    result = {"role": "tool", "tool_call_id": "c1", "content": "early"}
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        ],
    }
    early, _ = messages_from_openai([result, call])
    assert early.name is None
    assert messages_from_openai([call, result])[1].name == "run"


def test_from_openai_tool_name_argument() -> None:
    message = Message.from_openai(
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}, tool_name="run"
    )
    assert message == Message.tool_result("c1", "ok", name="run")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param({"role": "bot", "content": "hi"}, "role", id="unknown-role"),
        pytest.param({"role": "function", "content": "hi", "name": "f"}, "role", id="legacy-fn"),
        pytest.param({"content": "hi"}, "role", id="no-role"),
        pytest.param(
            {"role": "user", "content": {"type": "text", "text": "hi"}},
            "content",
            id="dict-content",
        ),
        pytest.param({"role": "user", "content": 5}, "content", id="int-content"),
        pytest.param({"role": "user", "content": ["hi"]}, "content", id="string-block"),
        pytest.param(
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
            "tool_calls",
            id="call-without-id",
        ),
        pytest.param(
            {"role": "assistant", "tool_calls": [{"id": 1, "function": {"name": "f"}}]},
            "tool_calls",
            id="call-with-int-id",
        ),
        pytest.param(
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]},
            "tool_calls",
            id="call-without-function",
        ),
        pytest.param({"role": "assistant", "tool_calls": ["c1"]}, "tool_calls", id="call-str"),
        pytest.param({"role": "tool", "content": "orphan"}, None, id="tool-without-call-id"),
        pytest.param({"role": "user"}, None, id="user-without-content"),
        pytest.param(
            {"role": "system", "content": [{"type": "text", "text": "hi"}]},
            None,
            id="system-blocks",
        ),
        pytest.param(
            {
                "role": "user",
                "content": "hi",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            },
            None,
            id="user-with-calls",
        ),
        pytest.param(
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c", "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            None,
            id="duplicate-call-ids",
        ),
    ],
)
def test_from_openai_refuses_malformed_messages(data: dict[str, Any], field: str | None) -> None:
    with pytest.raises(ValidationError) as caught:
        Message.from_openai(data)
    assert caught.value.field == field


# ---- property: to_openai / from_openai round-trips generated content ----------------------

# Any Unicode text (no lone surrogates: they cannot be UTF-8 encoded, so no provider sends them).
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=200)
IDS = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=40)
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**53), max_value=2**53), TEXT
)
ARGS = st.dictionaries(
    TEXT, st.one_of(JSON_SCALARS, st.lists(JSON_SCALARS, max_size=3)), max_size=4
)


@st.composite
def openai_messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "assistant", "assistant-calls", "tool"]))
    text = draw(TEXT)
    if kind == "user":
        return Message.user(text)
    if kind == "assistant":
        return Message.assistant(text, reasoning=draw(st.none() | TEXT))
    if kind == "tool":
        return Message.tool_result(draw(IDS), text)
    ids = draw(st.lists(IDS, min_size=1, max_size=3, unique=True))
    calls = [ToolCall(id=i, name=draw(IDS), args=draw(ARGS)) for i in ids]
    return Message.assistant(draw(st.none() | st.just(text)), tool_calls=calls)


@settings(max_examples=200, deadline=None)
@given(openai_messages())
@example(Message.user("\x00"))
@example(Message.user("nul\x00inside and 🎉 emoji, é, 日本, 𝔘"))
@example(Message.tool_result("c1", "🧪\x00"))
@example(
    Message.assistant("👩‍👩‍👧", tool_calls=[ToolCall(id="c\x00", name="f", args={"k": "\x00"})])
)
def test_openai_round_trip_property(message: Message) -> None:
    data = message.to_openai(include_reasoning=True)
    assert orjson.loads(orjson.dumps(data)) == data
    back = Message.from_openai(data)
    assert back == message
    assert back.text == message.text
