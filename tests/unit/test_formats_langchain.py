"""LangChain messages as the log's messages (episodic/formats/langchain.py), with LangChain's
own classes: every kind comes back equal to what went in, through the log's JSON too; calls
and results pair by id; reasoning, images and blocks episodic has no model for land where
its rules and summarizers need them; a message changed at load, or written elsewhere, is
built as a valid LangChain message from its fields; what is not a message is refused,
naming the field."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest

from episodic.context import MISSING_RESULT_TEXT, TOOL_RESULT_CUT_MARKER_NOTE, compose_context
from episodic.errors import ValidationError
from episodic.formats.langchain import (
    LANGCHAIN_MESSAGE_PROTOCOL,
    message_from_langchain,
    message_to_langchain,
    messages_from_langchain,
    messages_to_langchain,
    usage_from_langchain,
)
from episodic.models import ImageBlock, Message, RawBlock, TextBlock, ToolCall, Usage
from episodic.rendering import context_token_estimate
from episodic.tokens import CharHeuristic
from tests.support import require_extra

require_extra("langchain_core", "langchain")
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)

CID = UUID("00000000-0000-4000-8000-00000000a1c0")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
PNG = "data:image/png;base64,iVBORw0KGgo="


def as_dict(message: BaseMessage) -> dict[str, Any]:
    return messages_to_dict([message])[0]


def back(message: Message) -> BaseMessage:
    (out,) = messages_from_dict([message_to_langchain(message)])
    return out


def stored(message: Message) -> Message:
    """The message as the log gives it back: its JSON, read again."""
    return Message.model_validate_json(message.model_dump_json())


def call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


#: One message of each kind LangChain agents produce, with what episodic has no field for.
MESSAGES: dict[str, BaseMessage] = {
    "human": HumanMessage("Why does pytest fail?", id="h1"),
    "human-blocks": HumanMessage(
        [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
            {"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"},
            "and this line",
        ],
        name="ada",
        id="h2",
    ),
    "ai-text": AIMessage(
        "It imports a module that moved.",
        id="lc_run--1-0",
        response_metadata={"model_name": "gpt-x", "finish_reason": "stop"},
        usage_metadata={"input_tokens": 120, "output_tokens": 9, "total_tokens": 129},
    ),
    "ai-parallel-calls": AIMessage(
        "Looking at both.",
        tool_calls=[call("read", "c1", path="a.py"), call("grep", "c2", pattern="E1234")],
        id="lc_run--2-0",
    ),
    "ai-malformed-call": AIMessage(
        "",
        invalid_tool_calls=[
            {
                "name": "read",
                "args": '{"path": ',
                "id": "c3",
                "error": "cut",
                "type": "invalid_tool_call",
            },
        ],
        id="lc_run--3-0",
    ),
    "ai-thinking": AIMessage(
        [
            {"type": "thinking", "thinking": "The path moved in 2.0.", "signature": "sig=="},
            {"type": "text", "text": "Reading it."},
            {"type": "tool_use", "id": "c4", "name": "read", "input": {"path": "b.py"}},
        ],
        tool_calls=[call("read", "c4", path="b.py")],
        id="lc_run--4-0",
    ),
    "ai-reasoning-kwargs": AIMessage(
        "Done.", additional_kwargs={"reasoning_content": "Checked twice."}, id="r5"
    ),
    "tool": ToolMessage("1 failed, 3 passed", tool_call_id="c1", name="read", id="t1"),
    "tool-error-artifact": ToolMessage(
        "permission denied",
        tool_call_id="c2",
        status="error",
        artifact={"exit": 1, "stderr": ["denied"]},
        id="t2",
    ),
    "tool-blocks": ToolMessage(
        [{"type": "text", "text": "the chart"}, {"type": "image_url", "image_url": {"url": PNG}}],
        tool_call_id="c4",
        id="t3",
    ),
    "system": SystemMessage("Answer in French.", id="s1"),
    "chat-assistant": ChatMessage(role="assistant", content="From another stack.", id="x1"),
    "ai-chunk": AIMessageChunk(content="streamed", id="lc_run--6"),
}


@pytest.mark.parametrize("original", MESSAGES.values(), ids=MESSAGES.keys())
def test_every_kind_comes_back_as_it_went_in(original: BaseMessage) -> None:
    message = message_from_langchain(as_dict(original), client_id=original.id)
    assert message.native is not None
    assert message.native.protocol == LANGCHAIN_MESSAGE_PROTOCOL
    assert message.client_id == original.id
    assert back(message) == original
    assert back(stored(message)) == original  # and through the log's JSON


def test_the_fields_say_what_each_message_said() -> None:
    read = {name: message_from_langchain(as_dict(m)) for name, m in MESSAGES.items()}
    assert (read["human"].role, read["human"].text) == ("user", "Why does pytest fail?")
    assert read["human-blocks"].name == "ada"
    assert read["human-blocks"].content == (
        TextBlock(text="What is in this picture?"),
        ImageBlock(url=PNG, detail="low"),
        RawBlock(data={"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"}),
        TextBlock(text="and this line"),
    )
    calls = read["ai-parallel-calls"].tool_calls
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("c1", "read", {"path": "a.py"}),
        ("c2", "grep", {"pattern": "E1234"}),
    ]
    # A malformed call is a call (LangChain answers it with an error result), args as sent.
    assert read["ai-malformed-call"].tool_calls == (
        ToolCall(id="c3", name="read", args={}, arguments_json='{"path": '),
    )
    thinking = read["ai-thinking"]
    assert (thinking.text, thinking.reasoning) == ("Reading it.", "The path moved in 2.0.")
    assert [c.id for c in thinking.tool_calls] == ["c4"]
    assert read["ai-reasoning-kwargs"].reasoning == "Checked twice."
    tool, error = read["tool"], read["tool-error-artifact"]
    assert (tool.role, tool.tool_call_id, tool.name, tool.is_error) == ("tool", "c1", "read", False)
    assert (error.is_error, error.text) == (True, "permission denied")
    assert read["tool-blocks"].content == (TextBlock(text="the chart"), ImageBlock(url=PNG))
    assert (read["system"].role, read["system"].content) == ("system", "Answer in French.")
    assert read["chat-assistant"].role == "assistant"
    assert read["ai-chunk"].role == "assistant"


def test_results_pair_with_their_calls_in_a_loaded_context() -> None:
    """Read in order and loaded, a turn of parallel calls keeps each result after its call,
    and a call whose result never came gets the synthetic error result, as a ToolMessage."""
    turn = [
        HumanMessage("check both", id="h"),
        MESSAGES["ai-parallel-calls"],
        ToolMessage("ok", tool_call_id="c2", id="t-c2"),  # the second answered first
        ToolMessage("ok", tool_call_id="c1", id="t-c1"),
        AIMessage("", tool_calls=[call("read", "lost")], id="ai-lost"),
    ]
    context = context_of(messages_from_langchain([as_dict(m) for m in turn]))
    loaded = messages_from_dict(messages_to_langchain(context.messages))
    assert [getattr(m, "tool_call_id", None) for m in loaded] == [
        None, None, "c1", "c2", None, "lost",
    ]  # fmt: skip
    assert loaded[:5] == [*turn[:2], turn[3], turn[2], turn[4]]  # each as it came
    missing = loaded[-1]
    assert isinstance(missing, ToolMessage)
    assert (missing.text, missing.status) == (MISSING_RESULT_TEXT, "error")


def test_a_result_cut_at_load_is_sent_cut() -> None:
    """``compose_context`` caps a long tool result keeping ``native``: the capped text is
    what goes back, with the result's call id, name and status."""
    long = ToolMessage("line\n" * 2_000, tool_call_id="c1", name="read", id="t1")
    turn = [MESSAGES["ai-parallel-calls"], long, ToolMessage("x", tool_call_id="c2", id="t2")]
    context = context_of(messages_from_langchain([as_dict(m) for m in turn]), cap=50)
    capped = messages_from_dict(messages_to_langchain(context.messages))[1]
    assert isinstance(capped, ToolMessage)
    assert capped.text.endswith(TOOL_RESULT_CUT_MARKER_NOTE)
    assert len(capped.text) < 1_000
    assert (capped.tool_call_id, capped.name, capped.id, capped.status) == (
        "c1", "read", "t1", "success",
    )  # fmt: skip


