"""EpisodicSessionService and compaction, both ways, on PostgreSQL and SQLite: the worker's
boundary is read as ADK's own compaction event followed by the tail; ADK's own compaction
event becomes a boundary; a real ``Runner`` with a scripted model (no network) runs many
turns of function calls with the worker compacting between them; and on PostgreSQL,
``get_session`` and ``append_event`` cost the same round trips at any history length."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from pydantic import Field

from episodic import BoundaryEvent, BoundaryRequest, EpisodicStore, ValidationError
from episodic.policy import EpisodicCompactionConfig
from episodic.summarizers.extractive import ExtractiveSummarizer
from episodic.worker.runner import CompactionWorker
from tests.support import require_extra, store_through_proxy

require_extra("google.adk", "google-adk")
from google.adk.agents.llm_agent import LlmAgent  # noqa: E402
from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions, EventCompaction  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.genai import types  # noqa: E402

from episodic.integrations.adk import (  # noqa: E402
    ADK_COMPACTION_REASON,
    EpisodicSessionService,
    session_conversation_id,
)


@pytest.fixture
async def service(store: EpisodicStore) -> EpisodicSessionService:
    return EpisodicSessionService(store)


def _user(text: str, timestamp: float) -> Event:
    return Event(
        invocation_id="inv",
        author="user",
        timestamp=timestamp,
        content=types.Content(role="user", parts=[types.Part(text=text)]),
    )


def _call(call_id: str, timestamp: float) -> Event:
    part = types.Part(function_call=types.FunctionCall(id=call_id, name="lookup", args={}))
    return Event(
        invocation_id="inv",
        author="agent",
        timestamp=timestamp,
        content=types.Content(role="model", parts=[part]),
    )


def _response(call_id: str, timestamp: float) -> Event:
    part = types.Part(
        function_response=types.FunctionResponse(id=call_id, name="lookup", response={"r": 1})
    )
    return Event(
        invocation_id="inv",
        author="agent",
        timestamp=timestamp,
        content=types.Content(role="user", parts=[part]),
    )


def _answer(text: str, timestamp: float) -> Event:
    return Event(
        invocation_id="inv",
        author="agent",
        timestamp=timestamp,
        content=types.Content(role="model", parts=[types.Part(text=text)]),
    )


async def _turns(service: EpisodicSessionService, session: Any, turns: int, start: int = 0) -> None:
    for turn in range(start, start + turns):
        at = 1_000.0 + turn * 10
        for event in (
            _user(f"question {turn}", at),
            _call(f"c{turn}", at + 1),
            _response(f"c{turn}", at + 2),
            _answer(f"answer {turn}", at + 3),
        ):
            await service.append_event(session, event)


async def test_a_boundary_reads_as_adks_compaction_event_then_the_tail(
    service: EpisodicSessionService, store: EpisodicStore
) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await _turns(service, session, 5)
    cid = session_conversation_id("app", "u", "s")
    head = await store.get_conversation(cid)
    covers = head.last_seq - 4  # the last turn stays after the cut
    await store.write_boundary(
        cid,
        BoundaryRequest(
            summary="the user asked four questions",
            covers_through_seq=covers,
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    first, *tail = got.events
    compaction = first.actions.compaction
    assert compaction is not None
    assert "the user asked four questions" in compaction.compacted_content.parts[0].text
    assert compaction.end_timestamp < tail[0].timestamp
    assert [e.timestamp for e in tail] == [1040.0, 1041.0, 1042.0, 1043.0]
    assert tail == session.events[-4:]

    # A session read before the boundary is not stale for it: a run holding it goes on.
    await service.append_event(session, _user("question 5", 1050.0))
    # And the session read after it is a revision ADK can append to, but not once the
    # other has appended.
    with pytest.raises(StaleSessionError):
        await service.append_event(got, _user("question 5", 1050.0))
    # And the whole history is there for a rewind.
    full = await service.with_full_history().get_session(
        app_name="app", user_id="u", session_id="s"
    )
    assert full is not None
    assert full.events == session.events
    assert len(full.events) == 21


async def test_adks_own_compaction_event_becomes_a_boundary(
    service: EpisodicSessionService, store: EpisodicStore
) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await _turns(service, session, 4)
    summary = types.Content(role="model", parts=[types.Part(text="turns 0 to 2, summarized")])
    compaction = Event(
        invocation_id="c",
        author="user",
        timestamp=1_100.0,
        actions=EventActions(
            compaction=EventCompaction(
                start_timestamp=1_000.0, end_timestamp=1_023.0, compacted_content=summary
            )
        ),
    )
    await service.append_event(session, compaction)
    cid = session_conversation_id("app", "u", "s")
    boundaries = [e for e in await store.read_events(cid) if isinstance(e, BoundaryEvent)]
    assert len(boundaries) == 1
    assert boundaries[0].reason == ADK_COMPACTION_REASON
    assert boundaries[0].summary == "turns 0 to 2, summarized"
    context = await store.load_context(cid)
    assert context.messages[0].text.endswith("turns 0 to 2, summarized")

    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    # ADK's own event, then the turn it did not cover: read from the tail alone.
    assert [e.timestamp for e in got.events] == [1030.0, 1031.0, 1032.0, 1033.0, 1100.0]
    assert got.events[-1] == compaction


async def test_no_boundary_where_adks_compaction_would_split_a_call(
    service: EpisodicSessionService, store: EpisodicStore
) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await service.append_event(session, _user("q", 1.0))
    await service.append_event(session, _call("open", 2.0))
    summary = types.Content(role="model", parts=[types.Part(text="so far")])
    await service.append_event(
        session,
        Event(
            author="user",
            timestamp=3.0,
            actions=EventActions(
                compaction=EventCompaction(
                    start_timestamp=1.0, end_timestamp=2.0, compacted_content=summary
                )
            ),
        ),
    )
    cid = session_conversation_id("app", "u", "s")
    assert not [e for e in await store.read_events(cid) if isinstance(e, BoundaryEvent)]
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert len(got.events) == 3


class ScriptedLlm(BaseLlm):
    """A model that, for each question, calls ``lookup`` once and then answers, and keeps
    every request's contents (no network)."""

    requests: list[list[types.Content]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(list(llm_request.contents))
        last = llm_request.contents[-1]
        responded = any(part.function_response for part in last.parts or ())
        question = next(
            (p.text for c in reversed(llm_request.contents) if c.role == "user"
             for p in c.parts or () if p.text and p.text.startswith("question")),
            "question ?",
        )  # fmt: skip
        turn = question.split()[-1]
        if responded:
            part = types.Part(text=f"answer {turn}")
        else:
            part = types.Part(
                function_call=types.FunctionCall(
                    id=f"call-{turn}-{uuid.uuid4().hex[:6]}", name="lookup", args={"topic": turn}
                )
            )
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def lookup(topic: str) -> str:
    """Notes on a topic."""
    return f"notes on {topic}: " + "details " * 30


async def test_runner_over_many_turns_with_the_worker_compacting_between_them(
    store: EpisodicStore,
) -> None:
    """22 turns, each a function call and an answer, the worker compacting whenever the
    trigger fires. After each boundary the model's contents start with its handoff, every
    function response follows its call, and the log keeps every event."""
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=4)
    service = EpisodicSessionService(store)
    model = ScriptedLlm(model="scripted")
    agent = LlmAgent(name="researcher", model=model, tools=[lookup], instruction="Research.")
    runner = Runner(agent=agent, app_name="app", session_service=service)
    worker = CompactionWorker(store, ExtractiveSummarizer(), worker_id="adk-e2e")
    await service.create_session(app_name="app", user_id="u", session_id="long")
    cid = session_conversation_id("app", "u", "long")
    turns = 22

    handoffs: dict[int, str] = {}  # model request index -> the handoff it should open with
    for turn in range(turns):
        before = len(model.requests)
        context = await store.load_context(cid)
        message = types.Content(role="user", parts=[types.Part(text=f"question {turn}")])
        answers = [
            part.text
            async for event in runner.run_async(user_id="u", session_id="long", new_message=message)
            if event.content
            for part in event.content.parts or ()
            if part.text
        ]
        assert answers == [f"answer {turn}"]
        if context.boundary is not None:
            for index in range(before, len(model.requests)):
                handoffs[index] = context.boundary.summary
        await worker.run_once()

    assert len(handoffs) >= 8, "the worker should have compacted several times"
    for index, contents in enumerate(model.requests):
        texts = [p.text for c in contents for p in c.parts or () if p.text]
        if index in handoffs:
            assert handoffs[index] in texts[0], f"request {index} does not open with its handoff"
            # the tail, not the history: a few turns' calls, whatever the turn
            calls = [p for c in contents for p in c.parts or () if p.function_call]
            assert len(calls) <= 6, f"request {index} holds {len(calls)} calls"
        called: set[str] = set()
        for content in contents:
            for part in content.parts or ():
                if part.function_call:
                    called.add(part.function_call.id)
                elif part.function_response:
                    assert part.function_response.id in called, f"orphan in request {index}"
    full = await service.with_full_history().get_session(
        app_name="app", user_id="u", session_id="long"
    )
    assert full is not None
    questions = [
        e.content.parts[0].text
        for e in full.events
        if e.author == "user" and e.content and e.content.parts[0].text
    ]
    assert questions == [f"question {turn}" for turn in range(turns)]
    assert len(full.events) == turns * 4  # question, call, response, answer
    boundaries = [
        e for e in await store.read_events(cid, limit=10_000) if isinstance(e, BoundaryEvent)
    ]
    assert len(boundaries) >= 4


