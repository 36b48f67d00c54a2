"""EpisodicMiddleware in real ``create_agent`` loops (LangChain 1.5), on PostgreSQL and
SQLite, with LangChain's own fake chat model (scripted, no network) and the offline
extractive summarizer: over many turns of tool calls, parallel ones included, with the worker
compacting between them, every model request starts with the system prompt and then the
handoff, holds no orphan tool result, and the log holds every message exactly once and
never the system prompt. Two runs on one conversation at once lose nothing; retried calls,
a checkpointer's older messages, a tool that ends the run and a malformed call are stored
once; the usage reaches the pressure trigger; bad conversation ids are typed errors."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import Field

from episodic import BoundaryEvent, EpisodicStore, MessageEvent, RunCompletedEvent, Usage
from episodic.errors import ConfigurationError, NotFoundError, ValidationError
from episodic.policy import EpisodicCompactionConfig
from episodic.summarizers.extractive import ExtractiveSummarizer
from episodic.worker import CompactionOptions
from episodic.worker.runner import CompactionWorker
from tests.support import require_extra

require_extra("langchain", "langchain")
from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import (  # noqa: E402
    ModelRequest,
    ModelRetryMiddleware,
    wrap_model_call,
)
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatResult  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.runtime import Runtime  # noqa: E402

from episodic.integrations.langchain import (  # noqa: E402
    EpisodicMiddleware,
    session_conversation_id,
    thread_id_of,
)

SYSTEM = "You are the research agent of ACME-SYSPROMPT-7781. Cite your notes."

#: These conversations are small, smaller than some handoffs: where the worker cuts is what
#: is tested, not whether a boundary pays.
WHERE_IT_CUTS = CompactionOptions(require_smaller=False)


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's fake chat model answering from its script. It keeps every request (the
    messages it was sent, the system prompt first), reports a usage sized on the request,
    takes ``delay`` seconds per call under ``ainvoke``, and fails the calls ``fail_on``
    numbers (from 0)."""

    requests: list[list[BaseMessage]] = Field(default_factory=list)
    delay: float = 0.0
    fail_on: frozenset[int] = frozenset()

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        # The fake models implement no bind_tools; the script already says what to call.
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.requests.append(list(messages))
        if len(self.requests) - 1 in self.fail_on:
            raise RuntimeError("the provider is overloaded")
        result = super()._generate(messages, stop=stop, **kwargs)
        message = result.generations[0].message
        if isinstance(message, AIMessage) and message.usage_metadata is None:
            size = sum(len(m.text) for m in messages) // 4
            message.usage_metadata = {
                "input_tokens": size,
                "output_tokens": 7,
                "total_tokens": size + 7,
            }
        return result

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        await asyncio.sleep(self.delay)
        return self._generate(messages, stop=stop, **kwargs)


@tool
def lookup(topic: str) -> str:
    """Notes on a topic."""
    return f"notes on {topic}: " + "details " * 30


@tool
def measure(topic: str) -> str:
    """A measurement about a topic."""
    return f"{topic} measures {len(topic) * 7} units"


def call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def turn_script(turn: int, tag: str = "t") -> Iterator[AIMessage]:
    """One turn: a call, then two parallel calls, then the answer."""
    yield AIMessage("", tool_calls=[call("lookup", f"{tag}{turn}-a", topic=f"topic {turn}")])
    yield AIMessage(
        "Measuring both.",
        tool_calls=[
            call("measure", f"{tag}{turn}-b1", topic=f"left {turn}"),
            call("lookup", f"{tag}{turn}-b2", topic=f"right {turn}"),
        ],
    )
    yield AIMessage(f"answer {tag}{turn}")


def scripted(*turns: Iterator[AIMessage], **fields: Any) -> ScriptedChatModel:
    def messages() -> Iterator[AIMessage]:
        for turn in turns:
            yield from turn

    return ScriptedChatModel(messages=messages(), **fields)


def agent_with(model: ScriptedChatModel, middleware: Any, **options: Any) -> Any:
    return create_agent(
        model, tools=[lookup, measure], system_prompt=SYSTEM, middleware=middleware, **options
    )


