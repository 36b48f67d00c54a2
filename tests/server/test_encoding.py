"""The hot routes' answers, encoded straight to bytes, are the JSON FastAPI made of the same
values through their response models: the same members, values and order, in every format."""

from __future__ import annotations

import json
from typing import Any, get_args

from episodic import EpisodicStore, Message, ToolCall
from episodic.models import ImageBlock, NativePayload, RawBlock, TextBlock
from episodic.server.encoding import context_answer, json_answer
from episodic.server.schemas import Appended, ContextFormat, LoadedContext

MESSAGES = [
    Message.user('plain text, with ünïcode and "quotes" and a \\ backslash', name="ana"),
    Message.assistant(
        "calling two tools",
        tool_calls=[
            ToolCall(id="c1", name="read", args={"path": "/etc/hosts", "n": 1.5, "on": True}),
            ToolCall(id="c2", name="odd", args={}, arguments_json="{not json"),
        ],
    ),
    Message.tool_result("c1", "127.0.0.1 localhost", name="read"),
    Message.tool_result("c2", "bad arguments", is_error=True),
    Message.user(
        (
            TextBlock(text="see this"),
            ImageBlock(url="https://example.com/a.png", alt="a chart"),
            RawBlock(data={"type": "custom", "nested": {"list": [1, None, "x"]}}),
        ),
        metadata={"source": "test", "tags": ["a", "b"], "none": None, "deep": {"x": None}},
    ),
    Message.user((RawBlock(data={"a": None, "l": [None, 2**62, -1.25e-7]}),)),
    Message.assistant(
        "with its native form",
        native=NativePayload(protocol="test", data={"id": "x", "n": None}),
        reasoning="thought",
        client_id="c-1",
    ),
    Message.assistant("done"),
]


def _as_fastapi_made_it(context: Any, format: ContextFormat) -> Any:
    """What the route answered before: each message dumped to a dict, then the model."""
    if format == "openai":
        rendered = context.to_openai()
    elif format == "responses":
        rendered = context.to_responses()
    elif format == "anthropic":
        rendered = context.to_anthropic()
    else:
        rendered = [m.model_dump(mode="json", exclude_none=True) for m in context.messages]
    return LoadedContext(
        conversation_id=context.conversation_id,
        format=format,
        messages=rendered,
        estimated_tokens=context.estimated_tokens,
        last_seq=context.last_seq,
        boundary_seq=context.boundary_seq,
    ).model_dump(mode="json")


async def test_a_context_encodes_as_its_loaded_context_in_every_format(
    store: EpisodicStore,
) -> None:
    cid = await store.create_conversation()
    await store.append(cid, MESSAGES)
    context = await store.load_context(cid)
    for format in get_args(ContextFormat):
        answer = context_answer(context, format, headers={"ETag": '"6"'})
        assert answer.media_type == "application/json"
        assert answer.headers["etag"] == '"6"'
        # parsed as pairs: the members' order is kept too
        got = json.loads(bytes(answer.body), object_pairs_hook=list)
        want = json.loads(json.dumps(_as_fastapi_made_it(context, format)), object_pairs_hook=list)
        assert got == want, format


async def test_an_append_encodes_as_its_appended_model(store: EpisodicStore) -> None:
    cid = await store.create_conversation()
    events = await store.append(cid, MESSAGES)
    model = Appended(events=list(events), last_seq=events[-1].seq)
    answer = json_answer(
        Appended.model_construct(events=list(events), last_seq=events[-1].seq), status_code=201
    )
    assert answer.status_code == 201
    assert json.loads(bytes(answer.body)) == model.model_dump(mode="json")
