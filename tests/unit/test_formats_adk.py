"""Google ADK events as the log's messages (episodic/formats/adk.py), with ADK's own classes:
every event comes back equal to what went in, bytes included; calls and responses pair by
id; each kind of event has the role, text and calls episodic's rules need."""

from __future__ import annotations

import json
from typing import Any

import pytest

from episodic.errors import ValidationError
from episodic.formats.adk import ADK_EVENT_PROTOCOL, adk_events_of, messages_from_adk_event
from episodic.models import Message
from tests.support import require_extra

require_extra("google.adk", "adk")
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.genai import types  # noqa: E402


def as_json(event: Event) -> dict[str, Any]:
    return json.loads(event.model_dump_json())  # type: ignore[no-any-return]


def round_trip(event: Event) -> tuple[list[Message], Event]:
    messages = messages_from_adk_event(as_json(event))
    (back,) = [Event.model_validate_json(json.dumps(e)) for e in adk_events_of(messages)]
    return messages, back


def text(role: str, *texts: str, **parts: Any) -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=t, **parts) for t in texts])


def test_a_users_message_with_bytes_round_trips_and_renders_without_them() -> None:
    event = Event(
        author="user",
        invocation_id="inv-1",
        content=types.Content(
            role="user",
            parts=[
                types.Part(text="What is in this picture?"),
                types.Part(
                    inline_data=types.Blob(data=b"\x89PNG" + bytes(1_000), mime_type="image/png"),
                    media_resolution=types.PartMediaResolution(level="MEDIA_RESOLUTION_LOW"),
                ),
            ],
        ),
    )
    (message,), back = round_trip(event)
    assert back == event
    assert message.role == "user"
    assert message.text.startswith("What is in this picture?\n[inline_data]")
    assert "<1,004 bytes>" in message.text
    assert "iVBOR" not in message.text
    assert message.native is not None
    assert message.native.protocol == ADK_EVENT_PROTOCOL


def test_a_model_turn_has_its_text_thoughts_and_calls() -> None:
    event = Event(
        author="researcher",
        invocation_id="inv-1",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text="Let me look both up.", thought=True),
                types.Part(text="Looking them up."),
                types.Part(function_call=types.FunctionCall(id="c1", name="f", args={"q": 1})),
                types.Part(function_call=types.FunctionCall(id="c2", name="g", args={})),
            ],
        ),
    )
    (message,), back = round_trip(event)
    assert back == event
    assert (message.role, message.text, message.reasoning) == (
        "assistant",
        "Looking them up.",
        "Let me look both up.",
    )
    assert [(c.id, c.name, c.args) for c in message.tool_calls] == [
        ("c1", "f", {"q": 1}),
        ("c2", "g", {}),
    ]


def test_merged_function_responses_are_one_result_each_and_one_event() -> None:
    event = Event(
        author="researcher",
        invocation_id="inv-1",
        content=types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(id=i, name=n, response={"r": i})
                )
                for i, n in (("c1", "f"), ("c2", "g"))
            ],
        ),
    )
    messages, back = round_trip(event)
    assert back == event
    assert [(m.role, m.tool_call_id, m.name, m.text) for m in messages] == [
        ("tool", "c1", "f", '{"r":"c1"}'),
        ("tool", "c2", "g", '{"r":"c2"}'),
    ]
    assert messages[1].native is None  # the event is kept once, in the first


@pytest.mark.parametrize(
    "event",
    [
        Event(author="user", actions=EventActions(state_delta={"user:name": "ada", "k": None})),
        Event(author="agent", actions=EventActions(transfer_to_agent="other", escalate=True)),
        Event(author="agent", content=types.Content(role="model", parts=[])),
    ],
    ids=["state-only", "actions-only", "no-parts"],
)
def test_an_event_without_content_is_neither_a_turn_nor_an_answer(event: Event) -> None:
    (message,), back = round_trip(event)
    assert back == event
    assert (message.role, message.content, message.tool_calls) == ("assistant", None, ())


def test_a_complete_event_round_trips_exactly() -> None:
    event = Event(
        author="agent",
        invocation_id="inv-9",
        branch="root.child",
        timestamp=1700000000.123,
        content=text("model", "done"),
        partial=False,
        turn_complete=True,
        interrupted=False,
        error_code="E1",
        error_message="none really",
        long_running_tool_ids={"c9"},
        custom_metadata={"trace": [1, 2, {"x": None}]},
        usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=12),
        grounding_metadata=types.GroundingMetadata(web_search_queries=["q"]),
        actions=EventActions(
            state_delta={"app:x": {"a": 1}, "temp:y": 2},
            artifact_delta={"file.txt": 3},
            transfer_to_agent="other",
            escalate=True,
        ),
    )
    _, back = round_trip(event)
    assert back == event
    assert back.model_dump_json() == event.model_dump_json()


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ("not an event", None),
        ({"author": "a", "content": "text"}, "content"),
        ({"author": "a", "content": {"role": "model", "parts": ["x"]}}, "parts"),
        (
            {"author": "a", "content": {"role": "model", "parts": [{"function_call": {}}]}},
            None,
        ),
        (
            {
                "author": "a",
                "content": {"parts": [{"function_call": {"id": "c1", "name": "f", "args": 3}}]},
            },
            "args",
        ),
        (
            {"author": "a", "content": {"parts": [{"function_response": {"name": "f"}}]}},
            "function_response.id",
        ),
        (
            {"author": "a", "content": {"parts": [{"functionCall": {"id": "c", "name": "f"}}]}},
            "parts",
        ),
    ],
    ids=[
        "str",
        "content-str",
        "part-str",
        "call-empty",
        "args-int",
        "response-without-id",
        "by-alias",
    ],
)
def test_what_is_not_an_events_json_is_refused_naming_the_field(
    event: Any, field: str | None
) -> None:
    with pytest.raises(ValidationError) as refused:
        messages_from_adk_event(event)
    if field is not None:
        assert refused.value.field == field


def test_a_call_without_an_id_is_refused_saying_why() -> None:
    event = {"author": "a", "content": {"parts": [{"function_call": {"name": "f"}}]}}
    with pytest.raises(ValidationError, match="needs its id"):
        messages_from_adk_event(event)
