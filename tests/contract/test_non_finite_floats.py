"""NaN and infinity are refused before any SQL, on PostgreSQL and SQLite: orjson would have
stored them as null, silently changing what the caller gave."""

from __future__ import annotations

from typing import Any

import pytest

from episodic import EpisodicStore, Message, ValidationError
from episodic.models import NativePayload, RawBlock, ToolCall
from tests.support import snapshot

NAN = float("nan")
INF = float("inf")


@pytest.mark.parametrize(
    ("metadata", "path"),
    [
        ({"score": NAN}, "metadata.score"),
        ({"weights": [0.5, INF]}, "metadata.weights[1]"),
        ({"model": {"temperature": -INF}}, "metadata.model.temperature"),
    ],
)
async def test_conversation_metadata_refuses_nan_and_infinity(
    store: EpisodicStore, database_url: str, metadata: dict[str, Any], path: str
) -> None:
    before = await snapshot(database_url)
    with pytest.raises(ValidationError, match="JSON has no NaN or infinity") as caught:
        await store.create_conversation(metadata=metadata)
    assert str(caught.value).startswith(f"{path} is ")
    assert caught.value.field == path
    assert await snapshot(database_url) == before


def _unvalidated(**fields: Any) -> Message:
    """A message built without validation (which refuses NaN), as buggy caller code can."""
    return Message.model_construct(**{"role": "user", "content": "x", **fields})


CARRIERS: list[Any] = [
    pytest.param(
        _unvalidated(
            role="assistant",
            content=None,
            tool_calls=(ToolCall.model_construct(id="c1", name="f", args={"x": NAN}),),
        ),
        "messages[1].tool_calls[0].args.x",
        id="args",
    ),
    pytest.param(_unvalidated(metadata={"m": [INF]}), "messages[1].metadata.m[0]", id="metadata"),
    pytest.param(
        _unvalidated(native=NativePayload.model_construct(protocol="p", data={"lp": -INF})),
        "messages[1].native.data.lp",
        id="native-data",
    ),
    pytest.param(
        _unvalidated(content=(RawBlock.model_construct(type="raw", data={"type": "a", "s": NAN}),)),
        "messages[1].content[0].data.s",
        id="raw-block",
    ),
]


@pytest.mark.parametrize(("message", "path"), CARRIERS)
async def test_append_refuses_nan_and_infinity(
    store: EpisodicStore, database_url: str, message: Message, path: str
) -> None:
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("first")])
    before = await snapshot(database_url)
    with pytest.raises(ValidationError, match="JSON has no NaN or infinity") as caught:
        await store.append(conv, [Message.user("ok"), message])
    assert str(caught.value).startswith(f"{path} is ")
    assert caught.value.field == path
    assert await snapshot(database_url) == before


async def test_finite_floats_and_nulls_round_trip(store: EpisodicStore) -> None:
    metadata = {"t": 0.7, "none": None, "huge": 1e308, "tiny": -5e-324}
    conv = await store.create_conversation(metadata=metadata)
    assert (await store.get_conversation(conv)).metadata == metadata
    message = Message.assistant(
        None,
        tool_calls=[ToolCall(id="c1", name="f", args={"x": 1.5, "y": None})],
        metadata={"n": None, "f": -0.0},
    )
    [event] = await store.append(conv, [message])
    [back] = await store.read_events(conv)
    assert back == event
    assert back.message.tool_calls[0].args == {"x": 1.5, "y": None}