def on_thread(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


async def message_events(store: EpisodicStore, conversation: uuid.UUID) -> list[MessageEvent]:
    events = await store.read_events(conversation, limit=10_000)
    return [e for e in events if isinstance(e, MessageEvent)]


def check_paired(request: list[BaseMessage], where: str) -> None:
    """What a provider accepts: each tool result answers a call of the AI message before it,
    once, and every call is answered before the next message that is not a result."""
    waiting: set[str] = set()
    for message in request:
        if isinstance(message, ToolMessage):
            assert message.tool_call_id in waiting, f"orphan tool result in {where}"
            waiting.discard(message.tool_call_id)
            continue
        assert not waiting, f"calls {waiting} unanswered in {where}"
        if isinstance(message, AIMessage):
            # providers send malformed calls as calls too (langchain-openai does)
            calls = [*message.tool_calls, *message.invalid_tool_calls]
            waiting = {c["id"] for c in calls if c["id"] is not None}
    assert not waiting, f"calls {waiting} unanswered at the end of {where}"


async def test_many_turns_with_the_worker_compacting_between_them(store: EpisodicStore) -> None:
    """12 turns of three model calls each (a call, two parallel calls, an answer), the
    worker compacting whenever the trigger fires. After each boundary every request of the
    turn opens with the system prompt, then the handoff; no request holds an orphan; the log
    holds each message of every run once, with each call's usage, and no system prompt."""
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=3)
    turns = 12
    model = scripted(*(turn_script(t) for t in range(turns)))
    agent = agent_with(model, [EpisodicMiddleware(store)])
    worker = CompactionWorker(store, ExtractiveSummarizer(), worker_id="langchain-e2e")
    conversation = session_conversation_id("long")

    handoffs: dict[int, str] = {}  # request index -> the handoff it must open with
    run_ids: list[list[str | None]] = []
    for turn in range(turns):
        before = len(model.requests)
        boundary = None
        if turn:
            boundary = (await store.load_context(conversation)).boundary
        result = await agent.ainvoke(
            {"messages": [HumanMessage(f"question {turn}")]}, on_thread("long")
        )
        added = result["messages"]
        # The state holds the run's own messages: the log holds the history.
        assert [type(m).__name__ for m in added] == [
            "HumanMessage", "AIMessage", "ToolMessage", "AIMessage", "ToolMessage",
            "ToolMessage", "AIMessage",
        ]  # fmt: skip
        assert added[-1].text == f"answer t{turn}"
        run_ids.append([m.id for m in added])
        assert len(model.requests) == before + 3
        if boundary is not None:
            for index in range(before, len(model.requests)):
                handoffs[index] = boundary.summary
        await worker.run_once()

    assert len(handoffs) >= 9, "the worker should have compacted several times"
    full_history = turns * 7
    for index, request in enumerate(model.requests):
        assert isinstance(request[0], SystemMessage)
        assert request[0].text == SYSTEM
        assert not any(isinstance(m, SystemMessage) for m in request[1:])
        check_paired(request, f"request {index}")
        if index in handoffs:
            assert isinstance(request[1], HumanMessage)
            assert request[1].text == handoffs[index], f"request {index} opens elsewhere"
            assert len(request) < full_history // 2, f"request {index} holds the history"

    events = await message_events(store, conversation)
    stored = [e.message.client_id for e in events]
    assert stored == [i for ids in run_ids for i in ids]  # each message once, in order
    assert len(set(stored)) == full_history
    assert [e.message.text for e in events if e.message.role == "user"] == [
        f"question {t}" for t in range(turns)
    ]
    assert all(e.message.role != "system" for e in events)
    # Each model call's output went with its usage, the pressure signal's starting point.
    with_usage = [e for e in events if e.usage is not None]
    assert len(with_usage) == turns * 3
    assert all(e.message.role == "assistant" for e in with_usage)
    boundaries = [
        e for e in await store.read_events(conversation, limit=10_000)
        if isinstance(e, BoundaryEvent)
    ]  # fmt: skip
    assert len(boundaries) >= 3
    texts = [e.message.text for e in events] + [b.summary for b in boundaries]
    assert not any("ACME-SYSPROMPT" in text for text in texts)