def test_messages_written_elsewhere_become_valid_langchain_messages() -> None:
    """A handoff, a chat-completions turn with a call whose arguments did not parse, an error
    result and a system message: each built from its fields."""
    written = [
        Message.user("Earlier: the import moved to pkg.core."),
        Message.from_openai(
            {
                "role": "assistant",
                "content": "Two calls.",
                "tool_calls": [
                    {
                        "id": "k1",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path": "a.py"}'},
                    },
                    {
                        "id": "k2",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{oops"},
                    },
                ],
            }
        ),
        Message.tool_result("k1", "contents", name="read"),
        Message.tool_result("k2", "bad arguments", is_error=True),
        Message.assistant([TextBlock(text="See"), ImageBlock(url=PNG, detail="high")]),
        Message.system("Be brief."),
    ]
    human, ai, result, error, image, system = messages_from_dict(messages_to_langchain(written))
    assert isinstance(human, HumanMessage)
    assert human.text == "Earlier: the import moved to pkg.core."
    assert isinstance(ai, AIMessage)
    assert ai.tool_calls == [call("read", "k1", path="a.py")]
    assert [(c["id"], c["args"]) for c in ai.invalid_tool_calls] == [("k2", "{oops")]
    assert isinstance(result, ToolMessage)
    assert (result.tool_call_id, result.name, result.status) == ("k1", "read", "success")
    assert isinstance(error, ToolMessage)
    assert error.status == "error"
    assert isinstance(image, AIMessage)
    assert image.content == [
        {"type": "text", "text": "See"},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
    ]
    assert isinstance(system, SystemMessage)
    # Read again, each says the same (LangChain keeps no argument text, only its object).
    again = messages_from_langchain(messages_to_langchain(written))
    assert [said(m) for m in again] == [said(m) for m in written]


def said(message: Message) -> tuple[Any, ...]:
    calls = [(c.id, c.name, c.args) for c in message.tool_calls]
    return (message.role, message.content, calls, message.tool_call_id, message.is_error)


def test_the_client_id_is_the_id_sent_back_when_native_is_gone() -> None:
    message = Message.user("hello", client_id="h-42")
    assert back(message).id == "h-42"


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"type": "function", "data": {"content": "x", "name": "f"}}, "type", "FunctionMessage"),
        ({"type": "remove", "data": {"id": "m1"}}, "type", "unknown LangChain message type"),
        ({"type": "chat", "data": {"content": "x", "role": "critic"}}, "role", "'critic'"),
        ({"type": "tool", "data": {"content": "x"}}, "tool_call_id", "tool_call_id"),
        ({"type": "ai", "data": {"content": "", "tool_calls": [{"name": "f", "args": {}}]}},
         "tool_calls.id", "needs its id"),
        ({"type": "human", "data": {"content": 7}}, "content", "string or a list"),
        ({"type": "human", "data": {"content": [7]}}, "content", "string or an object"),
        ({"type": "human"}, "data", "under 'data'"),
    ],
)  # fmt: skip
def test_what_is_not_a_message_is_refused_naming_the_field(
    data: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ValidationError, match=words) as caught:
        message_from_langchain(data)
    assert caught.value.field == field


