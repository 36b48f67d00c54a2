"""The conversions into episodic's messages that an append in a provider's format needs:
Anthropic's turns (a user turn's results split off as tool messages) and a list of Responses
items (parallel function calls kept as one message). What a context gives in a format comes
back, converted and loaded, as the same context."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from episodic.errors import ValidationError
from episodic.formats.anthropic import ANTHROPIC_PROTOCOL, messages_from_anthropic
from episodic.formats.openai_chat import messages_from_openai
from episodic.formats.responses import (
    OPENAI_RESPONSES_ITEMS_PROTOCOL,
    messages_from_responses_items,
)
from episodic.models import OPENAI_RESPONSES_PROTOCOL, ImageBlock, Message, TextBlock, ToolCall
from tests.unit.test_formats import PNG, context_of, conversations


def test_a_user_turn_s_results_are_tool_messages_named_after_their_calls() -> None:
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t2", "name": "clock", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": "noon"},
                {"type": "text", "text": "also, thanks"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "sunny"}],
                    "is_error": True,
                },
            ],
        },
    ]
    messages = messages_from_anthropic(turns)
    assert messages == [
        Message.user("weather?"),
        Message.assistant(
            (TextBlock(text="checking"),),
            tool_calls=[
                ToolCall(id="t1", name="weather", args={"city": "Paris"}),
                ToolCall(id="t2", name="clock"),
            ],
        ),
        Message.tool_result("t2", "noon", name="clock"),
        Message.tool_result("t1", (TextBlock(text="sunny"),), name="weather", is_error=True),
        Message.user((TextBlock(text="also, thanks"),)),
    ]


def test_what_the_fields_cannot_say_is_kept_in_native() -> None:
    thinking = {"type": "thinking", "thinking": "the user wants a number", "signature": "sig"}
    cached = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG.split(",")[1]}}  # fmt: skip
    assistant, user = messages_from_anthropic(
        [
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "42"}]},
            {"role": "user", "content": [cached, image]},
        ]
    )
    assert assistant.reasoning == "the user wants a number"
    assert assistant.content == (TextBlock(text="42"),)
    assert assistant.native is not None
    assert assistant.native.protocol == ANTHROPIC_PROTOCOL
    assert assistant.native.data["content"] == [thinking, {"type": "text", "text": "42"}]
    assert user.content == (TextBlock(text="hi"), ImageBlock(url=PNG))
    assert user.native is not None
    kept = user.native.data["content"]
    assert isinstance(kept, list)
    assert kept[0] == cached
    plain = messages_from_anthropic([{"role": "user", "content": [image]}])[0]
    assert plain.native is None  # given back as it came: nothing to keep


@pytest.mark.parametrize(
    ("turns", "field"),
    [
        ({"role": "user", "content": "hi"}, "messages"),
        ([{"role": "system", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": []}], "messages[0].content"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "x",
                                        "input": {}}]}], "messages[0].content[0]"),
        ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}],
         "messages[0].content[0]"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "id": "fn:0", "name": "x",
                                             "input": {}}]}], "messages[0].content[0].id"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x",
                                             "input": []}]}], "messages[0].content[0].input"),
        ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                        "is_error": "yes"}]}], "messages[0].content[0].is_error"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x",
                                             "input": {}}] * 2}], "messages[0]"),
    ],
)  # fmt: skip
def test_what_is_not_a_turn_is_refused_where_it_is(turns: Any, field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        messages_from_anthropic(turns)
    assert refused.value.field == field


def test_parallel_function_calls_are_one_message() -> None:
    call = {"type": "function_call", "name": "run", "arguments": "{}", "status": "completed"}
    items = [
        {"type": "message", "role": "user", "content": "go"},
        {**call, "call_id": "a", "id": "fc_1"},
        {**call, "call_id": "b", "id": "fc_2"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": "2"},
        {**call, "call_id": "c"},
    ]
    user, both, out_a, out_b, alone = messages_from_responses_items(items)
    assert [c.id for c in both.tool_calls] == ["a", "b"]
    assert both.native is not None
    assert both.native.protocol == OPENAI_RESPONSES_ITEMS_PROTOCOL
    assert both.native.data == {"items": items[1:3]}
    assert alone.native is not None
    assert alone.native.protocol == OPENAI_RESPONSES_PROTOCOL
    assert (out_a.tool_call_id, out_b.tool_call_id, user.text) == ("a", "b", "go")
    # loaded, the outputs stay after both calls, as the items came
    assert [i["type"] for i in context_of([user, both, out_a, out_b]).to_responses()] == [
        "message", "function_call", "function_call", "function_call_output",
        "function_call_output",
    ]  # fmt: skip


def test_an_item_that_is_not_one_is_refused_with_its_index() -> None:
    with pytest.raises(ValidationError) as refused:
        messages_from_responses_items([{"role": "user", "content": "x"}, {"type": ""}])
    assert refused.value.field == "items[1].type"
    with pytest.raises(ValidationError) as in_a_run:
        messages_from_responses_items(
            [{"type": "function_call", "call_id": "a", "name": "x"}, {"type": "function_call"}]
        )
    assert in_a_run.value.field == "items[1].call_id"


@settings(max_examples=150, deadline=None)
@given(conversations())
def test_a_context_converted_back_and_loaded_is_the_same_context(
    messages: list[Message],
) -> None:
    context = context_of(messages)
    anthropic = context.to_anthropic()
    assert context_of(messages_from_anthropic(anthropic)).to_anthropic() == anthropic
    responses = context.to_responses()
    assert context_of(messages_from_responses_items(responses)).to_responses() == responses
    chat = context.to_openai()
    assert context_of(messages_from_openai(chat)).to_openai() == chat
