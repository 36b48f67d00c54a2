"""EpisodicSession with the OpenAI Agents SDK's own classes, on both backends: items round
trip exactly, pop and clear are retractions and clears, the view after a boundary starts
with the handoff, and ``Runner.run`` drives it with the SDK's scripted model (no network).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from episodic import BoundaryEvent, BoundaryRequest, EpisodicStore, RetractionEvent
from episodic.errors import ErasedConversationError, OrphanToolResultError
from episodic.policy import EpisodicCompactionConfig
from episodic.summarizers.extractive import ExtractiveSummarizer
from episodic.worker.runner import CompactionWorker
from tests.support import require_extra

agents = require_extra("agents", "openai-agents")
from agents import Agent, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.memory.session import Session  # noqa: E402
from agents.memory.session_settings import SessionSettings  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from agents.usage import Usage  # noqa: E402

from episodic.integrations.openai_agents import (  # noqa: E402
    EpisodicSession,
    session_conversation_id,
)

set_tracing_disabled(True)  # no network: nothing to export traces to

#: Items of many kinds, as the SDK hands them over: what get_items must give back exactly.
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "paris weather"},
    },
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Sunny, 21 C.", "annotations": []}],
    },
    {"role": "developer", "content": "Answer in one line."},
    {"type": "mcp_call", "id": "mcp_1", "server_label": "s", "name": "t", "arguments": "{}"},
]


@pytest.fixture
def session(store: EpisodicStore) -> EpisodicSession:
    return EpisodicSession("user-42:chat-7", store)


async def test_it_is_the_sdks_session(session: EpisodicSession) -> None:
    assert isinstance(session, Session)
    assert session.conversation_id == session_conversation_id("user-42:chat-7")


async def test_items_round_trip_exactly(session: EpisodicSession) -> None:
    await session.add_items(copy.deepcopy(ITEMS[:4]))
    await session.add_items(copy.deepcopy(ITEMS[4:]))
    assert await session.get_items() == ITEMS
    assert await session.get_items(limit=2) == ITEMS[-2:]


async def test_a_window_never_starts_with_an_output_without_its_call(
    session: EpisodicSession,
) -> None:
    await session.add_items(copy.deepcopy(ITEMS[:4]))
    assert await session.get_items(limit=1) == []  # the output alone: its call is outside
    assert await session.get_items(limit=2) == ITEMS[2:4]
    limited = EpisodicSession(
        session.session_id, session.store, session_settings=SessionSettings(limit=3)
    )
    assert await limited.get_items() == ITEMS[1:4]


#: two parallel calls, their two outputs, then the reply
PARALLEL: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and in Rome?"},
    *(
        {
            "type": "function_call",
            "call_id": f"call_{city}",
            "name": "weather",
            "arguments": f'{{"city": "{city}"}}',
        }
        for city in ("paris", "rome")
    ),
    *(
        {"type": "function_call_output", "call_id": f"call_{city}", "output": "sunny"}
        for city in ("paris", "rome")
    ),
    {"role": "assistant", "content": "Sunny in both."},
]


async def test_no_window_holds_an_output_without_its_call_with_parallel_calls(
    session: EpisodicSession,
) -> None:
    await session.add_items(copy.deepcopy(PARALLEL))
    for limit in range(1, len(PARALLEL) + 1):
        window = await session.get_items(limit=limit)
        calls = set()
        for item in window:
            if item.get("type") == "function_call":
                calls.add(item["call_id"])
            if item.get("type") == "function_call_output":
                assert item["call_id"] in calls, (limit, window)
        # what is left out is only outputs whose call fell outside: the newest items stay
        assert window[-1] == PARALLEL[-1]
        assert all(item in PARALLEL[-limit:] for item in window)
    # the window that cuts between the two calls keeps the second call and its output only
    assert await session.get_items(limit=4) == [PARALLEL[2], PARALLEL[4], PARALLEL[5]]


async def test_an_unknown_session_reads_empty(session: EpisodicSession) -> None:
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.clear_session()
    assert [item async for item in session.get_full_history()] == []


async def test_an_output_must_answer_a_waiting_call(session: EpisodicSession) -> None:
    await session.add_items([{"role": "user", "content": "hi"}])
    with pytest.raises(OrphanToolResultError):
        await session.add_items(
            [{"type": "function_call_output", "call_id": "nobody", "output": "?"}]
        )
    assert await session.get_items() == [{"role": "user", "content": "hi"}]


async def test_pop_is_a_retraction_and_the_log_keeps_the_item(
    session: EpisodicSession, store: EpisodicStore
) -> None:
    await session.add_items(copy.deepcopy(ITEMS))
    assert await session.pop_item() == ITEMS[-1]
    assert await session.pop_item() == ITEMS[-2]
    assert await session.get_items() == ITEMS[:-2]
    events = await store.read_events(session.conversation_id)
    assert [type(e) for e in events[-2:]] == [RetractionEvent, RetractionEvent]
    assert [item async for item in session.get_full_history(page_size=3)] == ITEMS


async def test_concurrent_pops_return_each_item_once(session: EpisodicSession) -> None:
    items = [{"role": "user", "content": f"m{i}"} for i in range(10)]
    await session.add_items(copy.deepcopy(items))
    popped = await asyncio.gather(*(session.pop_item() for _ in range(13)))
    assert (
        sorted((p for p in popped if p is not None), key=lambda i: int(i["content"][1:])) == items
    )
    assert popped.count(None) == 3
    assert await session.get_items() == []


async def test_clear_empties_the_view_and_keeps_the_log(session: EpisodicSession) -> None:
    await session.add_items(copy.deepcopy(ITEMS[:4]))
    await session.clear_session()
    assert await session.get_items() == []
    await session.add_items([{"role": "user", "content": "again"}])
    assert await session.get_items() == [{"role": "user", "content": "again"}]
    assert len([item async for item in session.get_full_history()]) == 5


async def test_concurrent_first_writes_create_one_conversation(store: EpisodicStore) -> None:
    sessions = [EpisodicSession("fresh", store) for _ in range(6)]
    await asyncio.gather(
        *(s.add_items([{"role": "user", "content": f"w{i}"}]) for i, s in enumerate(sessions))
    )
    assert sorted(i["content"] for i in await sessions[0].get_items()) == [
        f"w{i}" for i in range(6)
    ]


async def test_a_tenant_scoped_store_scopes_the_session(store: EpisodicStore) -> None:
    acme = EpisodicSession("chat", store.for_tenant("acme"))
    other = EpisodicSession("chat", store.for_tenant("other"))
    assert acme.conversation_id != other.conversation_id
    await acme.add_items([{"role": "user", "content": "for acme"}])
    assert await other.get_items() == []
    assert (await store.get_conversation(acme.conversation_id)).tenant_id == "acme"


async def test_after_a_boundary_the_view_starts_with_the_handoff(
    session: EpisodicSession, store: EpisodicStore
) -> None:
    await session.add_items(copy.deepcopy(ITEMS[:4]))
    await store.write_boundary(
        session.conversation_id,
        BoundaryRequest(
            summary="Asked for the weather in Paris; it is sunny.",
            covers_through_seq=4,
            retained=["What is the weather in Paris?"],
            reason="manual",
            expected_boundary_seq=None,
        ),
    )
    await session.add_items([{"role": "user", "content": "And tomorrow?"}])
    items = await session.get_items()
    assert items[0]["role"] == "user"
    assert "sunny" in items[0]["content"]
    assert items[1:] == [
        {"type": "message", "role": "user", "content": "What is the weather in Paris?"},
        {"role": "user", "content": "And tomorrow?"},
    ]


async def test_runner_run_keeps_the_conversation_in_the_session(
    session: EpisodicSession, store: EpisodicStore
) -> None:
    @function_tool
    def weather(city: str) -> str:
        return f"sunny in {city}"

    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Paris"}, call_id="call_a")],
            [assistant_message("It is sunny in Paris.", item_id="msg_a")],
            [assistant_message("Still sunny.", item_id="msg_b")],
        ]
    )
    agent = Agent(name="forecaster", model=model, tools=[weather])
    first = await Runner.run(agent, "Weather in Paris?", session=session)
    assert first.final_output == "It is sunny in Paris."
    second = await Runner.run(agent, "And now?", session=session)
    assert second.final_output == "Still sunny."
    # The second call saw the whole first turn, from the session.
    seen = model.calls[-1].input
    assert [i.get("type", "message") for i in seen] == [
        "message", "function_call", "function_call_output", "message", "message",
    ]  # fmt: skip
    items = await session.get_items()
    assert items[-1]["content"][0]["text"] == "Still sunny."
    head = await store.get_conversation(session.conversation_id)
    assert head.last_seq == len(items) == 6
    assert head.open_tool_calls == {}


async def test_runner_over_many_turns_with_the_worker_compacting_between_them(
    store: EpisodicStore,
) -> None:
    """22 turns, each a tool call and an answer; the worker compacts whenever the trigger
    fires (every 4 user messages here). After each boundary the model's input starts with
    its handoff, never holds an output without its call, and the log keeps every item."""
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=4)
    session = EpisodicSession("long-chat", store)
    worker = CompactionWorker(store, ExtractiveSummarizer(), worker_id="e2e")
    turns = 22

    @function_tool
    def lookup(topic: str) -> str:
        return f"notes on {topic}: " + "details " * 30

    steps: list[Any] = []
    for turn in range(turns):
        steps.append([function_call("lookup", {"topic": f"t{turn}"}, call_id=f"call_{turn}")])
        steps.append([assistant_message(f"answer {turn}", item_id=f"msg_{turn}")])
    model = ScriptedModel(steps)
    agent = Agent(name="researcher", model=model, tools=[lookup])

    handoffs: dict[int, str] = {}  # model call index -> the handoff it should open with
    for turn in range(turns):
        calls_before = len(model.calls)
        context = await store.load_context(session.conversation_id) if turn else None
        result = await Runner.run(agent, f"question {turn}", session=session)
        assert result.final_output == f"answer {turn}"
        if context is not None and context.boundary is not None:
            for index in range(calls_before, len(model.calls)):
                handoffs[index] = context.boundary.summary
        await worker.run_once()

    assert len(handoffs) >= 8, "the worker should have compacted several times"
    for index, call in enumerate(model.calls):
        items = [dict(item) for item in call.input]
        if index in handoffs:
            assert items[0] == {"type": "message", "role": "user", "content": handoffs[index]}
        called = set()
        for item in items:
            if item.get("type") == "function_call":
                called.add(item["call_id"])
            elif item.get("type") == "function_call_output":
                assert item["call_id"] in called, f"an orphan output in model call {index}"
    history = [item async for item in session.get_full_history()]
    assert [i["content"] for i in history if i.get("role") == "user"] == [
        f"question {turn}" for turn in range(turns)
    ]
    assert [i["call_id"] for i in history if i.get("type") == "function_call_output"] == [
        f"call_{turn}" for turn in range(turns)
    ]
    assert len(history) == turns * 4  # question, call, output, answer
    boundaries = [e for e in await store.read_events(session.conversation_id, limit=10_000)
                  if isinstance(e, BoundaryEvent)]  # fmt: skip
    assert len(boundaries) >= 4


async def test_the_runners_compaction_hook_records_the_turns_usage(
    session: EpisodicSession, store: EpisodicStore
) -> None:
    store.trigger = EpisodicCompactionConfig(trigger_context_tokens=50_000)
    usage = Usage(requests=1, input_tokens=60_000, output_tokens=7, total_tokens=60_007)
    model = ScriptedModel([{"output": [assistant_message("hello")], "usage": usage}])
    await Runner.run(Agent(name="a", model=model), "hi", session=session)
    head = await store.get_conversation(session.conversation_id)
    assert head.usage_input_tokens == 60_000
    assert head.due_reason == "context_pressure"  # the worker is woken; nothing summarized
    events = await store.read_events(session.conversation_id)
    assert [e.kind for e in events] == ["message", "message", "usage"]


async def test_settings_are_taken_as_the_sdks_own_sessions_take_them(store: EpisodicStore) -> None:
    assert EpisodicSession("s", store).session_settings == SessionSettings()
    assert EpisodicSession("s", store, session_settings={"limit": 2}).session_settings.limit == 2
    with pytest.raises(TypeError, match="limitt"):
        EpisodicSession("s", store, session_settings={"limitt": 1})


async def test_an_erased_session_is_not_recreated_by_its_next_write(
    session: EpisodicSession, store: EpisodicStore
) -> None:
    await session.add_items(copy.deepcopy(ITEMS[:2]))
    await store.erase_conversation(session.conversation_id, reason="user asked")
    assert await session.get_items() == []
    with pytest.raises(ErasedConversationError):
        await session.add_items(copy.deepcopy(ITEMS[:2]))
    await store.create_conversation(conversation_id=session.conversation_id, reuse_erased_id=True)
    await session.add_items(copy.deepcopy(ITEMS[:2]))
    assert await session.get_items() == ITEMS[:2]