def test_a_refusal_names_the_value_and_the_index() -> None:
    with pytest.raises(ValidationError, match="must be its dict"):
        message_from_langchain(HumanMessage("x"))  # type: ignore[arg-type]
    nan = as_dict(AIMessage("", tool_calls=[call("f", "c1", x=1.0)]))
    nan["data"]["tool_calls"][0]["args"]["x"] = math.nan
    with pytest.raises(ValidationError, match=r"tool_calls\[0\]\.args\.x is NaN") as caught:
        messages_from_langchain([as_dict(HumanMessage("ok")), nan])
    assert caught.value.field is not None
    assert caught.value.field.startswith("messages[1]")
    with pytest.raises(ValidationError, match="list of LangChain message dicts"):
        messages_from_langchain(as_dict(HumanMessage("one")))  # type: ignore[arg-type]


def test_usage_metadata_is_the_calls_usage() -> None:
    assert usage_from_langchain(
        {
            "input_tokens": 1_200,
            "output_tokens": 40,
            "total_tokens": 1_240,
            "input_token_details": {"cache_read": 1_000, "cache_creation": 100},
            "output_token_details": {"reasoning": 12},
        }
    ) == Usage(input_tokens=1_200, output_tokens=40, cache_read_tokens=1_000, reasoning_tokens=12)
    assert usage_from_langchain({"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}) == (
        Usage(input_tokens=5, output_tokens=1)
    )
    assert usage_from_langchain(None) is None
    with pytest.raises(ValidationError, match="input_tokens"):
        usage_from_langchain({"input_tokens": -1, "output_tokens": 0, "total_tokens": 0})


def context_of(tail: list[Message], cap: int | None = None) -> Any:
    """The context ``load_context`` would give for ``tail`` stored from seq 1, no boundary."""
    estimator = CharHeuristic()
    kept = [
        m.as_stored(seq=i, created_at=T0, token_estimate=context_token_estimate(m, estimator))
        for i, m in enumerate(tail, 1)
    ]
    return compose_context(
        CID,
        boundary=None,
        tail=kept,
        last_seq=len(kept),
        estimator=estimator,
        max_tool_result_tokens=cap,
    )