async def test_a_compaction_during_a_run_leaves_the_run_whole(store: EpisodicStore) -> None:
    """The worker compacts while a run waits on its tool: the boundary covers the earlier
    run only, and the run's next request opens with the handoff and holds all of the run,
    its call answered."""
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    worker = CompactionWorker(
        store, ExtractiveSummarizer(), options=WHERE_IT_CUTS, worker_id="mid-run"
    )
    outcomes: list[str] = []

    @tool
    async def compact_now(reason: str) -> str:
        """Let the worker compact now."""
        outcomes.extend(result.outcome for result in await worker.run_once())
        return "compacted"

    model = scripted(
        iter([AIMessage("first answer")]),
        iter([AIMessage("", tool_calls=[call("compact_now", "k1", reason="long")])]),
        iter([AIMessage("second answer")]),
    )
    agent = create_agent(
        model, tools=[compact_now], system_prompt=SYSTEM, middleware=[EpisodicMiddleware(store)]
    )
    await agent.ainvoke({"messages": [HumanMessage("first question")]}, on_thread("mid"))
    result = await agent.ainvoke({"messages": [HumanMessage("second question")]}, on_thread("mid"))
    assert outcomes == ["succeeded"]
    conversation = session_conversation_id("mid")
    boundary = (await store.load_context(conversation)).boundary
    assert boundary is not None
    assert boundary.covers_through_seq == 2  # the first run: the second was in progress
    last = model.requests[-1]
    assert [last[0].text, last[1].text] == [SYSTEM, boundary.summary]
    assert [type(m).__name__ for m in last[-3:]] == ["HumanMessage", "AIMessage", "ToolMessage"]
    assert last[-3].text == "second question"
    check_paired(last, "the request after the compaction")
    events = await message_events(store, conversation)
    assert [e.message.client_id for e in events][2:] == [m.id for m in result["messages"]]


async def test_two_runs_on_one_conversation_at_once_lose_nothing(store: EpisodicStore) -> None:
    """Two runs on one new thread, their model calls overlapping: the conversation is
    created once, every message of both is stored once and in its run's order, each batch
    whole (a call's parallel results side by side), and every request either model saw is
    one a provider accepts, though the runs' batches alternate in the log."""
    middleware = EpisodicMiddleware(store)
    first = scripted(turn_script(0, "a"), delay=0.05)
    second = scripted(turn_script(0, "b"), delay=0.03)
    results = await asyncio.gather(
        agent_with(first, [middleware]).ainvoke(
            {"messages": [HumanMessage("question a")]}, on_thread("shared")
        ),
        agent_with(second, [middleware]).ainvoke(
            {"messages": [HumanMessage("question b")]}, on_thread("shared")
        ),
    )
    assert [r["messages"][-1].text for r in results] == ["answer a0", "answer b0"]
    events = await message_events(store, session_conversation_id("shared"))
    seq_of = {e.message.client_id: e.seq for e in events}
    assert len(seq_of) == len(events) == 14
    for result, tag in zip(results, "ab", strict=True):
        seqs = [seq_of[m.id] for m in result["messages"]]
        assert seqs == sorted(seqs), f"run {tag} stored out of order"
        parallel = [m for m in result["messages"] if isinstance(m, ToolMessage)][1:]
        assert [seq_of[m.id] for m in parallel] == [seqs[4], seqs[4] + 1]
    a = [seq_of[m.id] for m in results[0]["messages"]]
    b = [seq_of[m.id] for m in results[1]["messages"]]
    assert a[0] < b[-1], "the runs should have overlapped"
    assert b[0] < a[-1], "the runs should have overlapped"
    for name, model in (("a", first), ("b", second)):
        for index, request in enumerate(model.requests):
            check_paired(request, f"run {name}'s request {index}")
    head = await store.get_conversation(session_conversation_id("shared"))
    assert head.open_tool_calls == {}
    assert head.metadata == {"langchain_session_id": "shared"}


async def test_a_checkpointers_older_messages_are_not_stored_again(store: EpisodicStore) -> None:
    """With a checkpointer the state keeps every run's messages: the log still gets each
    once, and the model is sent the loaded context, not the state's history besides it."""
    model = scripted(turn_script(0), turn_script(1))
    agent = agent_with(model, [EpisodicMiddleware(store)], checkpointer=InMemorySaver())
    await agent.ainvoke({"messages": [HumanMessage("question 0")]}, on_thread("saved"))
    result = await agent.ainvoke({"messages": [HumanMessage("question 1")]}, on_thread("saved"))
    assert len(result["messages"]) == 14
    events = await message_events(store, session_conversation_id("saved"))
    assert [e.message.client_id for e in events] == [m.id for m in result["messages"]]
    last = model.requests[-1]
    assert [type(m).__name__ for m in last].count("HumanMessage") == 2
    assert len(last) == 1 + 14 - 1  # the system prompt, then all but the answer to come