async def test_get_session_and_append_cost_the_same_round_trips_at_any_length(
    postgres_url: str,
) -> None:
    async with store_through_proxy(postgres_url) as (store, counter):
        service = EpisodicSessionService(store)
        costs = []
        for length in (10, 200):
            sid = f"s{length}"
            session = await service.create_session(app_name="app", user_id="u", session_id=sid)
            await _turns(service, session, length // 4)
            cid = session_conversation_id("app", "u", sid)
            head = await store.get_conversation(cid)
            await store.write_boundary(
                cid,
                BoundaryRequest(
                    summary="all of it",
                    covers_through_seq=head.last_seq,
                    reason="context_pressure",
                    expected_boundary_seq=None,
                ),
            )
            await _turns(service, session, 1, start=length)
            await service.get_session(app_name="app", user_id="u", session_id=sid)  # prepares
            before = counter.round_trips
            got = await service.get_session(app_name="app", user_id="u", session_id=sid)
            read = counter.round_trips - before
            assert got is not None
            before = counter.round_trips
            await service.append_event(got, _user("one more", 99_999.0))
            costs.append((read, counter.round_trips - before))
        assert costs[0] == costs[1] == (2, 1)


def _compaction(start: float, end: float, text: str, at: float) -> Event:
    return Event(
        invocation_id=f"c{at}",
        author="user",
        timestamp=at,
        actions=EventActions(
            compaction=EventCompaction(
                start_timestamp=start,
                end_timestamp=end,
                compacted_content=types.Content(role="model", parts=[types.Part(text=text)]),
            )
        ),
    )


def _summaries(events: list[Event]) -> list[str]:
    return [
        e.actions.compaction.compacted_content.parts[0].text
        for e in events
        if e.actions.compaction is not None
    ]


async def test_sliding_window_compactions_all_stand_until_one_contains_them(
    service: EpisodicSessionService, store: EpisodicStore
) -> None:
    """ADK's sliding window leaves each window's summary standing; a later compaction that
    contains earlier ones replaces them. get_session, read from the tail, shows what ADK's
    own request builder would keep."""
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await _turns(service, session, 3)  # timestamps 1000 .. 1023
    await service.append_event(session, _compaction(1000.0, 1013.0, "window one", 1024.0))
    await _turns(service, session, 2, start=3)  # 1030 .. 1043
    await service.append_event(session, _compaction(1010.0, 1033.0, "window two", 1044.0))
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert _summaries(got.events) == ["window one", "window two"]
    assert [e.timestamp for e in got.events if not e.actions.compaction] == [
        1040.0, 1041.0, 1042.0, 1043.0,
    ]  # fmt: skip
    cid = session_conversation_id("app", "u", "s")
    context = await store.load_context(cid)
    assert "window one" in context.messages[0].text
    assert "window two" in context.messages[0].text

    await service.append_event(session, _compaction(1000.0, 1043.0, "everything", 1050.0))
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert _summaries(got.events) == ["everything"]
    assert len(got.events) == 1


async def test_a_worker_handoff_stands_beside_adks_later_compaction(
    service: EpisodicSessionService, store: EpisodicStore
) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await _turns(service, session, 2)
    cid = session_conversation_id("app", "u", "s")
    head = await store.get_conversation(cid)
    await store.write_boundary(
        cid,
        BoundaryRequest(
            summary="the worker's handoff",
            covers_through_seq=head.last_seq,
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )
    await _turns(service, session, 2, start=2)  # 1020 .. 1033
    await service.append_event(session, _compaction(1020.0, 1023.0, "ADK's window", 1034.0))
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    texts = _summaries(got.events)
    assert len(texts) == 2
    assert "the worker's handoff" in texts[0]
    assert texts[1] == "ADK's window"
    assert [e.timestamp for e in got.events if not e.actions.compaction] == [
        1030.0, 1031.0, 1032.0, 1033.0,
    ]  # fmt: skip


async def test_a_compaction_ending_at_parallel_responses_cuts_after_all_of_them(
    service: EpisodicSessionService, store: EpisodicStore
) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await service.append_event(session, _user("q", 1.0))
    calls = [
        types.Part(function_call=types.FunctionCall(id=f"p{i}", name="lookup", args={}))
        for i in range(3)
    ]
    responses = [
        types.Part(function_response=types.FunctionResponse(id=f"p{i}", name="lookup", response={}))
        for i in range(3)
    ]
    await service.append_event(
        session,
        Event(author="agent", timestamp=2.0, content=types.Content(role="model", parts=calls)),
    )
    await service.append_event(
        session,
        Event(author="agent", timestamp=3.0, content=types.Content(role="user", parts=responses)),
    )
    await service.append_event(session, _answer("done", 4.0))
    await service.append_event(session, _compaction(1.0, 3.0, "three lookups", 5.0))
    cid = session_conversation_id("app", "u", "s")
    boundaries = [e for e in await store.read_events(cid) if isinstance(e, BoundaryEvent)]
    assert len(boundaries) == 1
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert [e.timestamp for e in got.events] == [4.0, 5.0]


async def test_a_compaction_that_cannot_be_a_boundary_still_appends(
    service: EpisodicSessionService, store: EpisodicStore
) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await _turns(service, session, 1)
    blank = _compaction(1000.0, 1003.0, "   ", 1004.0)  # no summary to write
    await service.append_event(session, blank)
    cid = session_conversation_id("app", "u", "s")
    assert not [e for e in await store.read_events(cid) if isinstance(e, BoundaryEvent)]
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert got.events == session.events


async def test_a_long_running_tool_answers_twice(service: EpisodicSessionService) -> None:
    """ADK's LongRunningFunctionTool: an interim response now, the final one later, both
    for the same call id, as ADK's own services store them."""
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    call = types.Part(function_call=types.FunctionCall(id="lr1", name="approve", args={}))
    await service.append_event(
        session,
        Event(
            author="agent",
            content=types.Content(role="model", parts=[call]),
            long_running_tool_ids={"lr1"},
        ),
    )
    for status in ("pending", "approved"):
        answer = types.Part(
            function_response=types.FunctionResponse(
                id="lr1", name="approve", response={"status": status}
            )
        )
        await service.append_event(
            session, Event(author="agent", content=types.Content(role="user", parts=[answer]))
        )
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert got.events == session.events
    assert len(got.events) == 3
    # A second answer to a call that is not long-running is still refused.
    plain = types.Part(function_call=types.FunctionCall(id="c1", name="f", args={}))
    await service.append_event(
        session, Event(author="agent", content=types.Content(role="model", parts=[plain]))
    )
    again = types.Part(function_response=types.FunctionResponse(id="c1", name="f", response={}))
    for attempt in range(2):
        event = Event(author="agent", content=types.Content(role="user", parts=[again]))
        if attempt == 0:
            await service.append_event(session, event)
        else:
            with pytest.raises(ValidationError):
                await service.append_event(session, event)
