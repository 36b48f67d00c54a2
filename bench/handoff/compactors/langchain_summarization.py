"""LangChain v1's ``SummarizationMiddleware``, run through its own before-model hook.

The adapter keeps the agent state's ``messages`` as LangChain messages (``HumanMessage``,
``AIMessage`` with ``tool_calls``, ``ToolMessage``), converted from episodic's in ``add``.
``compact`` calls the middleware's ``abefore_model(state, runtime)`` and applies the update
it returns (``RemoveMessage(REMOVE_ALL_MESSAGES)``, the summary, the preserved messages) with
LangGraph's ``add_messages`` reducer, as an agent graph would; ``context`` converts the state
back (the summary is the middleware's ``HumanMessage``, text as written).

Settings, all else the middleware's defaults (its prompt, its approximate token counter, its
4000-token trim of what is summarized, its 3-attempt retry of the summary call):

- ``trigger=("tokens", 1)``: the benchmark decides when to compact, so the trigger always
  fires; ``keep=("tokens", keep_tokens)`` in the middleware's own (approximate) tokens.
- ``ChatOpenAI(..., extra_body={"max_tokens": handoff_tokens})`` besides ``max_tokens``:
  langchain-openai sends ``max_tokens`` as ``max_completion_tokens``, which llama.cpp's server
  ignores, so without the older name the handoff would have no output limit there.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from bench.handoff.compactors.base import Compactor, package_version
from episodic import Message, ToolCall

if TYPE_CHECKING:
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.messages import AnyMessage


class LangChainSummarization(Compactor):
    name = "langchain"
    describes = (
        "langchain.agents.middleware.SummarizationMiddleware "
        f"(langchain {package_version('langchain')}, "
        f"langchain-openai {package_version('langchain-openai')})"
    )

    requires: ClassVar[dict[str, str]] = {
        "langchain": "langchain>=1,<2",
        "langchain_openai": "langchain-openai",
    }

    async def open(self) -> None:
        from langchain.agents.middleware import SummarizationMiddleware
        from langchain_openai import ChatOpenAI

        endpoint = self.endpoint_or_fail()
        model = ChatOpenAI(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            model=endpoint.model,
            max_tokens=self.budget.handoff_tokens,
            temperature=0,
            timeout=self.budget.timeout,
            max_retries=0,
            extra_body={"max_tokens": self.budget.handoff_tokens},
        )
        self.middleware: SummarizationMiddleware[Any, Any] = SummarizationMiddleware(
            model, trigger=("tokens", 1), keep=("tokens", self.budget.keep_tokens)
        )
        self.messages: list[AnyMessage] = []

    async def add(self, messages: Sequence[Message]) -> None:
        self.messages.extend(_to_langchain(message) for message in messages)

    async def compact(self) -> None:
        from langgraph.graph.message import add_messages
        from langgraph.runtime import Runtime

        update = await self.middleware.abefore_model({"messages": self.messages}, Runtime())
        if update is not None:
            self.messages = list(add_messages(self.messages, update["messages"]))  # type: ignore[arg-type]

    async def context(self) -> list[Message]:
        return [_from_langchain(message) for message in self.messages]


def _to_langchain(message: Message) -> AnyMessage:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    text, id_ = message.text, str(uuid.uuid4())
    if message.role == "user":
        return HumanMessage(content=text, id=id_)
    if message.role == "system":
        return SystemMessage(content=text, id=id_)
    if message.role == "tool":
        return ToolMessage(
            content=text, tool_call_id=message.tool_call_id or "", name=message.name, id=id_
        )
    calls = [
        {"name": call.name, "args": dict(call.args), "id": call.id, "type": "tool_call"}
        for call in message.tool_calls
    ]
    return AIMessage(content=text, tool_calls=calls, id=id_)


def _from_langchain(message: AnyMessage) -> Message:
    from langchain_core.messages import AIMessage, SystemMessage, ToolMessage

    text = message.text
    if isinstance(message, ToolMessage):
        return Message.tool_result(message.tool_call_id, text, name=message.name)
    if isinstance(message, SystemMessage):
        return Message(role="system", content=text)
    if isinstance(message, AIMessage):
        calls = tuple(
            ToolCall(id=call["id"] or "", name=call["name"], args=call["args"])
            for call in message.tool_calls
        )
        return Message(role="assistant", content=text or None, tool_calls=calls)
    return Message(role="user", content=text)