async def test_a_retried_model_call_stores_its_input_once(store: EpisodicStore) -> None:
    """LangChain's own retry middleware, outside this one, calls it twice for one model
    call: the run's input goes in once (the same batch again is the same append)."""
    model = scripted(turn_script(0), fail_on=frozenset({0}))
    retry = ModelRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)
    agent = agent_with(model, [retry, EpisodicMiddleware(store)])
    result = await agent.ainvoke({"messages": [HumanMessage("question 0")]}, on_thread("retry"))
    assert result["messages"][-1].text == "answer t0"
    assert len(model.requests) == 4  # the failed call, then three
    assert model.requests[0] == model.requests[1]
    events = await message_events(store, session_conversation_id("retry"))
    assert [e.message.client_id for e in events] == [m.id for m in result["messages"]]


async def test_a_failed_run_sent_again_with_new_input_stores_each_message_once(
    store: EpisodicStore,
) -> None:
    """The model fails after the run's tool result was stored: the checkpoint keeps the
    result unrecorded, and the next run on the thread sends it again with its new input.
    The result is stored once, the new input after it."""
    model = scripted(
        iter([AIMessage("", tool_calls=[call("lookup", "c1", topic="x")])]),
        iter([AIMessage("answer 1")]),
        fail_on=frozenset({1}),
    )
    agent = agent_with(model, [EpisodicMiddleware(store)], checkpointer=InMemorySaver())
    with pytest.raises(RuntimeError, match="overloaded"):
        await agent.ainvoke({"messages": [HumanMessage("question 0")]}, on_thread("again"))
    conversation = session_conversation_id("again")
    assert [e.message.role for e in await message_events(store, conversation)] == [
        "user", "assistant", "tool",
    ]  # fmt: skip
    result = await agent.ainvoke({"messages": [HumanMessage("question 1")]}, on_thread("again"))
    assert result["messages"][-1].text == "answer 1"
    events = await message_events(store, conversation)
    assert [e.message.client_id for e in events] == [m.id for m in result["messages"]]
    assert [e.message.text for e in events if e.message.role == "user"] == [
        "question 0", "question 1",
    ]  # fmt: skip


async def test_an_answer_without_an_id_is_stored_once(store: EpisodicStore) -> None:
    """A middleware inside this one answers with a bare ``AIMessage`` (no id, as from a
    cache): it is given an id before it is stored, the one the state keeps, so the run's
    end does not find it new and store it again."""

    @wrap_model_call
    async def cached(request: ModelRequest[Any], handler: Any) -> AIMessage:
        return AIMessage("from the cache")

    model = scripted(iter([]))
    agent = agent_with(model, [EpisodicMiddleware(store), cached])
    result = await agent.ainvoke({"messages": [HumanMessage("hello")]}, on_thread("cache"))
    answer = result["messages"][-1]
    assert answer.text == "from the cache"
    assert answer.id is not None
    events = await message_events(store, session_conversation_id("cache"))
    assert [e.message.client_id for e in events] == [m.id for m in result["messages"]]
    assert model.requests == []


async def test_what_a_run_adds_after_its_last_model_call_is_stored(store: EpisodicStore) -> None:
    """A ``return_direct`` tool ends the run with its result; the result is stored when the
    run ends, and its call waits no more."""

    @tool(return_direct=True)
    def finish(summary: str) -> str:
        """Finish with a summary."""
        return f"final: {summary}"

    model = scripted(iter([AIMessage("", tool_calls=[call("finish", "f1", summary="done")])]))
    agent = create_agent(model, tools=[finish], middleware=[EpisodicMiddleware(store)])
    result = await agent.ainvoke({"messages": [HumanMessage("wrap up")]}, on_thread("direct"))
    assert result["messages"][-1].text == "final: done"
    conversation = session_conversation_id("direct")
    events = await message_events(store, conversation)
    assert [e.message.role for e in events] == ["user", "assistant", "tool"]
    assert (await store.get_conversation(conversation)).open_tool_calls == {}


