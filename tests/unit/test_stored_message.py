"""A stored message's JSON, spliced from its payload, is its model's dump without nulls, also
for a payload not in the store's own form (an import keeps a file's payload as it was)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from pydantic_core import to_json

from episodic.store.codec import StoredMessage

NOW = datetime(2026, 12, 5, 3, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "user", "content": "hello"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "name": "run", "args": {}}],
        },
        {"role": "assistant", "content": "x", "name": None, "reasoning": None},
        {"role": "user", "content": [{"type": "image", "url": "u", "detail": None, "alt": None}]},
        {
            "role": "assistant",
            "tool_calls": [{"id": "a", "name": "r", "args": {}, "arguments_json": None}],
        },
        {"role": "user", "content": "stray", "seq": 99, "token_estimate": 1},
        {"role": "user", "content": "unknown key", "no_such_field": 1},
        {"role": "tool", "tool_call_id": "a", "content": "out", "metadata": {"k": None}},
    ],
)
def test_the_spliced_json_is_the_models_dump(payload: dict[str, object]) -> None:
    view = StoredMessage(orjson.dumps(payload).decode(), 3, NOW, to_json(NOW).decode(), 7)
    dumped = view.message().model_dump(mode="json", exclude_none=True)
    assert orjson.loads(view.episodic_json()) == dumped
    assert dumped["seq"] == 3
