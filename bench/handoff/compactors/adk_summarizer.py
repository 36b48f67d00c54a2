"""Google ADK's ``LlmEventSummarizer``, over a session of ADK ``Event``s.

The adapter converts episodic messages to the events an ADK agent run appends (the user's
text; the model's text and ``function_call`` parts; one ``function_response`` event per tool
result, authored by the agent), each phase one invocation, with increasing timestamps.

``compact`` takes what ADK's token-threshold compaction takes, with ADK's own function
(``apps.compaction._events_to_compact_for_token_threshold``): the events after the latest
compaction's range, less the newest ``event_retention_size`` of them, preceded by the latest
compaction's summary as a seed event, so a new summary supersedes the old one. The retention
size is the number of events ``keep_from`` keeps for ``keep_tokens`` (one event a message).
``LlmEventSummarizer.maybe_summarize_events`` writes the compaction event, appended to the
session as ADK's runner does. Not applied: ADK's trigger (a prompt-token threshold) and its
"is the range worth compacting" check, since the benchmark compacts when it says so.

``context`` is ADK's own request-contents builder (``flows.llm_flows.context._contents.
_get_contents``) over the session: the summary materialized as the agent's model turn, then
the events it does not cover, converted back with :mod:`episodic.formats.adk`.

litellm is not installed, so the model is :class:`_ChatCompletionsLlm`, a small ``BaseLlm``
calling the endpoint's chat completions with ``openai.AsyncOpenAI`` (``max_tokens`` is the
handoff budget, ``temperature=0``, no retries).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from bench.handoff.compactors.base import Compactor, keep_from, package_version
from episodic import Message
from episodic.formats.adk import messages_from_adk_event

if TYPE_CHECKING:
    from google.adk.events.event import Event
    from google.genai import types

AGENT = "agent"


class AdkEventSummarizer(Compactor):
    name = "adk"
    describes = (
        "google.adk.apps.llm_event_summarizer.LlmEventSummarizer "
        f"(google-adk {package_version('google-adk')})"
    )

    requires: ClassVar[dict[str, str]] = {"google.adk": "google-adk", "openai": "openai"}

    async def open(self) -> None:
        from google.adk.apps.llm_event_summarizer import LlmEventSummarizer

        endpoint = self.endpoint_or_fail()
        llm = _chat_completions_llm(
            model=endpoint.model,
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            max_tokens=self.budget.handoff_tokens,
            timeout=self.budget.timeout,
        )
        self.summarizer = LlmEventSummarizer(llm=llm)
        self.events: list[Event] = []  # the session, compaction events included
        self.messages: list[Message] = []  # the raw events' messages, one each
        self.clock = 0.0
        self.invocation = ""

    async def add(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self.clock += 1.0
            self.events.append(self._event(message))
            self.messages.append(message)

    async def compact(self) -> None:
        from google.adk.apps.compaction import _events_to_compact_for_token_threshold

        retained = len(self.messages) - keep_from(self.messages, self.budget.keep_tokens)
        to_compact = _events_to_compact_for_token_threshold(
            events=self.events, event_retention_size=retained
        )
        compaction = await self.summarizer.maybe_summarize_events(events=to_compact)
        if compaction is not None:
            self.events.append(compaction)

    async def context(self) -> list[Message]:
        from google.adk.events.event import Event
        from google.adk.flows.llm_flows.context._contents import _get_contents

        contents = _get_contents(None, self.events, AGENT, preserve_function_call_ids=True)
        messages: list[Message] = []
        for content in contents:
            author = "user" if content.role == "user" else AGENT
            event = json.loads(Event(author=author, content=content).model_dump_json())
            messages.extend(_plain(m) for m in messages_from_adk_event(event))
        return messages

    def _event(self, message: Message) -> Event:
        from google.adk.events.event import Event
        from google.genai import types

        parts: list[types.Part] = []
        if message.role == "tool":
            response = types.FunctionResponse(
                id=message.tool_call_id, name=message.name, response={"result": message.text}
            )
            content = types.Content(role="user", parts=[types.Part(function_response=response)])
            return self._stamped(Event(author=AGENT, content=content))
        if message.text:
            parts.append(types.Part(text=message.text))
        if message.role == "assistant":
            parts.extend(
                types.Part(
                    function_call=types.FunctionCall(id=c.id, name=c.name, args=dict(c.args))
                )
                for c in message.tool_calls
            )
            return self._stamped(
                Event(author=AGENT, content=types.Content(role="model", parts=parts))
            )
        self.invocation = Event.new_id()  # a user's message (or a system one) starts a run
        return self._stamped(Event(author="user", content=types.Content(role="user", parts=parts)))

    def _stamped(self, event: Event) -> Event:
        event.timestamp, event.invocation_id = self.clock, self.invocation or event.new_id()
        return event


def _chat_completions_llm(**fields: Any) -> Any:
    """A ``BaseLlm`` answering from an OpenAI-compatible chat-completions endpoint (the class
    is made here so that importing this module does not import ADK)."""
    from google.adk.models._capabilities import LlmCapabilities
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types
    from openai import AsyncOpenAI

    class _ChatCompletionsLlm(BaseLlm):
        base_url: str
        api_key: str
        max_tokens: int
        timeout: float

        @property
        def capabilities(self) -> LlmCapabilities:
            return LlmCapabilities()

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            chat: list[dict[str, str]] = []
            system = llm_request.config.system_instruction if llm_request.config else None
            if isinstance(system, str) and system:
                chat.append({"role": "system", "content": system})
            chat.extend(_chat_message(content) for content in llm_request.contents)
            async with AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=self.timeout
            ) as client:
                reply = await client.chat.completions.create(
                    model=llm_request.model or self.model,
                    messages=chat,  # type: ignore[arg-type]
                    max_tokens=self.max_tokens,
                    temperature=0,
                )
            usage = None
            if reply.usage is not None:
                usage = types.GenerateContentResponseUsageMetadata(
                    prompt_token_count=reply.usage.prompt_tokens,
                    candidates_token_count=reply.usage.completion_tokens,
                    total_token_count=reply.usage.total_tokens,
                )
            text = reply.choices[0].message.content or ""
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(text=text)]),
                usage_metadata=usage,
            )

    return _ChatCompletionsLlm(**fields)


def _plain(message: Message) -> Message:
    """The message without the event kept in ``native``; a tool result's text unwrapped from
    the ``{"result": ...}`` its function response holds (as ADK wraps a tool's plain output)."""
    update: dict[str, Any] = {"native": None}
    if message.role == "tool":
        response = json.loads(message.text)
        if isinstance(response, dict) and set(response) == {"result"}:
            update["content"] = str(response["result"])
    return message.model_copy(update=update)


def _chat_message(content: types.Content) -> dict[str, str]:
    texts = [part.text for part in content.parts or () if part.text]
    return {
        "role": "assistant" if content.role == "model" else "user",
        "content": "\n".join(texts),
    }