async def test_a_malformed_call_is_answered_at_once_and_once(store: EpisodicStore) -> None:
    """A call whose arguments did not parse ends the run with no tool to run: its error
    result is stored with it, so no call waits in the log, and on the next run LangChain,
    finding it answered, adds no second one (which the log would refuse)."""
    malformed = AIMessage(
        "",
        invalid_tool_calls=[
            {"name": "lookup", "args": '{"topic": ', "id": "bad1", "error": "truncated",
             "type": "invalid_tool_call"},
        ],
    )  # fmt: skip
    model = scripted(iter([malformed]), turn_script(1))
    agent = agent_with(model, [EpisodicMiddleware(store)], checkpointer=InMemorySaver())
    first = await agent.ainvoke({"messages": [HumanMessage("look it up")]}, on_thread("bad"))
    assert isinstance(first["messages"][-1], ToolMessage)
    assert first["messages"][-1].status == "error"
    conversation = session_conversation_id("bad")
    assert (await store.get_conversation(conversation)).open_tool_calls == {}
    second = await agent.ainvoke({"messages": [HumanMessage("question 1")]}, on_thread("bad"))
    assert second["messages"][-1].text == "answer t1"
    events = await message_events(store, conversation)
    assert [e.message.client_id for e in events] == [m.id for m in second["messages"]]
    assert [e.message.tool_call_id for e in events[:3]] == [None, None, "bad1"]
    for index, request in enumerate(model.requests):
        check_paired(request, f"request {index}")
    sent = model.requests[1][2]
    assert isinstance(sent, AIMessage)
    assert [c["id"] for c in sent.invalid_tool_calls] == ["bad1"]  # sent back as it came


async def test_the_calls_usage_reaches_the_pressure_trigger(store: EpisodicStore) -> None:
    """The usage the model reports goes with its output: the head starts its pressure from
    it, and the worker compacts on context pressure a conversation whose own estimate is
    tiny."""
    store.trigger = EpisodicCompactionConfig(
        trigger_context_tokens=40_000, trigger_unfinished_turns=100
    )
    reported = {
        "input_tokens": 52_000,
        "output_tokens": 12,
        "total_tokens": 52_012,
        "input_token_details": {"cache_read": 48_000},
        "output_token_details": {"reasoning": 5},
    }
    model = scripted(iter([AIMessage("short answer", usage_metadata=reported)]))
    agent = agent_with(model, [EpisodicMiddleware(store)])
    await agent.ainvoke({"messages": [HumanMessage("a question")]}, on_thread("pressed"))
    conversation = session_conversation_id("pressed")
    events = await message_events(store, conversation)
    assert events[1].usage == Usage(
        input_tokens=52_000, output_tokens=12, cache_read_tokens=48_000, reasoning_tokens=5
    )
    assert (await store.get_conversation(conversation)).usage_input_tokens == 52_000
    worker = CompactionWorker(
        store, ExtractiveSummarizer(), options=WHERE_IT_CUTS, worker_id="pressure"
    )
    assert [r.outcome for r in await worker.run_once()] == ["succeeded"]
    boundary = (await store.load_context(conversation)).boundary
    assert boundary is not None
    assert boundary.reason == "context_pressure"


async def test_complete_runs_marks_each_clean_end(store: EpisodicStore) -> None:
    model = scripted(turn_script(0))
    agent = agent_with(model, [EpisodicMiddleware(store, complete_runs=True)])
    await agent.ainvoke({"messages": [HumanMessage("question 0")]}, on_thread("ended"))
    conversation = session_conversation_id("ended")
    events = await store.read_events(conversation)
    assert isinstance(events[-1], RunCompletedEvent)
    assert events[-1].abandoned_tool_call_ids == ()
    head = await store.get_conversation(conversation)
    assert head.user_messages_since_run_completed == 0


async def test_system_messages_in_the_state_are_sent_first_and_never_stored(
    store: EpisodicStore,
) -> None:
    model = scripted(iter([AIMessage("ok")]))
    agent = agent_with(model, [EpisodicMiddleware(store)])
    await agent.ainvoke(
        {"messages": [SystemMessage("Answer in French."), HumanMessage("hello")]},
        on_thread("rules"),
    )
    (request,) = model.requests
    assert [m.text for m in request] == [SYSTEM, "Answer in French.", "hello"]
    events = await message_events(store, session_conversation_id("rules"))
    assert [e.message.role for e in events] == ["user", "assistant"]


# ---- which conversation ------------------------------------------------------------------


@dataclass
class Caller:
    user: str


