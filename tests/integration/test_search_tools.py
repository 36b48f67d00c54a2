"""The search tools an agent is given, on both backends: the plain callable for any loop, the
OpenAI Agents SDK's function tool run by a real ``Runner``, and ADK's ``FunctionTool`` run by
a real ``Runner``; each with a scripted model (no network) that calls the tool, and each
answering from the conversation's own log."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any
from uuid import uuid4

import pytest
from pydantic import Field

from episodic import EpisodicStore, Message, ToolCall, ValidationError
from episodic.integrations.search import SEARCH_TOOL_NAME, ConversationSearch
from tests.support import require_extra

OUTPUT = "FAILED test_login - AuthError E2147: token expired"


async def _with_error(store: EpisodicStore, conv: Any) -> None:
    await store.append(
        conv,
        [
            Message.user("fix the login test"),
            Message.assistant(None, tool_calls=[ToolCall(id="c1", name="shell", args={})]),
            Message.tool_result("c1", OUTPUT, name="shell"),
        ],
    )


async def test_the_plain_tool_answers_with_seqs_and_explains_a_refusal(
    store: EpisodicStore,
) -> None:
    conv = await store.create_conversation()
    await _with_error(store, conv)
    search = ConversationSearch(store, conv)
    answer = await search("E2147")
    assert "[seq 3, tool shell]" in answer
    assert OUTPUT in answer
    assert (await search(" ")).startswith("Search refused: ")
    assert "No earlier message" in await search("kubernetes")
    assert "No earlier message" in await ConversationSearch(store, uuid4())("E2147")
    tool = search.to_openai()
    assert tool["function"]["name"] == SEARCH_TOOL_NAME
    assert tool["function"]["parameters"]["required"] == ["query"]
    with pytest.raises(ValidationError):
        ConversationSearch(store, conv, limit=0)


async def test_an_openai_agent_calls_its_sessions_search_tool(store: EpisodicStore) -> None:
    require_extra("agents", "openai-agents")
    from agents import Agent, Runner, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from episodic.integrations.openai_agents import EpisodicSession

    set_tracing_disabled(True)
    session = EpisodicSession("debugging", store)
    await session.add_items([{"role": "user", "content": "fix the login test"}])
    await session.add_items([{"role": "assistant", "content": OUTPUT}])
    model = ScriptedModel(
        [
            [function_call(SEARCH_TOOL_NAME, {"query": "E2147"}, call_id="s1")],
            [assistant_message("found it", item_id="msg_found")],
        ]
    )
    agent = Agent(name="fixer", model=model, tools=[session.search_tool()])
    result = await Runner.run(agent, "which error was it?", session=session)
    assert result.final_output == "found it"
    outputs = [
        item for item in await session.get_items() if item.get("type") == "function_call_output"
    ]
    assert len(outputs) == 1
    assert "[seq 2, assistant]" in str(outputs[0]["output"])
    assert OUTPUT in str(outputs[0]["output"])


async def test_an_adk_agent_calls_the_services_search_tool(store: EpisodicStore) -> None:
    require_extra("google.adk", "google-adk")
    from google.adk.agents.llm_agent import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import Runner
    from google.genai import types

    from episodic.integrations.adk import EpisodicSessionService, session_conversation_id

    class Searcher(BaseLlm):
        """Calls the search tool once, then answers with what it returned."""

        responses: list[str] = Field(default_factory=list)

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            last = llm_request.contents[-1]
            answered = [p.function_response for p in last.parts or () if p.function_response]
            if answered:
                self.responses.append(str(answered[0].response))
                part = types.Part(text="found it")
            else:
                call = types.FunctionCall(id="s1", name=SEARCH_TOOL_NAME, args={"query": "E2147"})
                part = types.Part(function_call=call)
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    service = EpisodicSessionService(store)
    await service.create_session(app_name="app", user_id="u", session_id="debugging")
    await _with_error(store, session_conversation_id("app", "u", "debugging"))
    model = Searcher(model="scripted")
    agent = LlmAgent(name="fixer", model=model, tools=[service.search_tool()])
    runner = Runner(agent=agent, app_name="app", session_service=service)
    message = types.Content(role="user", parts=[types.Part(text="which error was it?")])
    texts = [
        part.text
        async for event in runner.run_async(
            user_id="u", session_id="debugging", new_message=message
        )
        if event.content
        for part in event.content.parts or ()
        if part.text
    ]
    assert texts == ["found it"]
    assert len(model.responses) == 1
    assert "[seq 3, tool shell]" in model.responses[0]
    assert OUTPUT in model.responses[0]
