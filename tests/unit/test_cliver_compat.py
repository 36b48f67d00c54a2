"""LlmCompactor against the real agent core (cliver-core), with a scripted provider: no network.

The installed cliver-core 0.3.0a5 has no compactor hook yet (no CompactionContext, no
``context_compactor``), so what can run today is proven here: an ``AgentCore`` works as the
summarizer, and LlmCompactor drives a foreign context only through its public surface,
returning that context's own plan type. The end-to-end test through ``AgentCore`` runs once
an installed cliver-core has the hook.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import require_extra

cliver_core = require_extra("cliver_core", "cliver")

from cliver_core import AgentCore, CLIverMessage, ModelBinding, ModelBindings  # noqa: E402
from cliver_core.messages import CLIverMessageChunk, UsageInfo  # noqa: E402
from cliver_core.messages import ToolCall as CLIverToolCall  # noqa: E402
from cliver_core.provider import CLIverRequest, CLIverResponse, Provider  # noqa: E402

from episodic.loop import (  # noqa: E402
    COMPACTED_CONTEXT_MARKER,
    CompactionContext,
    LlmCompactor,
    apply_compaction,
)
from episodic.models import Message, Usage  # noqa: E402


class ScriptedProvider(Provider):  # type: ignore[no-untyped-call]  # cliver-core is untyped here
    """Answers chat requests from a script and remembers every request."""

    protocol = "openai"
    brand = "scripted"

    def __init__(self, replies: Sequence[CLIverResponse]) -> None:
        super().__init__(api_key="", base_url="http://scripted.invalid")
        self.replies = list(replies)
        self.requests: list[CLIverRequest] = []

    async def chat(self, request: CLIverRequest) -> CLIverResponse:
        self.requests.append(request)
        return self.replies.pop(0)

    async def stream(self, request: CLIverRequest) -> AsyncIterator[CLIverMessageChunk]:
        raise NotImplementedError("the scripted provider does not stream")


def _reply(content: str | None, *, input_tokens: int, **fields: Any) -> CLIverResponse:
    return CLIverResponse(
        message=CLIverMessage(role="assistant", content=content, **fields),
        usage=UsageInfo(input_tokens=input_tokens, output_tokens=7),
    )


def _agent(provider: ScriptedProvider, **kwargs: Any) -> Any:
    return AgentCore(
        ModelBindings(llm=ModelBinding.llm(model="scripted-model", provider=provider)), **kwargs
    )


HISTORY = [
    Message.user("Rename the module"),
    Message.assistant("Renamed episodic/old.py to episodic/new.py."),
    Message.user("Now fix the imports"),
]


async def test_an_agent_core_is_a_summarizer() -> None:
    provider = ScriptedProvider([_reply("renamed old.py to new.py", input_tokens=900)])
    compactor = LlmCompactor(_agent(provider), threshold_tokens=1_000, keep_turns=1)
    context = CompactionContext.of(HISTORY, iteration=3, last_usage=Usage(input_tokens=1_000))

    plan = await compactor(context)

    assert plan is not None
    assert plan.keep_from == 2
    assert plan.summary == "renamed old.py to new.py"
    assert plan.usage == Usage(input_tokens=900, output_tokens=7)
    (request,) = provider.requests
    prompt = request.messages[-1].content
    assert isinstance(prompt, str)
    assert "[user]\nRename the module" in prompt
    assert "Now fix the imports" not in prompt
    applied = apply_compaction(context.messages, plan)
    assert applied.messages[0].text == f"{COMPACTED_CONTEXT_MARKER}\nrenamed old.py to new.py"


@dataclass(frozen=True)
class ForeignPlan:
    keep_from: int
    summary: str | None
    usage: Any


@dataclass(frozen=True)
class ForeignSplit:
    keep_from: int
    older: list[CLIverMessage]
    recent: list[CLIverMessage]

    def plan(self, summary: str | None = None, usage: Any = None) -> ForeignPlan:
        return ForeignPlan(self.keep_from, summary, usage)


class ForeignContext:
    """An agent core's own context over its own message type, as cliver-core documents it."""

    def __init__(self, messages: list[CLIverMessage], last_usage: UsageInfo | None) -> None:
        self.messages = messages
        self.iteration = 1
        self.run_id = "run-1"
        self.model = "scripted-model"
        self.last_usage = last_usage
        self.recorded: list[Any] = []

    def record_usage(self, usage: Any) -> None:
        self.recorded.append(usage)

    def split_at_user_turn(self, keep_turns: int) -> ForeignSplit:
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        keep_from = users[-keep_turns] if len(users) >= keep_turns else 0
        return ForeignSplit(keep_from, self.messages[:keep_from], self.messages[keep_from:])

    def render(self, messages: Sequence[CLIverMessage]) -> str:
        return "\n\n".join(f"[{m.role}]\n{m.content}" for m in messages)


