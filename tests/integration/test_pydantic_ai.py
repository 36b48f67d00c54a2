"""EpisodicHistory with a real Pydantic AI ``Agent`` and its ``FunctionModel`` (no network),
on PostgreSQL and SQLite: runs with parallel tool calls saved and loaded part for part; a
save made again writes nothing; many turns with the worker compacting between them (every
request then starts with the system prompt and the handoff, holds no return without its call,
and the log holds every message once); a run that grows long continues from the boundary the
worker wrote meanwhile; two runs at once; deferred tool calls; and typed refusals."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import pytest

from episodic import BoundaryEvent, BoundaryRequest, EpisodicStore, MessageEvent, RunCompletedEvent
from episodic.errors import OrphanToolResultError, ValidationError
from episodic.formats.pydantic_ai import pydantic_ai_messages_of
from episodic.policy import EpisodicCompactionConfig
from episodic.summarizers.extractive import ExtractiveSummarizer
from episodic.worker import CompactionOptions
from episodic.worker.runner import CompactionWorker
from tests.support import require_extra

require_extra("pydantic_ai", "pydantic-ai")
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    BinaryContent,
    FilePart,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from episodic.integrations.pydantic_ai import EpisodicHistory, session_conversation_id  # noqa: E402

SYSTEM = "You research."
#: These conversations are small; the worker would rightly write no boundary for them if
#: the handoff were not smaller. What is tested here is where it cuts and what runs see.
WHERE_IT_CUTS = CompactionOptions(require_smaller=False)


def lookup(topic: str) -> str:
    """Notes on a topic."""
    return f"notes on {topic}: " + "details " * 30


def question_of(messages: list[ModelMessage]) -> str:
    """The number of the newest ``question N`` prompt (the run's own: retained ones and the
    handoff come before it)."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in reversed(message.parts):
                if isinstance(part, UserPromptPart) and str(part.content).startswith("question"):
                    return str(part.content).split()[-1]
    return "?"


class Researcher:
    """For each question, one lookup (two in parallel on even questions, three on every
    third), then the answer; keeps every request it is sent."""

    def __init__(self) -> None:
        self.requests: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        turn = question_of(messages)
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart(f"answer {turn}")])
        width = 3 if int(turn) % 3 == 0 else 2 if int(turn) % 2 == 0 else 1
        return ModelResponse(
            parts=[
                ToolCallPart("lookup", {"topic": f"{turn}.{i}"}, tool_call_id=f"call-{turn}-{i}")
                for i in range(width)
            ]
        )


def researcher_agent(model: Researcher) -> Agent[None, str]:
    return Agent(
        FunctionModel(model), system_prompt=SYSTEM, instructions="Be brief.", tools=[lookup]
    )


async def log_messages(store: EpisodicStore, history: EpisodicHistory) -> list[MessageEvent]:
    events = await store.read_events(history.conversation_id, limit=10_000)
    return [e for e in events if isinstance(e, MessageEvent)]


async def whole_log(store: EpisodicStore, history: EpisodicHistory) -> list[ModelMessage]:
    """Every message the log holds, boundaries ignored, as Pydantic AI messages."""
    messages = [e.message for e in await log_messages(store, history)]
    return ModelMessagesTypeAdapter.validate_python(pydantic_ai_messages_of(messages))


def check_pairing(messages: list[ModelMessage], where: str) -> None:
    """Each return answers a call of the response right before it, and each call of a
    response followed by a request is answered there."""
    for index, message in enumerate(messages):
        if not isinstance(message, ModelRequest):
            continue
        returns = {p.tool_call_id for p in message.parts if isinstance(p, ToolReturnPart)}
        before = messages[index - 1] if index else None
        calls = (
            {p.tool_call_id for p in before.parts if isinstance(p, ToolCallPart)}
            if isinstance(before, ModelResponse)
            else set()
        )
        assert returns <= calls, f"{where}: returns {returns - calls} answer no call before them"
        assert calls <= returns, f"{where}: calls {calls - returns} have no return"
    assert isinstance(messages[0], ModelRequest), f"{where}: does not start with a request"


