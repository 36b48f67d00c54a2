"""Pydantic AI's messages as the log's messages (episodic/formats/pydantic_ai.py), with
Pydantic AI's own classes: every part kind comes back as it went in (as Pydantic AI's own JSON
round trip gives it), the parts of one message are found together again in any order a
loaded context puts them, calls and returns pair by id, each message has the role, text and
calls episodic's rules need, and what is not a message's JSON is refused by name."""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest

from episodic.errors import ValidationError
from episodic.formats.pydantic_ai import (
    PYDANTIC_AI_PROTOCOL,
    message_digest,
    messages_from_pydantic_ai,
    pydantic_ai_messages_of,
)
from episodic.models import Message, ToolCall
from tests.support import require_extra

require_extra("pydantic_ai", "pydantic-ai")
from pydantic_ai import messages as pai  # noqa: E402
from pydantic_ai.usage import RequestUsage  # noqa: E402

ADAPTER = pai.ModelMessagesTypeAdapter


def as_json(messages: list[pai.ModelMessage]) -> list[dict[str, Any]]:
    return ADAPTER.dump_python(messages, mode="json")  # type: ignore[no-any-return]


def to_log(messages: list[pai.ModelMessage]) -> list[Message]:
    return [m for item in as_json(messages) for m in messages_from_pydantic_ai(item)]


def from_log(messages: list[Message]) -> list[pai.ModelMessage]:
    return ADAPTER.validate_python(pydantic_ai_messages_of(messages))


def round_trip(messages: list[pai.ModelMessage]) -> list[pai.ModelMessage]:
    return from_log(to_log(messages))


def stored(messages: list[Message]) -> list[Message]:
    """As a loaded context gives them: each with a seq, through a JSON column."""
    return [
        Message.model_validate_json(m.model_dump_json()).model_copy(update={"seq": i + 1})
        for i, m in enumerate(messages)
    ]


def a_run() -> list[pai.ModelMessage]:
    """A run with the common parts: system prompt, instructions, prompt, thinking, two
    parallel calls (args as an object and as a string), their returns, a final answer."""
    return [
        pai.ModelRequest(
            parts=[pai.SystemPromptPart("You are careful."), pai.UserPromptPart("Fix the test")],
            instructions="Be terse.",
            run_id="run-1",
            conversation_id="conv-1",
        ),
        pai.ModelResponse(
            parts=[
                pai.ThinkingPart("Run both checks.", signature="sig-1", provider_name="anthropic"),
                pai.TextPart("Checking."),
                pai.ToolCallPart("pytest", {"path": "tests/"}, tool_call_id="c1"),
                pai.ToolCallPart("ruff", '{"fix": true}', tool_call_id="c2"),
            ],
            usage=RequestUsage(input_tokens=120, output_tokens=30, cache_read_tokens=100),
            model_name="claude-x",
            provider_name="anthropic",
            provider_response_id="resp-1",
            finish_reason="tool_call",
            run_id="run-1",
        ),
        pai.ModelRequest(
            parts=[
                pai.ToolReturnPart("pytest", {"failed": 1, "passed": 41}, tool_call_id="c1"),
                pai.ToolReturnPart(
                    "ruff", "E501 line too long", tool_call_id="c2", outcome="failed"
                ),
            ],
            instructions="Be terse.",
            run_id="run-1",
        ),
        pai.ModelResponse(parts=[pai.TextPart("One test fails: E1234.")], run_id="run-1"),
    ]


def test_a_run_round_trips_part_for_part() -> None:
    run = a_run()
    assert round_trip(run) == run
    # through a JSON column and back, as a loaded context gives them
    assert from_log(stored(to_log(run))) == run


