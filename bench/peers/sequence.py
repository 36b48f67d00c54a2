"""The one conversation every store writes: message ``i`` is fixed by ``i`` alone.

Turns are (user, assistant); every fifth turn is (user, assistant tool call, tool result,
assistant), so the sequence repeats every 12 messages and every even index starts a pair
(user/assistant, user/tool call, or tool result/assistant). Texts are the ~400-character ones
of ``bench.workload``.
"""

from __future__ import annotations

from typing import Literal

from bench.workload import text

Kind = Literal["user", "assistant", "call", "result"]
CYCLE = 12
TOOL = "run"
ARGS = {"cmd": "pytest -x"}
ARGS_JSON = '{"cmd": "pytest -x"}'


def kind(i: int) -> Kind:
    k = i % CYCLE
    if k < 8:
        return "user" if k % 2 == 0 else "assistant"
    kinds: tuple[Kind, ...] = ("user", "call", "result", "assistant")
    return kinds[k - 8]


def call_id(i: int) -> str:
    """The id of the tool call at ``i`` (a call) or answered at ``i`` (a result)."""
    return f"call-{i if kind(i) == 'call' else i - 1}"


def body(i: int) -> str:
    return text(i)