async def test_runs_with_parallel_calls_load_back_part_for_part(store: EpisodicStore) -> None:
    model = Researcher()
    agent = researcher_agent(model)
    everything: list[ModelMessage] = []
    for turn in range(4):
        history = EpisodicHistory("chat-7", store)
        result = await agent.run(f"question {turn}", message_history=await history.load())
        await history.save(result)
        everything = result.all_messages()
        # a new history object: as the next request, in another process, would load it
        assert await EpisodicHistory("chat-7", store).load() == everything
    first = everything[0]
    assert isinstance(first, ModelRequest)
    assert isinstance(first.parts[0], SystemPromptPart)
    assert first.instructions == "Be brief."
    assert any(len(m.parts) == 3 for m in everything if isinstance(m, ModelRequest))  # parallel
    usage = [m.usage for m in everything if isinstance(m, ModelResponse)]
    assert all(u.input_tokens > 0 for u in usage)  # FunctionModel's estimates, kept
    events = await store.read_events(session_conversation_id("chat-7"), limit=1_000)
    assert sum(isinstance(e, RunCompletedEvent) for e in events) == 4


async def test_files_and_bytes_come_back_as_pydantic_ais_own_json_gives_them(
    store: EpisodicStore,
) -> None:
    image = BinaryContent(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, media_type="image/png")
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(["What is this?", image, ImageUrl("https://x/y.png")])]),
        ModelResponse(parts=[TextPart("A chart."), FilePart(image)]),
    ]
    history = EpisodicHistory("files", store)
    await history.append(messages)
    own = ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(messages))
    assert await EpisodicHistory("files", store).load() == own
    (user, assistant) = [e.message for e in await log_messages(store, history)]
    assert "[image/png] <1,032 bytes>" in user.text  # what a summarizer reads: not the bytes
    assert "<1,032 bytes>" in assistant.text


async def test_saving_a_run_again_writes_nothing(store: EpisodicStore) -> None:
    agent = researcher_agent(Researcher())
    history = EpisodicHistory("again", store)
    result = await agent.run("question 2", message_history=await history.load())
    stored = await history.save(result)
    assert len(stored) == 1 + 1 + 2 + 1  # prompt, the two calls, their two returns, answer
    before = await store.read_events(history.conversation_id)
    assert await history.save(result) == []
    # another process saving the same run: the store gives back what the first stored
    elsewhere = await EpisodicHistory("again", store).save(result)
    assert [e.seq for e in elsewhere] == [e.seq for e in stored]
    await EpisodicHistory("again", store).append(result.new_messages()[1:3])
    assert await store.read_events(history.conversation_id) == before


async def test_many_turns_with_the_worker_compacting_between_them(store: EpisodicStore) -> None:
    """22 turns, each a single or parallel lookup and an answer, the worker compacting
    whenever the trigger fires. After each boundary every model request starts with the
    system prompt and the handoff, each return follows its call, and the log keeps every
    message of every run, once."""
    store.trigger = EpisodicCompactionConfig(trigger_context_tokens=600)
    model = Researcher()
    agent = researcher_agent(model)
    worker = CompactionWorker(store, ExtractiveSummarizer(), worker_id="pydantic-ai-e2e")
    cid = session_conversation_id("long")
    turns = 22
    runs: list[list[ModelMessage]] = []
    handoffs: dict[int, str] = {}  # model request index -> the handoff it should open with
    for turn in range(turns):
        history = EpisodicHistory("long", store)
        loaded = await history.load()
        before = len(model.requests)
        result = await agent.run(f"question {turn}", message_history=loaded)
        assert result.output == f"answer {turn}"
        await history.save(result)
        runs.append(result.new_messages())
        context = await store.load_context(cid) if turn else None
        if context is not None and context.boundary is not None:
            for index in range(before, len(model.requests)):
                handoffs[index] = context.boundary.summary
        await worker.run_once()

    assert len(handoffs) >= 30, "the worker should have compacted many times"
    for index, messages in enumerate(model.requests):
        check_pairing(messages, f"request {index}")
        first = messages[0]
        assert isinstance(first, ModelRequest)
        assert first.parts[0] == SystemPromptPart(SYSTEM, timestamp=first.parts[0].timestamp)
        if index in handoffs:
            prompts = [p for p in first.parts if isinstance(p, UserPromptPart)]
            assert prompts[0].content == handoffs[index], f"request {index}: not the handoff"
            # the tail, not the history: a few turns' calls, whatever the turn
            calls = [p for m in messages if isinstance(m, ModelResponse) for p in m.tool_calls]
            assert len(calls) <= 8, f"request {index} holds {len(calls)} calls"
    assert await whole_log(store, EpisodicHistory("long", store)) == [m for r in runs for m in r]
    groups = Counter(
        (e.message.client_id or "").rsplit(":", 1)[0]
        for e in await log_messages(store, EpisodicHistory("long", store))
    )
    assert len(groups) == sum(len(r) for r in runs)
    boundaries = [
        e for e in await store.read_events(cid, limit=10_000) if isinstance(e, BoundaryEvent)
    ]
    assert len(boundaries) >= 6