def test_every_part_kind_comes_back_as_pydantic_ais_own_json_gives_it() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # RetryPromptPart is deprecated: stored ones remain
        legacy = [
            pai.RetryPromptPart("wrong type for 'path'", tool_name="pytest", tool_call_id="c3"),
            pai.RetryPromptPart("plain text is not allowed"),
        ]
    history: list[pai.ModelMessage] = [
        pai.ModelRequest(
            parts=[
                pai.SystemPromptPart("sys", dynamic_ref="prompt_fn"),
                pai.UserPromptPart(
                    [
                        "What is in these?",
                        pai.ImageUrl("https://example.com/cat.png"),
                        pai.BinaryContent(b"\x89PNG" + bytes(600), media_type="image/png"),
                        pai.DocumentUrl("https://example.com/spec.pdf"),
                    ]
                ),
                pai.InstructionDeltaPart(id="agent:0", content="Answer in French."),
                pai.ModelSettingsDeltaPart(settings={"temperature": 0.2}),
                pai.ToolAvailabilityDeltaPart(tools_added=["pytest"]),
                pai.CapabilityLoadDeltaPart(loaded=["search"]),
            ],
            instructions="Be terse.",
            metadata={"request": 1},
        ),
        pai.ModelResponse(
            parts=[
                pai.ThinkingPart("", signature="opaque", provider_name="anthropic"),
                pai.NativeToolCallPart("web_search", {"query": "E1234"}, tool_call_id="w1"),
                pai.NativeToolReturnPart("web_search", [{"url": "https://x"}], tool_call_id="w1"),
                pai.FilePart(pai.BinaryContent(b"GIF89a" + bytes(40), media_type="image/gif")),
                pai.TextPart("Found it.", id="t1"),
                pai.ToolCallPart("pytest", None, tool_call_id="c3"),
                pai.ToolCallPart("lookup", "{not json", tool_call_id="c4"),
                pai.CompactionPart(content="provider summary", provider_name="openai"),
            ],
            usage=RequestUsage(input_tokens=5, output_tokens=7, output_reasoning_tokens=3),
            state="complete",
        ),
        pai.ModelRequest(
            parts=[
                legacy[0],
                pai.ToolReturnPart("lookup", 42, tool_call_id="c4", outcome="denied"),
                legacy[1],
                pai.RetryFeedbackPart("Give a number.", retry=pai.RetryInfo(cause="model_retry")),
                pai.SpeechPart(speaker="user", transcript="and quickly"),
            ]
        ),
        pai.ModelRequest(parts=[pai.CompactionPart(content="what came before")]),
        pai.ModelResponse(
            parts=[pai.ToolSearchCallPart(args={"queries": ["deploy"]}, tool_call_id="ts1")]
        ),
        pai.ModelRequest(
            parts=[
                pai.ToolSearchReturnPart(
                    content={"discovered_tools": [], "message": "none"}, tool_call_id="ts1"
                )
            ]
        ),
        pai.ModelResponse(parts=[pai.TextPart("Done.")]),
    ]
    data = as_json(history)
    back = from_log(stored(to_log(history)))
    assert back == ADAPTER.validate_python(data)
    assert as_json(back) == ADAPTER.dump_python(ADAPTER.validate_python(data), mode="json")
    # the legacy retry parts are read as Pydantic AI reads them: a tool's retry, feedback
    retried = back[2].parts
    assert isinstance(retried[0], pai.ToolReturnPart)
    assert retried[0].outcome == "retried"
    assert isinstance(retried[2], pai.RetryFeedbackPart)
    # a tool search is a call and its return, paired like any other
    log = to_log(history)
    assert [c.id for m in log for c in m.tool_calls] == ["c3", "c4", "ts1"]
    assert [m.tool_call_id for m in log if m.role == "tool"] == ["c3", "c4", "ts1"]
    assert isinstance(back[-3].parts[0], pai.ToolSearchCallPart)


def test_a_response_is_one_assistant_message() -> None:
    (message,) = to_log([a_run()[1]])
    assert message.role == "assistant"
    assert message.content == "Checking."
    assert message.reasoning == "Run both checks."
    assert message.tool_calls == (
        ToolCall(id="c1", name="pytest", args={"path": "tests/"}),
        ToolCall(id="c2", name="ruff", args={"fix": True}, arguments_json='{"fix": true}'),
    )
    assert message.native is not None
    assert message.native.protocol == PYDANTIC_AI_PROTOCOL


