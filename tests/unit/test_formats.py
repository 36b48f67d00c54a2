"""episodic.formats: the Responses-API items and the Anthropic Messages list, checked against
the providers' own SDK types, and the chat-completions and cliver moves (the models and
``Context`` delegate; ``test_models.py`` holds the chat-completions behaviour itself)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import orjson
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodic
from episodic.context import MISSING_RESULT_TEXT, Context, compose_context
from episodic.errors import ConfigurationError, ValidationError
from episodic.formats import openai_chat
from episodic.formats.anthropic import messages_to_anthropic, tool_use_id
from episodic.formats.cliver import messages_to_cliver
from episodic.formats.responses import RENDERED_ITEM_CHARS, messages_to_responses
from episodic.models import (
    OPENAI_CHAT_PROTOCOL,
    OPENAI_RESPONSES_PROTOCOL,
    ImageBlock,
    Message,
    NativePayload,
    RawBlock,
    TextBlock,
    ToolCall,
)
from episodic.rendering import context_token_estimate
from episodic.tokens import CharHeuristic
from tests.reliability.strategies import anthropic_turn_violations
from tests.support import require_extra
from tests.support_formats import check_anthropic, check_responses

CID = UUID("00000000-0000-4000-8000-00000000f0f0")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
PNG = "data:image/png;base64,iVBORw0KGgo="


def context_of(tail: Sequence[Message], **options: Any) -> Context:
    """The context ``load_context`` would give for ``tail`` stored from seq 1, no boundary."""
    estimator = CharHeuristic()
    stored = [
        m.as_stored(seq=i, created_at=T0, token_estimate=context_token_estimate(m, estimator))
        for i, m in enumerate(tail, 1)
    ]
    return compose_context(
        CID, boundary=None, tail=stored, last_seq=len(stored), estimator=estimator, **options
    )


# ---- Responses items: read and given back ------------------------------------------------

#: Items as the API and the Agents SDK produce them, one per kind episodic reads, and the
#: built-in tool items it keeps without a model of its own. All are valid Responses input.
ITEMS: dict[str, dict[str, Any]] = {
    "user-text": {"type": "message", "role": "user", "content": "Fix the failing test"},
    "user-no-type": {"role": "user", "content": "an easy input message leaves out its type"},
    "user-parts": {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
            {"type": "input_file", "file_id": "file-1"},
        ],
    },
    "system": {"type": "message", "role": "system", "content": "Be brief."},
    "developer-parts": {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "Be terse."}],
    },
    "assistant-easy": {
        "type": "message",
        "role": "assistant",
        "content": "Running the tests.",
        "phase": "commentary",
    },
    "assistant-output": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {
                "type": "output_text",
                "text": "Done.",
                "annotations": [
                    {
                        "type": "url_citation",
                        "start_index": 0,
                        "end_index": 4,
                        "title": "docs",
                        "url": "https://docs.pytest.org",
                    }
                ],
            }
        ],
    },
    "assistant-refusal": {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "refusal", "refusal": "I can't help with that."}],
    },
    "function-call": {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "run",
        "arguments": '{"cmd":"pytest"}',
        "status": "completed",
    },
    "function-call-invalid-json": {
        "type": "function_call",
        "call_id": "call_2",
        "name": "run",
        "arguments": '{"cmd": "py',
    },
    "function-call-output": {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "1 failed",
    },
    "function-call-output-parts": {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [
            {"type": "input_text", "text": "the screenshot"},
            {"type": "input_image", "image_url": PNG},
        ],
    },
    "reasoning": {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [
            {"type": "summary_text", "text": "Run the tests first."},
            {"type": "summary_text", "text": "Then read the failure."},
        ],
        "encrypted_content": "gAAAAB-opaque",
    },
    "reasoning-encrypted-only": {
        "id": "rs_2",
        "type": "reasoning",
        "summary": [],
        "encrypted_content": "gAAAAB-opaque",
    },
    "web_search_call": {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "pytest fixtures"},
    },
    "file_search_call": {
        "id": "fs_1",
        "type": "file_search_call",
        "queries": ["retry policy"],
        "status": "completed",
        "results": [{"file_id": "file-2", "filename": "retry.md", "score": 0.9, "text": "x"}],
    },
    "computer_call": {
        "id": "cu_1",
        "type": "computer_call",
        "call_id": "call_c",
        "action": {"type": "click", "button": "left", "x": 10, "y": 20},
        "pending_safety_checks": [],
        "status": "completed",
    },
    "computer_call_output": {
        "type": "computer_call_output",
        "call_id": "call_c",
        "output": {"type": "computer_screenshot", "image_url": PNG},
    },
    "mcp_call": {
        "id": "mcp_1",
        "type": "mcp_call",
        "server_label": "docs",
        "name": "search",
        "arguments": '{"q":"fixtures"}',
        "output": "3 pages",
    },
    "item_reference": {"type": "item_reference", "id": "msg_0"},
}
#: A type no SDK knows yet: kept all the same (and so not valid input for today's SDK).
FUTURE_ITEM: dict[str, Any] = {"type": "hologram_call", "id": "h_1", "payload": {"depth": 3}}
ALL_ITEMS = {**ITEMS, "future": FUTURE_ITEM}


@pytest.mark.parametrize("name", sorted(ALL_ITEMS))
def test_responses_round_trip_is_lossless(name: str) -> None:
    item = ALL_ITEMS[name]
    original = copy.deepcopy(item)
    message = Message.from_responses_item(item)
    assert item == original, "from_responses_item must not mutate its input"
    assert message.native == NativePayload(protocol=OPENAI_RESPONSES_PROTOCOL, data=item)
    assert message.to_responses() == [item]
    # and through the stored form, as load_context gives it back
    stored = Message.model_validate_json(orjson.dumps(message.stored_fields()))
    assert stored.to_responses() == [item]


def test_a_run_of_items_round_trips_and_the_sdk_accepts_it() -> None:
    items = [ALL_ITEMS[name] for name in sorted(ALL_ITEMS)]
    messages = [Message.from_responses_item(item) for item in items]
    assert [i for m in messages for i in m.to_responses()] == items
    check_responses([ITEMS[name] for name in sorted(ITEMS)])


def test_a_returned_item_is_a_copy() -> None:
    message = Message.from_responses_item(ITEMS["user-parts"])
    message.to_responses()[0]["content"][0]["text"] = "changed"
    assert message.to_responses() == [ITEMS["user-parts"]]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("user-text", Message.user("Fix the failing test"), id="user-text"),
        pytest.param(
            "user-parts",
            Message.user(
                (
                    TextBlock(text="look"),
                    ImageBlock(url="https://x/y.png", detail="low"),
                    RawBlock(data={"type": "input_file", "file_id": "file-1"}),
                )
            ),
            id="user-parts",
        ),
        pytest.param("developer-parts", Message.system("Be terse."), id="developer-is-system"),
        pytest.param(
            "assistant-output", Message.assistant((TextBlock(text="Done."),)), id="output"
        ),
        pytest.param(
            "assistant-refusal",
            Message.assistant((TextBlock(text="I can't help with that."),)),
            id="refusal-is-text",
        ),
        pytest.param(
            "function-call",
            Message.assistant(
                tool_calls=[ToolCall(id="call_1", name="run", args={"cmd": "pytest"})]
            ),
            id="call-id-is-the-call-id",
        ),
        pytest.param(
            "function-call-invalid-json",
            Message.assistant(
                tool_calls=[ToolCall(id="call_2", name="run", arguments_json='{"cmd": "py')]
            ),
            id="arguments-kept-verbatim",
        ),
        pytest.param(
            "function-call-output", Message.tool_result("call_1", "1 failed"), id="output-text"
        ),
        pytest.param(
            "function-call-output-parts",
            Message.tool_result("call_1", (TextBlock(text="the screenshot"), ImageBlock(url=PNG))),
            id="output-parts",
        ),
        pytest.param(
            "reasoning",
            Message.assistant(reasoning="Run the tests first.\n\nThen read the failure."),
            id="reasoning-summary",
        ),
        pytest.param("reasoning-encrypted-only", Message.assistant(), id="reasoning-opaque"),
    ],
)
def test_items_map_onto_the_model(name: str, expected: Message) -> None:
    message = Message.from_responses_item(ITEMS[name])
    assert message.model_copy(update={"native": None}) == expected


#: The items episodic has no model for.
OTHER_ITEMS = [
    "computer_call",
    "computer_call_output",
    "file_search_call",
    "future",
    "item_reference",
    "mcp_call",
    "web_search_call",
]


@pytest.mark.parametrize("name", OTHER_ITEMS)
def test_other_items_are_kept_as_readable_text(name: str) -> None:
    item = ALL_ITEMS[name]
    message = Message.from_responses_item(item)
    assert message.role == "assistant"
    assert not message.tool_calls
    kind, _, body = message.text.partition(" ")
    assert kind == f"[{item['type']}]"
    assert orjson.loads(body) == {k: v for k, v in item.items() if k != "type"}


def test_a_long_item_is_cut_for_reading_and_kept_whole() -> None:
    image = {"type": "image_generation_call", "id": "ig_1", "status": "completed"}
    image["result"] = "iVBORw0KGgo" * 100_000
    message = Message.from_responses_item(image)
    assert len(message.text) == RENDERED_ITEM_CHARS
    assert message.text.startswith('[image_generation_call] {"id":"ig_1"')
    assert message.text.endswith("…")
    assert message.to_responses() == [image]


def test_function_calls_pair_with_their_outputs_by_call_id() -> None:
    # The output arrives after a new user turn, as it does when a run is interrupted: the
    # context moves it up to its call, so the items answer each call right after it.
    items = [
        {"type": "message", "role": "user", "content": "Fix it"},
        {"type": "function_call", "call_id": "call_a", "name": "run", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_b", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_b", "output": "source"},
        {"type": "message", "role": "user", "content": "meanwhile"},
        {"type": "function_call_output", "call_id": "call_a", "output": "1 failed"},
    ]
    context = context_of([Message.from_responses_item(item) for item in items])
    assert context.to_responses() == [items[0], items[1], items[5], items[2], items[3], items[4]]
    check_responses(context.to_responses())


def test_a_call_with_no_output_gets_the_missing_result() -> None:
    call = {"type": "function_call", "call_id": "call_a", "name": "run", "arguments": "{}"}
    context = context_of([Message.user("go"), Message.from_responses_item(call)])
    assert context.to_responses()[-1] == {
        "type": "function_call_output",
        "call_id": "call_a",
        "output": MISSING_RESULT_TEXT,
    }


# ---- Responses items: built from episodic's own messages -------------------------------

RUN = ToolCall(id="call_1", name="run", args={"cmd": "pytest"})
READ = ToolCall(id="call_2", name="read", arguments_json='{"path": "a.py"}')


@pytest.mark.parametrize(
    ("message", "items"),
    [
        pytest.param(
            Message.user("hi"), [{"type": "message", "role": "user", "content": "hi"}], id="user"
        ),
        pytest.param(
            Message.user(
                (
                    TextBlock(text="look"),
                    ImageBlock(url="https://x/y.png", alt="a chart"),
                    ImageBlock(url=PNG, detail="high"),
                    RawBlock(data={"type": "file", "file": {"file_id": "file-1"}}),
                    RawBlock(
                        data={"type": "input_audio", "input_audio": {"data": "", "format": "mp3"}}
                    ),
                )
            ),
            [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
                        {"type": "input_image", "image_url": PNG, "detail": "high"},
                        {"type": "input_file", "file_id": "file-1"},
                        {"type": "input_text", "text": "[input_audio]"},
                    ],
                }
            ],
            id="user-blocks",
        ),
        pytest.param(
            Message.assistant("Running both.", tool_calls=[RUN, READ], reasoning="private"),
            [
                {"type": "message", "role": "assistant", "content": "Running both."},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "run",
                    "arguments": '{"cmd":"pytest"}',
                },
                {
                    "type": "function_call",
                    "call_id": "call_2",
                    "name": "read",
                    "arguments": '{"path": "a.py"}',
                },
            ],
            id="assistant-text-and-calls",
        ),
        pytest.param(
            Message.assistant(None, tool_calls=[RUN]),
            [
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "run",
                    "arguments": '{"cmd":"pytest"}',
                }
            ],
            id="assistant-calls-only",
        ),
        pytest.param(
            Message.assistant((TextBlock(text="a"), TextBlock(text="b"))),
            [{"type": "message", "role": "assistant", "content": "a\nb"}],
            id="assistant-blocks",
        ),
        pytest.param(
            Message.tool_result("call_1", "1 failed", name="run", is_error=True),
            [{"type": "function_call_output", "call_id": "call_1", "output": "1 failed"}],
            id="tool-result",
        ),
        pytest.param(
            Message.tool_result("call_1", (TextBlock(text="see"), ImageBlock(url=PNG))),
            [
                {
                    "type": "function_call_output",
                    "call_id": "call_1",
                    "output": [
                        {"type": "input_text", "text": "see"},
                        {"type": "input_image", "image_url": PNG, "detail": "auto"},
                    ],
                }
            ],
            id="tool-result-blocks",
        ),
        pytest.param(
            Message.system("Be brief."),
            [{"type": "message", "role": "system", "content": "Be brief."}],
            id="system",
        ),
        pytest.param(
            Message.from_openai({"role": "developer", "content": "Be terse."}),
            [{"type": "message", "role": "developer", "content": "Be terse."}],
            id="developer-from-chat-completions",
        ),
    ],
)
def test_messages_become_items(message: Message, items: list[dict[str, Any]]) -> None:
    assert message.to_responses() == items
    check_responses(items)


def test_a_message_changed_since_it_was_read_is_built_from_its_fields() -> None:
    # compose_context caps a long tool result with model_copy, which keeps native: the capped
    # text is what must go, not the item's original output.
    output = {"type": "function_call_output", "call_id": "call_1", "output": "x" * 5_000}
    call = {"type": "function_call", "call_id": "call_1", "name": "run", "arguments": "{}"}
    tail = [Message.user("go"), *(Message.from_responses_item(i) for i in (call, output))]
    context = context_of(tail, max_tool_result_tokens=20)
    sent = context.to_responses()[-1]
    assert sent["call_id"] == "call_1"
    assert sent["output"] == context.messages[-1].content
    assert len(sent["output"]) < 200
    # unchanged, it is given back as it came
    assert context_of(tail).to_responses()[-1] == output


def test_a_context_sends_output_items_without_the_ids_of_missing_reasoning() -> None:
    # A loaded context never holds reasoning items (turns without text are left out), and the
    # API refuses output ids whose reasoning is not sent: those ids go, the content stays.
    names = ["user-text", "reasoning", "function-call", "function-call-output", "assistant-output"]
    tail = [Message.from_responses_item(ITEMS[name]) for name in names]
    context = context_of(tail)
    call = {k: v for k, v in ITEMS["function-call"].items() if k != "id"}
    assert context.to_responses() == [
        ITEMS["user-text"],
        call,
        ITEMS["function-call-output"],
        {"type": "message", "role": "assistant", "content": "Done."},
    ]
    check_responses(context.to_responses())
    phased = {**ITEMS["assistant-output"], "phase": "final_answer"}
    assert messages_to_responses([Message.from_responses_item(phased)]) == [
        {"type": "message", "role": "assistant", "content": "Done.", "phase": "final_answer"}
    ]
    # With the reasoning item in the list, every item goes as it came.
    assert messages_to_responses(tail) == [ITEMS[name] for name in names]


# ---- Responses items: refusals -----------------------------------------------------------


class _SdkObject:
    """Stands for an SDK item object (a pydantic model, not a mapping)."""


@pytest.mark.parametrize(
    ("item", "field", "words"),
    [
        pytest.param([{"type": "message"}], None, "must be a mapping", id="list"),
        pytest.param("hi", None, "must be a mapping", id="str"),
        pytest.param(None, None, "must be a mapping", id="none"),
        pytest.param(_SdkObject(), None, "model_dump(exclude_unset=True)", id="sdk-object"),
        pytest.param({}, "type", "needs a type", id="empty"),
        pytest.param({"type": 3}, "type", "needs a type", id="type-not-text"),
        pytest.param({"type": ""}, "type", "needs a type", id="type-empty"),
        pytest.param(
            {"type": "function_call", "name": "run", "arguments": "{}"},
            "call_id",
            "needs its call_id",
            id="call-without-call-id",
        ),
        pytest.param(
            {"type": "function_call", "call_id": "", "name": "run", "arguments": "{}"},
            "call_id",
            "needs its call_id",
            id="call-with-empty-call-id",
        ),
        pytest.param(
            {"type": "function_call", "call_id": 7, "name": "run", "arguments": "{}"},
            "call_id",
            "needs its call_id",
            id="call-with-int-call-id",
        ),
        pytest.param(
            {"type": "function_call", "call_id": "c", "arguments": "{}"},
            "name",
            "function's name",
            id="call-without-name",
        ),
        pytest.param(
            {"type": "function_call", "call_id": "c", "name": "run", "arguments": 5},
            "arguments",
            "JSON string",
            id="call-with-int-arguments",
        ),
        pytest.param(
            {"type": "function_call", "call_id": "c" * 600, "name": "run", "arguments": "{}"},
            "tool_calls",
            "tool_calls[0].id",
            id="call-id-too-long",
        ),
        pytest.param(
            {"type": "function_call_output", "output": "ok"},
            "call_id",
            "call_id of the function_call",
            id="output-without-call-id",
        ),
        pytest.param(
            {"type": "function_call_output", "call_id": "c"},
            "output",
            "needs its output",
            id="output-missing",
        ),
        pytest.param(
            {"type": "function_call_output", "call_id": "c", "output": 5},
            "output",
            "needs its output",
            id="output-int",
        ),
        pytest.param(
            {"type": "function_call_output", "call_id": "c", "output": ["ok"]},
            "output",
            "must be an object",
            id="output-part-not-object",
        ),
        pytest.param(
            {"type": "message", "role": "tool", "content": "x"},
            "role",
            "unknown message role",
            id="message-tool-role",
        ),
        pytest.param({"content": "x", "type": "message"}, "role", "role", id="message-no-role"),
        pytest.param(
            {"type": "message", "role": "user"}, "content", "string or a list", id="no-content"
        ),
        pytest.param(
            {"type": "message", "role": "user", "content": 5},
            "content",
            "string or a list",
            id="int-content",
        ),
        pytest.param(
            {"type": "reasoning", "id": "rs", "summary": "thinking"},
            "summary",
            "must be a list",
            id="reasoning-summary-not-list",
        ),
        pytest.param(
            {"type": "web_search_call", "id": "ws", "action": {"tags": {1, 2}}},
            "native",
            "JSON values only",
            id="unknown-with-a-set",
        ),
        pytest.param(
            {"type": "web_search_call", "id": "ws", "score": float("nan")},
            "native",
            "NaN",
            id="unknown-with-nan",
        ),
    ],
)
def test_from_responses_item_refuses_what_is_not_an_item(
    item: Any, field: str | None, words: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Message.from_responses_item(item)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_the_responses_sdk_type_refuses_a_broken_item() -> None:
    """So that passing check_responses means something: wrong shapes, at the top and inside
    a part (validated lazily by pydantic, so only a check that drains it sees them)."""
    good: list[dict[str, Any]] = [ITEMS["function-call"], ITEMS["user-parts"]]
    check_responses(good)
    broken = [
        [{"type": "function_call", "call_id": "c", "name": "run"}],  # no arguments
        [{"type": "message", "role": "bot", "content": "hi"}],
        [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text"}]}],
        [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}],
        [{"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text"}]}],
    ]
    for items in broken:
        with pytest.raises(pydantic.ValidationError):
            check_responses(items)


# ---- Anthropic -------------------------------------------------------------------------


def _call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="run", args={"cmd": call_id})


def test_to_anthropic_merges_turns_and_answers_each_call_in_the_next_turn() -> None:
    context = context_of(
        [
            Message.user("go"),
            Message.assistant("Running both.", tool_calls=[_call("a"), _call("b")]),
            Message.tool_result("b", "B", name="run"),
            Message.user("also this"),  # before a's result: the context moves the result up
            Message.tool_result("a", "A failed", name="run", is_error=True),
            Message.assistant("Done."),
            Message.user("thanks"),
            Message.user("bye"),
        ]
    )
    assert context.to_anthropic() == [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Running both."},
                {"type": "tool_use", "id": "a", "name": "run", "input": {"cmd": "a"}},
                {"type": "tool_use", "id": "b", "name": "run", "input": {"cmd": "b"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "a",
                    "content": "A failed",
                    "is_error": True,
                },
                {"type": "tool_result", "tool_use_id": "b", "content": "B"},
                {"type": "text", "text": "also this"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "thanks"}, {"type": "text", "text": "bye"}],
        },
    ]
    check_anthropic(context.to_anthropic())


def test_to_anthropic_answers_a_call_with_no_result_with_the_missing_result() -> None:
    context = context_of([Message.user("go"), Message.assistant(None, tool_calls=[_call("a")])])
    assert context.to_anthropic()[-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "a",
                "content": MISSING_RESULT_TEXT,
                "is_error": True,
            }
        ],
    }


def test_to_anthropic_consecutive_calls_stay_in_separate_assistant_turns() -> None:
    # two call groups in a row: each tool_use turn is answered before the next one starts
    turns = context_of(
        [
            Message.user("go"),
            Message.assistant(None, tool_calls=[_call("a")]),
            Message.tool_result("a", "A"),
            Message.assistant(None, tool_calls=[_call("b")]),
            Message.tool_result("b", "B"),
        ]
    ).to_anthropic()
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert [b["type"] for t in turns for b in t["content"]] == [
        "text",
        "tool_use",
        "tool_result",
        "tool_use",
        "tool_result",
    ]


@pytest.mark.parametrize(
    ("messages", "turns"),
    [
        pytest.param(
            [
                Message.user(
                    (
                        TextBlock(text="look"),
                        ImageBlock(url=PNG),
                        ImageBlock(url="https://x/y.jpg", detail="low"),
                        ImageBlock(url="data:image/svg+xml;base64,PHN2Zz4=", alt="a diagram"),
                        ImageBlock(url="file:///tmp/a.png"),
                        RawBlock(data={"type": "input_audio", "input_audio": {"data": ""}}),
                    )
                )
            ],
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "iVBORw0KGgo=",
                            },
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://x/y.jpg"}},
                        {"type": "text", "text": "a diagram"},
                        {"type": "text", "text": "[image]"},
                        {"type": "text", "text": "[input_audio]"},
                    ],
                }
            ],
            id="images",
        ),
        pytest.param(
            [
                Message.user("go"),
                Message.assistant((TextBlock(text="here"), ImageBlock(url=PNG, alt="a plot"))),
            ],
            [
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "here"},
                        {"type": "text", "text": "a plot"},
                    ],
                },
            ],
            id="no-image-in-an-assistant-turn",
        ),
        pytest.param(
            [
                Message.system("Be brief."),
                Message.user("go"),
                Message.assistant(reasoning="only thinking"),
                Message.assistant(" \n"),
                Message.user(""),
                Message.user("again"),
            ],
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "go"}, {"type": "text", "text": "again"}],
                }
            ],
            id="blank-and-system-left-out",
        ),
        pytest.param(
            [
                Message.user("go"),
                Message.assistant(None, tool_calls=[_call("a")]),
                Message.tool_result(
                    "a", (TextBlock(text="see"), TextBlock(text=""), ImageBlock(url=PNG))
                ),
            ],
            [
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "a", "name": "run", "input": {"cmd": "a"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "a",
                            "content": [
                                {"type": "text", "text": "see"},
                                {
                                    "type": "image",
                                    "source": {
                                        "type": "base64",
                                        "media_type": "image/png",
                                        "data": "iVBORw0KGgo=",
                                    },
                                },
                            ],
                        }
                    ],
                },
            ],
            id="tool-result-blocks",
        ),
    ],
)
def test_to_anthropic_blocks(messages: list[Message], turns: list[dict[str, Any]]) -> None:
    assert messages_to_anthropic(messages) == turns
    check_anthropic(turns)


def test_tool_use_ids_the_api_refuses_are_rewritten_the_same_for_call_and_result() -> None:
    odd = "functions.search:0"
    turns = context_of(
        [
            Message.user("go"),
            Message.assistant(None, tool_calls=[_call(odd), _call("call_ok-1")]),
            Message.tool_result(odd, "found"),
            Message.tool_result("call_ok-1", "ok"),
        ]
    ).to_anthropic()
    uses = [b["id"] for b in turns[1]["content"]]
    results = [b["tool_use_id"] for b in turns[2]["content"]]
    assert uses == results == [tool_use_id(odd), "call_ok-1"]
    assert tool_use_id(odd).startswith("functions_search_0_")
    assert tool_use_id(odd) != tool_use_id("functions.search.0")
    check_anthropic(turns)


def test_to_anthropic_from_responses_items() -> None:
    names = ["user-text", "reasoning", "function-call", "function-call-output", "web_search_call"]
    turns = context_of([Message.from_responses_item(ITEMS[n]) for n in names]).to_anthropic()
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "run", "input": {"cmd": "pytest"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "1 failed"}],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "text",
                    "text": Message.from_responses_item(ITEMS["web_search_call"]).text,
                }
            ],
        },
    ]
    check_anthropic(turns)


def test_the_anthropic_sdk_type_refuses_a_broken_turn() -> None:
    """So that passing check_anthropic means something, inside lazily validated blocks too."""
    check_anthropic([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    broken: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": [{"type": "tool_result"}]}],  # no tool_use_id
        [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "input": "{}"}]}],
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/svg+xml", "data": ""},
                    }
                ],
            }
        ],
        [
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text"}]}
                ],
            }
        ],
        [{"role": "robot", "content": "hi"}],
    ]
    for turns in broken:
        with pytest.raises(pydantic.ValidationError):
            check_anthropic(turns)


# ---- property: any message's items and turns pass the SDK types ------------------------

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
IDS = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=20)
BLOCKS = st.lists(
    st.one_of(
        TEXT.map(lambda t: TextBlock(text=t)),
        st.sampled_from([PNG, "https://x/y.png", "data:image/tiff;base64,AA=="]).map(
            lambda u: ImageBlock(url=u)
        ),
        st.just(RawBlock(data={"type": "input_audio", "input_audio": {"data": ""}})),
    ),
    max_size=3,
).map(tuple)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """A user turn, then assistant turns whose calls are answered right after them."""
    out = [Message.user(draw(TEXT | BLOCKS))]
    for _ in range(draw(st.integers(0, 4))):
        ids = draw(st.lists(IDS, max_size=3, unique=True))
        calls = [ToolCall(id=i, name="run", args={"t": draw(TEXT)}) for i in ids]
        out.append(Message.assistant(draw(st.none() | TEXT | BLOCKS), tool_calls=calls))
        results = draw(st.permutations(ids))
        out += [
            Message.tool_result(i, draw(TEXT | BLOCKS), is_error=draw(st.booleans()))
            for i in results
        ]
        if draw(st.booleans()):
            out.append(Message.user(draw(TEXT | BLOCKS)))
    return out


@settings(max_examples=150, deadline=None)
@given(conversations())
def test_any_context_passes_the_sdk_types(messages: list[Message]) -> None:
    context = context_of(messages)
    check_responses(context.to_responses())
    turns = context.to_anthropic()
    check_anthropic(turns)
    assert anthropic_turn_violations(turns) == []


# ---- the moved conversions: the models and Context delegate ----------------------------


def test_chat_completions_conversions_are_the_formats_module() -> None:
    message = Message.assistant("x", tool_calls=[RUN], reasoning="r")
    assert message.to_openai(include_reasoning=True) == openai_chat.message_to_openai(
        message, include_reasoning=True
    )
    data = {"role": "developer", "content": "Be terse.", "refusal": None}
    assert Message.from_openai(data) == openai_chat.message_from_openai(data)
    assert Message.from_openai(data).native == NativePayload(
        protocol=OPENAI_CHAT_PROTOCOL, data={"role": "developer", "refusal": None}
    )
    assert episodic.messages_from_openai is openai_chat.messages_from_openai
    items = [message.to_openai(), Message.tool_result("call_1", "ok").to_openai()]
    assert episodic.messages_from_openai(items)[1].name == "run"
    context = context_of([Message.user("go"), message, Message.tool_result("call_1", "ok")])
    assert context.to_openai() == [m.to_openai() for m in context.messages]


@pytest.mark.parametrize(
    ("arguments", "args", "arguments_json"),
    [
        pytest.param('{"a":1}', {"a": 1}, None, id="canonical"),
        pytest.param('{"a": 1}', {"a": 1}, '{"a": 1}', id="spaced-kept"),
        pytest.param('{"a": ', {}, '{"a": ', id="invalid-kept"),
        pytest.param("[1]", {}, "[1]", id="not-an-object-kept"),
        pytest.param("", {}, "", id="empty-kept"),
        pytest.param({"a": 1}, {"a": 1}, None, id="object"),
    ],
)
def test_parse_arguments(arguments: Any, args: dict[str, Any], arguments_json: str | None) -> None:
    assert openai_chat.parse_arguments(arguments) == (args, arguments_json)


def test_to_cliver_is_the_formats_module() -> None:
    require_extra("cliver_core", "cliver")
    context = context_of([Message.user("go"), Message.assistant(None, tool_calls=[RUN])])
    mine = context.to_cliver()
    theirs = messages_to_cliver(context.conversation_id, context.messages)
    assert [(m.id, m.role, m.native) for m in mine] == [(m.id, m.role, m.native) for m in theirs]
    assert [m.id for m in mine] == [f"{CID}:1", f"{CID}:2", f"{CID}:synthetic:2"]
    assert mine[1].native == context.messages[1].to_openai()


def test_to_cliver_without_cliver_core_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cliver_core", None)  # import fails as if not installed
    with pytest.raises(ConfigurationError, match=r"episodic-store\[cliver\]"):
        context_of([Message.user("go")]).to_cliver()