async def test_a_foreign_context_gets_its_own_plan_type_and_usage_type_back() -> None:
    summarizer_provider = ScriptedProvider([_reply("summary", input_tokens=50)])
    compactor = LlmCompactor(_agent(summarizer_provider), threshold_tokens=100, keep_turns=1)
    messages = [
        CLIverMessage(role="user", content="old"),
        CLIverMessage(role="assistant", content="done"),
        CLIverMessage(role="user", content="new"),
    ]
    context = ForeignContext(messages, UsageInfo(input_tokens=100, output_tokens=1))

    plan = await compactor(context)

    assert isinstance(plan, ForeignPlan)
    assert (plan.keep_from, plan.summary) == (2, "summary")
    assert isinstance(plan.usage, UsageInfo)  # passed through for the core to record
    assert context.recorded == []


async def test_a_foreign_context_records_the_usage_of_an_empty_summary() -> None:
    compactor = LlmCompactor(
        _agent(ScriptedProvider([_reply("", input_tokens=50)])), threshold_tokens=1
    )
    messages = [CLIverMessage(role="user", content=t) for t in ("a", "b", "c")]
    context = ForeignContext(messages, UsageInfo(input_tokens=10, output_tokens=1))
    assert await compactor(context) is None
    (usage,) = context.recorded
    assert usage.input_tokens == 50


HAS_COMPACTOR_HOOK = "context_compactor" in inspect.signature(AgentCore.__init__).parameters


@pytest.mark.skipif(
    not HAS_COMPACTOR_HOOK,
    reason=f"cliver-core {getattr(cliver_core, '__version__', '0.3.0a5')} has no context_compactor",
)
async def test_agent_core_runs_llm_compactor_in_its_loop() -> None:  # pragma: no cover
    from cliver_core import tool

    @tool(name="lookup", description="Look something up.")
    def lookup(query: str) -> list[dict[str, str]]:
        return [{"text": f"found {query}"}]

    summarizer = _agent(ScriptedProvider([_reply("the user renamed a module", input_tokens=60)]))
    call = CLIverToolCall(id="c1", name="lookup", args={"query": "imports"})
    provider = ScriptedProvider(
        [
            _reply(None, input_tokens=5_000, tool_calls=[call]),
            _reply("Imports fixed.", input_tokens=200),
        ]
    )
    compactor = LlmCompactor(summarizer, threshold_tokens=1_000, keep_turns=1)
    agent = _agent(provider, builtin_tools=[lookup], context_compactor=compactor)
    conversation = [
        CLIverMessage(role="user", content="Rename the module"),
        CLIverMessage(role="assistant", content="Renamed."),
    ]

    response = await agent.chat("Now fix the imports", conversation=conversation)

    assert response.message.content == "Imports fixed."
    second = provider.requests[1].messages
    contents = [m.content for m in second if isinstance(m.content, str)]
    assert any(c.startswith(COMPACTED_CONTEXT_MARKER) for c in contents)
    assert "Rename the module" not in contents