def test_a_request_is_its_returns_then_one_user_message() -> None:
    request = pai.ModelRequest(
        parts=[
            pai.SystemPromptPart("secret system prompt"),
            pai.ToolReturnPart("pytest", "1 failed", tool_call_id="c1"),
            pai.UserPromptPart("now fix it"),
            pai.ToolReturnPart("ruff", "boom", tool_call_id="c2", outcome="failed"),
        ]
    )
    first, second, user = to_log([request])
    assert (first.role, first.tool_call_id, first.name, first.content, first.is_error) == (
        "tool", "c1", "pytest", "1 failed", False,
    )  # fmt: skip
    assert (second.tool_call_id, second.is_error) == ("c2", True)
    assert (user.role, user.content) == ("user", "now fix it")
    # the system prompt rides along, never a turn's text
    assert all("secret" not in m.text for m in (first, second, user))
    digest = message_digest(as_json([request])[0])
    assert [m.client_id for m in (first, second, user)] == [
        f"pydantic-ai:{digest}:{i}" for i in range(3)
    ]
    go = pai.ModelRequest(parts=[pai.UserPromptPart("go")])
    calls = pai.ModelResponse(
        parts=[
            pai.ToolCallPart(name, {}, tool_call_id=c)
            for name, c in (("pytest", "c1"), ("ruff", "c2"))
        ]
    )
    assert round_trip([go, calls, request]) == [go, calls, request]


def test_a_request_that_says_nothing_rides_on_its_first_return_or_is_an_empty_turn() -> None:
    only_system = pai.ModelRequest(parts=[pai.SystemPromptPart("sys")])
    (message,) = to_log([only_system])
    assert (message.role, message.content) == ("user", "")
    returns = pai.ModelRequest(
        parts=[
            pai.ToolReturnPart("a", "x", tool_call_id="c1"),
            pai.ToolAvailabilityDeltaPart(tools_added=["b"]),
        ]
    )
    (result,) = to_log([returns])
    assert result.role == "tool"
    assert round_trip([only_system]) == [only_system]
    call = pai.ModelResponse(parts=[pai.ToolCallPart("a", {}, tool_call_id="c1")])
    assert round_trip([only_system, call, returns]) == [only_system, call, returns]


def test_files_are_read_by_their_url_or_size_never_their_bytes() -> None:
    request = pai.ModelRequest(
        parts=[
            pai.UserPromptPart(
                [
                    "look",
                    pai.ImageUrl("https://x/cat.png"),
                    pai.BinaryContent(bytes(3_000), media_type="image/png"),
                ]
            )
        ]
    )
    response = pai.ModelResponse(
        parts=[pai.FilePart(pai.BinaryContent(bytes(9_000), media_type="image/png"))]
    )
    user, assistant = to_log([request, response])
    assert user.text == "look\n[image-url] https://x/cat.png\n[image/png] <3,000 bytes>"
    assert "<9,000 bytes>" in assistant.text
    assert "AAAA" not in user.text + assistant.text


def test_parts_are_found_together_in_whatever_order_a_context_gives_them() -> None:
    """A loaded context puts each return right after its call, in the calls' order, whatever
    order they were appended in; the request comes back whole, its parts in their order."""
    response = pai.ModelResponse(
        parts=[pai.ToolCallPart("f", {}, tool_call_id=f"c{i}") for i in range(4)]
    )
    request = pai.ModelRequest(
        parts=[pai.ToolReturnPart("f", i, tool_call_id=f"c{i}") for i in (2, 0, 3, 1)],
        instructions="kept",
    )
    prompt = pai.ModelRequest(parts=[pai.UserPromptPart("check all four")])
    messages = stored(to_log([prompt, response, request]))
    head, returns = messages[:2], messages[2:]
    for seed in range(5):
        shuffled = returns[:]
        random.Random(seed).shuffle(shuffled)
        assert from_log([*head, *shuffled]) == [prompt, response, request]


