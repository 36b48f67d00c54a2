"""The messages the benchmarks write: ~400-character texts, and a history in which every fifth
turn is a tool call with its result (user, assistant+call, tool result, assistant)."""

from __future__ import annotations

import random

from episodic import Message, ToolCall

TEXT_CHARS = 400
_PROSE = (
    "the test suite fails on the migration step because the advisory lock is taken twice "
    "please check the connection pool settings and rerun pytest with verbose output then "
    "summarize what changed in the schema since yesterday and which files were touched"
)
_WORDS = _PROSE.split()


def texts(count: int = 64, seed: int = 7) -> list[str]:
    """``count`` distinct texts of exactly ``TEXT_CHARS`` characters."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = [f"[{i}]"]
        while sum(len(w) + 1 for w in words) < TEXT_CHARS:
            words.append(rng.choice(_WORDS))
        out.append(" ".join(words)[:TEXT_CHARS])
    return out


TEXTS = texts()


def text(i: int) -> str:
    return TEXTS[i % len(TEXTS)]


class History:
    """An endless conversation, handed out in chunks that each end at a safe cut (no tool call
    waits for its result after the chunk)."""

    def __init__(self, name: str = "h") -> None:
        self._name = name
        self._turn = 0
        self._i = 0

    def _next_turn_len(self) -> int:
        return 4 if (self._turn + 1) % 5 == 0 else 2

    def _turn_messages(self) -> list[Message]:
        self._turn += 1
        self._i += 1
        i = self._i
        if self._turn % 5:
            return [Message.user(text(i)), Message.assistant(text(i + 1))]
        call_id = f"{self._name}-call-{self._turn}"
        return [
            Message.user(text(i)),
            Message.assistant(
                None, tool_calls=[ToolCall(id=call_id, name="run", args={"cmd": "pytest -x"})]
            ),
            Message.tool_result(call_id, text(i + 2), name="run"),
            Message.assistant(text(i + 3)),
        ]

    def take(self, n: int) -> list[Message]:
        """Exactly ``n`` messages ending at a safe cut (padded with user messages if a tool
        turn would not fit)."""
        out: list[Message] = []
        while len(out) + self._next_turn_len() <= n:
            out.extend(self._turn_messages())
        while len(out) < n:
            self._i += 1
            out.append(Message.user(text(self._i)))
        return out