class LongTask:
    """One prompt, then ``steps`` lookups one after another, then the answer."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.requests: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        if question_of(messages) != "long":
            return Researcher()(messages, info)
        done = sum(
            isinstance(p, ToolReturnPart) and p.tool_call_id.startswith("step-")
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
        )
        if done == self.steps:
            return ModelResponse(parts=[TextPart("all steps done")])
        call = ToolCallPart("step", {"n": done}, tool_call_id=f"step-{done}")
        return ModelResponse(parts=[call])


async def test_a_run_that_grows_long_continues_from_the_workers_boundary(
    store: EpisodicStore,
) -> None:
    """The history processor appends what the run has settled before each model call: the
    run's growth makes the conversation due, the worker (run here by the tool, as a worker
    process would meanwhile) compacts the turns before the run, and the run's next request
    starts from the handoff, with the whole run after it."""
    model = LongTask(steps=8)
    agent = Agent(FunctionModel(model), system_prompt=SYSTEM, tools=[lookup])
    worker = CompactionWorker(store, ExtractiveSummarizer(), options=WHERE_IT_CUTS)
    outcomes: list[str] = []

    @agent.tool_plain
    async def step(n: int) -> str:
        """Do one step of the long task."""
        outcomes.extend(r.outcome for r in await worker.run_once())
        return f"step {n} done: " + "output " * 60

    runs: list[list[ModelMessage]] = []
    for turn in range(4):  # short turns first: what the worker may compact
        history = EpisodicHistory("grows", store)
        result = await agent.run(f"question {turn}", message_history=await history.load())
        await history.save(result)
        runs.append(result.new_messages())
    cid = session_conversation_id("grows")
    pressure = await store.pressure(cid)
    assert pressure.estimated_context_tokens is not None
    # not due before the long run: its own growth makes it so
    store.trigger = EpisodicCompactionConfig(
        trigger_context_tokens=pressure.estimated_context_tokens + 400
    )
    assert await worker.run_once() == []

    history = EpisodicHistory("grows", store)
    before = len(model.requests)
    result = await agent.run(
        "question long", message_history=await history.load(), capabilities=[history.capability()]
    )
    assert result.output == "all steps done"
    await history.save(result)
    runs.append(result.new_messages())

    assert "succeeded" in outcomes
    (boundary,) = [e for e in await store.read_events(cid) if isinstance(e, BoundaryEvent)]
    sent = model.requests[before:]
    compacted = [
        messages
        for messages in sent
        if any(
            isinstance(p, UserPromptPart) and p.content == boundary.summary
            for p in messages[0].parts
        )
    ]
    assert compacted, "the run should have continued from the worker's boundary"
    assert compacted[-1] is sent[-1]
    for messages in sent:
        check_pairing(messages, "the long run")
        assert isinstance(messages[0].parts[0], SystemPromptPart)  # kept through the swap
    last = sent[-1]
    # the turns before the run are the handoff's now: their answers are not sent again
    answers = [m.text for m in last if isinstance(m, ModelResponse) and m.text]
    assert not [a for a in answers if a.startswith("answer")]
    prompts = [p.content for m in last for p in m.parts if isinstance(p, UserPromptPart)]
    assert prompts[-1] == "question long"  # the run's own prompt, after the handoff
    assert sum(isinstance(m, ModelResponse) for m in last) == 8  # every step of the run
    assert result.new_messages()[0] == runs[-1][0]
    # every message once: the processor's appends and the save's, nothing twice
    assert await whole_log(store, history) == [m for r in runs for m in r]
    # and the next request loads the handoff, then the whole run
    handoff, *after = await EpisodicHistory("grows", store).load()
    assert isinstance(handoff, ModelRequest)
    assert [type(p) for p in handoff.parts][:2] == [SystemPromptPart, UserPromptPart]
    assert after == result.new_messages()


@pytest.mark.parametrize("processor", [False, True])
async def test_two_runs_at_once_lose_nothing_and_interleave_nothing(
    store: EpisodicStore, processor: bool
) -> None:
    """Two requests of one session run at once from the same history. Each run's messages
    are one batch, so they never interleave; with the history processor, which appends as
    the runs go, they interleave at settled points only, and none is lost or doubled."""
    agent = researcher_agent(Researcher())

    @agent.tool_plain
    async def slow(topic: str) -> str:
        """A lookup that takes a while."""
        await asyncio.sleep(0.01)
        return f"slow notes on {topic}"

    first = EpisodicHistory("both", store)
    seed = await agent.run("question 1", message_history=await first.load())
    await first.save(seed)

    async def run(text: str) -> list[ModelMessage]:
        history = EpisodicHistory("both", store)
        loaded = await history.load()
        capabilities = [history.capability()] if processor else None
        result = await agent.run(text, message_history=loaded, capabilities=capabilities)
        await history.save(result)
        return result.new_messages()

    a, b = await asyncio.gather(run("question 4"), run("question 6"))
    log = await whole_log(store, first)
    assert log[: len(seed.new_messages())] == seed.new_messages()
    rest = log[len(seed.new_messages()) :]
    if processor:
        assert len(rest) == len(a) + len(b)
        assert [m for m in rest if m in a] == a
        assert [m for m in rest if m in b] == b
    else:
        assert rest in ([*a, *b], [*b, *a])
    loaded = await EpisodicHistory("both", store).load()
    check_pairing(loaded, "the next load")
    assert loaded == log
    events = await store.read_events(first.conversation_id, limit=1_000)
    assert sum(isinstance(e, RunCompletedEvent) for e in events) == 3


async def test_a_run_waiting_for_deferred_calls_loads_waiting_and_resumes(
    store: EpisodicStore,
) -> None:
    def approver(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("deployed")])
        return ModelResponse(parts=[ToolCallPart("deploy", {"env": "prod"}, tool_call_id="d1")])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(approver), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True)
    def deploy(env: str) -> str:
        """Deploy."""
        return f"deployed to {env}"

    history = EpisodicHistory("approve", store)
    waiting = await agent.run("deploy it", message_history=await history.load())
    assert isinstance(waiting.output, DeferredToolRequests)
    await history.save(waiting)
    events = await store.read_events(history.conversation_id)
    assert not any(isinstance(e, RunCompletedEvent) for e in events)  # the run waits

    history = EpisodicHistory("approve", store)
    loaded = await history.load()
    assert loaded == waiting.all_messages()  # the call given back waiting, not closed
    done = await agent.run(
        message_history=loaded, deferred_tool_results=DeferredToolResults(approvals={"d1": True})
    )
    assert done.output == "deployed"
    await history.save(done)
    assert await EpisodicHistory("approve", store).load() == done.all_messages()
    events = await store.read_events(history.conversation_id)
    assert isinstance(events[-1], RunCompletedEvent)


async def test_the_search_tool_recalls_what_a_boundary_summarized(store: EpisodicStore) -> None:
    history = EpisodicHistory("recall", store)
    await history.append(
        [
            ModelRequest(parts=[UserPromptPart("why does the deploy fail?")]),
            ModelResponse(parts=[TextPart("It fails with E4711 in orders/migrate.py.")]),
        ]
    )
    head = await store.get_conversation(history.conversation_id)
    await store.write_boundary(
        history.conversation_id,
        BoundaryRequest(
            summary="A deploy failed.",
            covers_through_seq=head.last_seq,
            reason="context_pressure",
            expected_boundary_seq=None,
        ),
    )

    def recaller(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(str(returns[0].content))])
        call = ToolCallPart("search_conversation", {"query": "E4711"}, tool_call_id="s1")
        return ModelResponse(parts=[call])

    agent = Agent(FunctionModel(recaller), tools=[history.search_tool()])
    loaded = await history.load()
    assert [p.content for p in loaded[0].parts if isinstance(p, UserPromptPart)] == [
        "A deploy failed."
    ]
    result = await agent.run("which error was it?", message_history=loaded)
    assert "E4711 in orders/migrate.py" in result.output


async def test_a_session_id_names_one_conversation_per_tenant(store: EpisodicStore) -> None:
    acme, other = store.for_tenant("acme"), store.for_tenant("other")
    agent = researcher_agent(Researcher())
    history = EpisodicHistory("shared-name", acme)
    await history.save(await agent.run("question 1"))
    assert history.conversation_id == session_conversation_id("shared-name", "acme")
    assert await EpisodicHistory("shared-name", other).load() == []
    assert len(await EpisodicHistory("shared-name", acme).load()) == 4


async def test_bad_input_is_refused_with_a_typed_error_and_writes_nothing(
    store: EpisodicStore,
) -> None:
    with pytest.raises(ValidationError, match="session_id must be a non-empty string") as refused:
        EpisodicHistory(42, store)  # type: ignore[arg-type]
    assert refused.value.field == "session_id"
    with pytest.raises(ValidationError, match=r"takes an episodic\.EpisodicStore"):
        EpisodicHistory("s", object())  # type: ignore[arg-type]

    history = EpisodicHistory("refusals", store)
    with pytest.raises(ValidationError, match="an AgentRunResult") as refused:
        await history.save([ModelRequest(parts=[UserPromptPart("hi")])])  # type: ignore[arg-type]
    assert refused.value.field == "result"
    with pytest.raises(ValidationError, match=r"messages\[1\] is a dict") as refused:
        await history.append([ModelRequest(parts=[UserPromptPart("hi")]), {"kind": "request"}])  # type: ignore[list-item]
    assert refused.value.field == "messages[1]"
    with pytest.raises(ValidationError, match="expected a list of Pydantic AI messages"):
        await history.append(ModelRequest(parts=[UserPromptPart("hi")]))  # type: ignore[arg-type]
    nan_call = ModelResponse(parts=[ToolCallPart("f", {"x": math.nan}, tool_call_id="c1")])
    with pytest.raises(ValidationError, match=r"messages\[1\] holds a NaN") as refused:
        await history.append([ModelRequest(parts=[UserPromptPart("hi")]), nan_call])
    assert refused.value.field == "messages[1]"
    opaque = ModelRequest(parts=[ToolReturnPart("f", object(), tool_call_id="c1")])
    with pytest.raises(ValidationError, match="cannot be stored as JSON"):
        await history.append([opaque])
    assert await history.load() == []  # none of these wrote anything

    orphan = ModelRequest(parts=[ToolReturnPart("f", "late", tool_call_id="never-called")])
    with pytest.raises(OrphanToolResultError, match="never-called"):
        await history.append([ModelRequest(parts=[UserPromptPart("hi")]), orphan])
    assert await history.load() == []
    events: list[Any] = await store.read_events(history.conversation_id)
    assert events == []