def test_a_message_left_out_leaves_out_its_parts() -> None:
    response, request = (
        pai.ModelResponse(parts=[pai.ToolCallPart("f", {}, tool_call_id=c) for c in ("a", "b")]),
        pai.ModelRequest(
            parts=[
                pai.ToolReturnPart("f", 1, tool_call_id="a"),
                pai.ToolReturnPart("f", 2, tool_call_id="b"),
            ],
            instructions="Be terse.",
        ),
    )
    prompt = pai.ModelRequest(parts=[pai.UserPromptPart("go")])
    *head, first, second = stored(to_log([prompt, response, request]))
    (_, _, without_second) = from_log([*head, first])
    assert isinstance(without_second, pai.ModelRequest)
    assert without_second.instructions == "Be terse."
    assert [p.tool_call_id for p in without_second.parts] == ["a"]
    # Without the first, which carried the request's own fields, the kind is all that is left.
    (_, _, without_first) = from_log([*head, second])
    assert isinstance(without_first, pai.ModelRequest)
    assert without_first.instructions is None
    assert [p.tool_call_id for p in without_first.parts] == ["b"]


def test_messages_from_elsewhere_become_requests_and_responses() -> None:
    """A handoff and retained user messages, an assistant's call, a synthetic error result:
    one request for the consecutive user texts, a response, a return joining a request."""
    messages = [
        Message.user("Handoff: the user fixed E1234."),
        Message.user("Now run the linter"),
        Message.assistant("Running.", tool_calls=[ToolCall(id="x1", name="ruff", args={"a": 1})]),
        Message.tool_result("x1", "No result was recorded", name="ruff", is_error=True),
        Message.system("never part of a history"),
        Message.assistant("Done."),
    ]
    back = from_log(messages)
    assert [type(m) for m in back] == [
        pai.ModelRequest,
        pai.ModelResponse,
        pai.ModelRequest,
        pai.ModelResponse,
    ]
    assert [p.content for p in back[0].parts] == [
        "Handoff: the user fixed E1234.",
        "Now run the linter",
    ]
    call = back[1].parts[1]
    assert isinstance(call, pai.ToolCallPart)
    assert (call.tool_name, call.args, call.tool_call_id) == ("ruff", {"a": 1}, "x1")
    (result,) = back[2].parts
    assert isinstance(result, pai.ToolReturnPart)
    assert (result.tool_call_id, result.outcome) == ("x1", "failed")


def test_a_history_starts_with_a_request_and_holds_no_return_without_its_call() -> None:
    run = a_run()
    log = to_log(run)
    # the first request left out (a cut, a retraction): the response before any request goes,
    # and with it its calls, so their returns go too
    assert from_log(log[1:]) == [run[3]]
    # a return whose call is elsewhere is left out, the rest of its request stays
    orphan = to_log([pai.ModelRequest(parts=[pai.ToolReturnPart("f", 1, tool_call_id="zz")])])
    back = from_log([*log, *orphan])
    assert back == run
    assert from_log([]) == []


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ("not a message", None),
        ({"kind": "thought", "parts": []}, "kind"),
        ({"kind": "request", "parts": "text"}, "parts"),
        ({"kind": "request", "parts": [{"content": "no kind"}]}, "parts"),
        (
            {"kind": "response", "parts": [{"part_kind": "tool-call", "tool_name": "f"}]},
            "tool_call_id",
        ),
        (
            {
                "kind": "response",
                "parts": [{"part_kind": "tool-call", "tool_call_id": "c", "args": 3}],
            },
            "tool_name",
        ),
        (
            {"kind": "request", "parts": [{"part_kind": "tool-return", "content": "x"}]},
            "tool_call_id",
        ),
        (
            {
                "kind": "response",
                "parts": [{"part_kind": "text", "content": "x", "extra": float("nan")}],
            },
            "native",
        ),
    ],
)
def test_what_is_not_a_messages_json_is_refused_by_name(data: Any, field: str | None) -> None:
    with pytest.raises(ValidationError) as refused:
        messages_from_pydantic_ai(data)
    assert refused.value.field == field
    assert "Pydantic AI message" in str(refused.value)
    if field == "native":  # the value JSON cannot hold is named
        assert "native.data.parts[0][1].extra is NaN" in str(refused.value)


def test_the_digest_is_the_messages_whatever_the_order_of_its_keys() -> None:
    (data,) = as_json([a_run()[1]])
    reordered = dict(reversed(list(data.items())))
    assert message_digest(reordered) == message_digest(data)
    changed = {**data, "model_name": "another"}
    assert message_digest(changed) != message_digest(data)