async def test_a_resolver_finds_the_conversation_from_the_runtime(store: EpisodicStore) -> None:
    seen: list[str | None] = []

    def per_user(runtime: Runtime[Caller]) -> str:
        seen.append(thread_id_of(runtime))
        return f"user:{runtime.context.user}"

    model = scripted(iter([AIMessage("one")]), iter([AIMessage("two")]))
    agent = agent_with(model, [EpisodicMiddleware(store, per_user)], context_schema=Caller)
    for thread in ("x", "y"):  # two threads, one user: one conversation
        await agent.ainvoke(
            {"messages": [HumanMessage(thread)]}, on_thread(thread), context=Caller("ada")
        )
    events = await message_events(store, session_conversation_id("user:ada"))
    assert [e.message.text for e in events] == ["x", "one", "y", "two"]
    assert (seen[0], seen[-1]) == ("x", "y")  # the resolver is given the run's runtime
    assert [m.text for m in model.requests[1]] == [SYSTEM, "x", "one", "y"]


async def test_a_conversation_given_by_uuid_or_an_async_resolver(store: EpisodicStore) -> None:
    conversation = await store.create_conversation(metadata={"app": "langchain"})

    async def existing(runtime: Runtime[Any]) -> uuid.UUID:
        await asyncio.sleep(0)
        return conversation

    for given in (conversation, existing):
        model = scripted(iter([AIMessage("hi")]))
        agent = agent_with(model, [EpisodicMiddleware(store, given)])
        await agent.ainvoke({"messages": [HumanMessage("hello")]}, on_thread("ignored"))
    events = await message_events(store, conversation)
    assert [e.message.text for e in events] == ["hello", "hi", "hello", "hi"]
    assert len(model.requests[0]) == 4  # the system prompt, the first exchange, "hello"
    missing = uuid.uuid4()
    agent = agent_with(scripted(iter([AIMessage("x")])), [EpisodicMiddleware(store, missing)])
    with pytest.raises(NotFoundError, match=str(missing)):
        await agent.ainvoke({"messages": [HumanMessage("hello")]})


async def test_a_session_id_is_the_tenants_own(store: EpisodicStore) -> None:
    acme = store.for_tenant("acme")
    for scoped in (store, acme):
        model = scripted(iter([AIMessage("hi")]))
        agent = agent_with(model, [EpisodicMiddleware(scoped, "chat-7")])
        await agent.ainvoke({"messages": [HumanMessage("hello")]})
    default, scoped_id = (
        session_conversation_id("chat-7"),
        session_conversation_id("chat-7", "acme"),
    )
    assert default != scoped_id
    assert (await store.get_conversation(default)).tenant_id == "default"
    assert (await acme.get_conversation(scoped_id)).tenant_id == "acme"
    assert len(await message_events(store, default)) == 2


async def test_bad_conversation_ids_are_typed_errors_and_store_nothing(
    store: EpisodicStore,
) -> None:
    def nothing(runtime: Runtime[Any]) -> None:
        return None

    agent = agent_with(scripted(iter([AIMessage("x")])), [EpisodicMiddleware(store, nothing)])
    with pytest.raises(ValidationError, match=r"resolver .*nothing.* returned None") as caught:
        await agent.ainvoke({"messages": [HumanMessage("hello")]}, on_thread("t"))
    assert caught.value.field == "conversation_id"
    agent = agent_with(scripted(iter([AIMessage("x")])), [EpisodicMiddleware(store)])
    with pytest.raises(ValidationError, match=r"no thread_id .*configurable"):
        await agent.ainvoke({"messages": [HumanMessage("hello")]})
    with pytest.raises(ValidationError, match="conversation_id must be"):
        EpisodicMiddleware(store, 42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="conversation_id is empty"):
        EpisodicMiddleware(store, "")
    with pytest.raises(ValidationError, match="EpisodicStore"):
        EpisodicMiddleware("postgresql://db")  # type: ignore[arg-type]
    assert await store.list_conversations() == []


async def test_invoke_is_refused_with_a_typed_error_before_anything_is_stored(
    store: EpisodicStore,
) -> None:
    model = scripted(iter([AIMessage("x")]))
    agent = agent_with(model, [EpisodicMiddleware(store)])
    with pytest.raises(ConfigurationError, match=r"ainvoke\(\)"):
        await asyncio.to_thread(
            agent.invoke, {"messages": [HumanMessage("hello")]}, on_thread("sync")
        )
    assert model.requests == []
    assert await store.list_conversations() == []
