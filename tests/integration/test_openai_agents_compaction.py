"""The OpenAI Agents SDK's own compaction (``OpenAIResponsesCompactionSession``, its client
faked) wrapped around EpisodicSession, on both backends: through the suffix-snapshot hook it
appends a boundary whose handoff is what the SDK's stores would keep, the log keeps every
item, a write after the snapshot keeps the history as it is, and a cancelled run settles the
boundary before a newer append. Also: a cancelled ``add_items`` lands whole or not at all,
and the worker never covers a run still in progress.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

from episodic import BoundaryEvent, EpisodicStore, MessageEvent
from episodic.policy import EpisodicCompactionConfig
from episodic.store.projection import rebuild_head
from episodic.summarizers.extractive import ExtractiveSummarizer
from episodic.worker import CompactionOptions
from episodic.worker.runner import CompactionWorker
from tests.support import counters_of, require_extra

agents = require_extra("agents", "openai-agents")
from agents import Agent, RunConfig, Runner, set_tracing_disabled  # noqa: E402
from agents.memory import OpenAIResponsesCompactionSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from episodic.integrations.openai_agents import (  # noqa: E402
    SDK_COMPACTION_REASON,
    EpisodicSession,
)

set_tracing_disabled(True)

#: These sessions are a few words each, smaller than any handoff: the worker would rightly
#: write no boundary for them. What is tested here is where it cuts and what it expects.
WHERE_IT_CUTS = CompactionOptions(require_smaller=False)

SUMMARY: dict[str, Any] = {"type": "compaction", "id": "cmp", "encrypted_content": "opaque"}
ORIGINAL: list[dict[str, Any]] = [{"role": "user", "content": f"question {i}"} for i in range(4)]


def compacting(session: EpisodicSession, client: Any, **options: Any) -> Any:
    return OpenAIResponsesCompactionSession(
        session.session_id,
        session,
        client=client,
        compaction_mode="input",
        should_trigger_compaction=lambda _: True,
        **options,
    )


def client_returning(*output: dict[str, Any], side_effect: Any = None) -> MagicMock:
    client = MagicMock()
    client.responses.compact = AsyncMock(
        return_value=SimpleNamespace(output=list(output)), side_effect=side_effect
    )
    return client


def reply(text: str = "done") -> Any:
    return assistant_message(text, item_id=f"msg_{text}")


async def run_once(session: Any, text: str = "continue", **config: Any) -> None:
    model = ScriptedModel([[reply()]])
    await Runner.run(
        Agent(name="worker", model=model), text, session=session, run_config=RunConfig(**config)
    )


async def events_of(store: EpisodicStore, session: EpisodicSession) -> list[Any]:
    return await store.read_events(session.conversation_id, limit=10_000)


async def check_head(store: EpisodicStore, session: EpisodicSession) -> None:
    head = await store.get_conversation(session.conversation_id)
    assert rebuild_head(await events_of(store, session)) == counters_of(head)


async def test_a_whole_history_compaction_is_a_boundary_and_the_log_keeps_everything(
    store: EpisodicStore,
) -> None:
    session = EpisodicSession("compacted", store)
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    client = client_returning(SUMMARY)
    await run_once(compacting(session, client))

    client.responses.compact.assert_awaited_once()
    sent = client.responses.compact.call_args.kwargs["input"]
    assert sent[: len(ORIGINAL)] == ORIGINAL  # the model saw everything: all of it replaced
    assert await session.get_items() == [SUMMARY]
    events = await events_of(store, session)
    boundary = events[-1]
    assert isinstance(boundary, BoundaryEvent)
    assert boundary.reason == SDK_COMPACTION_REASON
    assert boundary.handoff_items == (SUMMARY,)
    assert boundary.covers_through_seq == len(ORIGINAL) + 2  # the questions, continue, done
    history = [item async for item in session.get_full_history()]
    assert history[: len(ORIGINAL)] == ORIGINAL
    assert next(i.get("content") for i in history[len(ORIGINAL) :]) == "continue"
    assert len(history) == len(ORIGINAL) + 2
    context = await store.load_context(session.conversation_id)
    assert context.to_responses() == [SUMMARY]
    await check_head(store, session)


async def test_a_partial_compaction_keeps_what_came_before_the_suffix(
    store: EpisodicStore,
) -> None:
    """With a window of one stored item, the model saw the last question, the new one and
    the answer: those are replaced, the rest stays, in front of the summary."""
    session = EpisodicSession("partial", store)
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    await run_once(compacting(session, client_returning(SUMMARY)), session_settings={"limit": 1})
    assert await session.get_items() == [*ORIGINAL[:-1], SUMMARY]
    boundary = (await events_of(store, session))[-1]
    assert isinstance(boundary, BoundaryEvent)
    assert boundary.handoff_items == (*ORIGINAL[:-1], SUMMARY)
    newer = {"role": "user", "content": "after the summary"}
    await session.add_items([newer])  # type: ignore[list-item]
    assert await session.get_items() == [*ORIGINAL[:-1], SUMMARY, newer]
    assert await session.get_items(limit=2) == [SUMMARY, newer]
    await check_head(store, session)


@pytest.mark.parametrize("operation", ["append", "pop", "clear"])
async def test_a_write_after_the_snapshot_keeps_the_history_as_it_is(
    store: EpisodicStore, operation: str
) -> None:
    session = EpisodicSession("raced", store)
    other = EpisodicSession("raced", store)  # another process's session, same conversation
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    newer = {"role": "user", "content": "concurrent"}
    expected = [*ORIGINAL, {"role": "user", "content": "continue"}]

    async def compact(**_: Any) -> Any:
        if operation == "append":
            await other.add_items([newer])  # type: ignore[list-item]
        elif operation == "pop":
            popped = await other.pop_item()
            assert popped is not None
            assert popped.get("content") == [
                {"type": "output_text", "text": "done", "annotations": [], "logprobs": []}
            ]
        else:
            await other.clear_session()
        return SimpleNamespace(output=[SUMMARY])

    await run_once(compacting(session, client_returning(side_effect=compact)))
    items = await session.get_items()
    if operation == "append":
        assert items[: len(expected)] == expected
        assert items[-1] == newer
        assert len(items) == 7
    elif operation == "pop":
        assert items == expected
    else:
        assert items == []
    assert not any(isinstance(e, BoundaryEvent) for e in await events_of(store, session))
    await check_head(store, session)


async def test_a_cancelled_run_settles_its_boundary_before_a_newer_append(
    store: EpisodicStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancellation after commit: the boundary is written, the Runner's task is cancelled
    (twice) before it hears so, and an append made meanwhile through the same session waits
    for the outcome and lands after the boundary."""
    session = EpisodicSession("cancelled", store)
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    committed, release = asyncio.Event(), asyncio.Event()
    write_boundary = store.write_boundary

    async def acknowledged_late(*args: Any, **kwargs: Any) -> BoundaryEvent:
        written = await write_boundary(*args, **kwargs)
        committed.set()
        await release.wait()
        return written

    monkeypatch.setattr(store, "write_boundary", acknowledged_late)
    wrapper = compacting(session, client_returning(SUMMARY))
    work = asyncio.create_task(run_once(wrapper, session_settings={"limit": 1}))
    newer = {"role": "user", "content": "newer"}
    await asyncio.wait_for(committed.wait(), 10)
    work.cancel()
    append = asyncio.create_task(wrapper.add_items([newer]))
    await asyncio.sleep(0)
    work.cancel()
    await asyncio.sleep(0)
    assert not append.done()  # it waits for the compaction's outcome
    release.set()
    results = await asyncio.gather(work, append, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1] is None
    assert await session.get_items() == [*ORIGINAL[:-1], SUMMARY, newer]
    await check_head(store, session)


async def test_a_cancelled_add_items_lands_whole_or_not_at_all(store: EpisodicStore) -> None:
    """Cancelled at every point of its way to the database and back, an append is either
    all there or not there, and the session keeps working."""
    session = EpisodicSession("cancel-points", store)
    batch = [{"role": "user", "content": f"m{i}"} for i in range(3)]
    # Cancelled at once, then after 0.5 ms more each time up to 20 ms; then, on a machine slow
    # enough that no append committed by then, after ever longer waits until one does.
    delays = [step * 0.0005 for step in range(40)] + [0.02 * 2**k for k in range(8)]
    landed = tried = 0
    for delay in delays:
        if tried >= 40 and landed:
            break
        before = await session.get_items()
        task = asyncio.create_task(session.add_items(batch))  # type: ignore[arg-type]
        await asyncio.sleep(delay)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        after = await session.get_items()
        assert after in (before, before + batch), f"cancelled after {delay * 1000} ms: torn"
        landed += after != before
        tried += 1
    assert 0 < landed < tried, "the cancellations should fall both before and after the commit"
    await session.add_items([{"role": "user", "content": "still working"}])
    assert (await session.get_items())[-1] == {"role": "user", "content": "still working"}
    await check_head(store, session)


async def test_the_worker_compacts_after_the_sdks_boundary(store: EpisodicStore) -> None:
    session = EpisodicSession("both", store)
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    await run_once(compacting(session, client_returning(SUMMARY)), session_settings={"limit": 1})
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    await run_once(session, "and now?")
    worker = CompactionWorker(
        store, ExtractiveSummarizer(), options=WHERE_IT_CUTS, worker_id="after-sdk"
    )
    assert [r.outcome for r in await worker.run_once()] == ["succeeded"]
    items = await session.get_items()
    boundary = (await store.load_context(session.conversation_id)).boundary
    assert boundary is not None
    assert boundary.handoff_items is None
    assert items[0] == {"type": "message", "role": "user", "content": boundary.summary}
    # the SDK's kept items were compacted too: their questions are kept word for word
    assert "question 0" in boundary.retained
    await check_head(store, session)


async def test_the_worker_never_covers_a_run_still_in_progress(store: EpisodicStore) -> None:
    """A run saved its question and a tool call and waits for the tool: the worker's cut
    stays before the question; once the run has answered, the next compaction covers it."""
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    session = EpisodicSession("running", store)
    worker = CompactionWorker(
        store, ExtractiveSummarizer(), options=WHERE_IT_CUTS, worker_id="in-progress"
    )
    await session.add_items(
        [  # type: ignore[list-item]
            {"role": "user", "content": "first question"},
            reply("first answer").model_dump(exclude_unset=True),
            {"role": "user", "content": "second question"},
            function_call("lookup", {"q": "x"}, call_id="call_1").model_dump(exclude_unset=True),
            {"type": "function_call_output", "call_id": "call_1", "output": "found"},
        ]
    )
    assert [r.outcome for r in await worker.run_once()] == ["succeeded"]
    boundary = (await store.load_context(session.conversation_id)).boundary
    assert boundary is not None
    assert boundary.covers_through_seq == 2
    items = await session.get_items()
    # the handoff, the retained first question, then the run in progress, whole
    assert [i.get("content") for i in items[1:3]] == ["first question", "second question"]
    assert [i.get("type") for i in items[3:]] == ["function_call", "function_call_output"]

    await session.add_items([reply("second answer").model_dump(exclude_unset=True)])  # type: ignore[list-item]
    await worker.run_once()
    events = await events_of(store, session)
    boundaries = [e for e in events if isinstance(e, BoundaryEvent)]
    assert boundaries[-1].covers_through_seq == max(
        e.seq for e in events if isinstance(e, MessageEvent)
    )
    await check_head(store, session)


async def test_compaction_after_a_clear_expects_the_heads_boundary(store: EpisodicStore) -> None:
    """A clear takes the boundary out of view but not off the head: both the SDK's hook and
    the worker must expect the head's, or every later compaction would conflict."""
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    session = EpisodicSession("cleared", store)
    worker = CompactionWorker(
        store, ExtractiveSummarizer(), options=WHERE_IT_CUTS, worker_id="after-clear"
    )
    await run_once(session, "before the clear")
    assert [r.outcome for r in await worker.run_once()] == ["succeeded"]
    await session.clear_session()
    await run_once(session, "after the clear")
    assert [r.outcome for r in await worker.run_once()] == ["succeeded"]
    await session.clear_session()
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    await run_once(compacting(session, client_returning(SUMMARY)))
    assert await session.get_items() == [SUMMARY]
    await check_head(store, session)


async def test_a_compaction_that_cannot_be_recorded_never_fails_the_run(
    store: EpisodicStore, caplog: pytest.LogCaptureFixture
) -> None:
    session = EpisodicSession("too-big", store)
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    huge = {**SUMMARY, "encrypted_content": "x" * (store.max_message_bytes + 1)}
    await run_once(compacting(session, client_returning(huge)))  # the turn is saved, no error
    assert await session.get_items() == [*ORIGINAL, {"role": "user", "content": "continue"},
                                         reply().model_dump(exclude_unset=True)]  # fmt: skip
    assert not any(isinstance(e, BoundaryEvent) for e in await events_of(store, session))
    assert "was not recorded" in caplog.text


async def test_a_kept_call_whose_run_ended_still_gets_its_synthetic_result(
    store: EpisodicStore,
) -> None:
    """A call the run completion abandoned is kept by a partial compaction: loading still
    pairs it (a provider refuses a call without its output)."""
    session = EpisodicSession("abandoned", store)
    await session.add_items(
        [  # type: ignore[list-item]
            {"role": "user", "content": "start"},
            function_call("lookup", {"q": "x"}, call_id="lost").model_dump(exclude_unset=True),
        ]
    )
    await store.mark_run_completed(session.conversation_id)
    await session.add_items(ORIGINAL)  # type: ignore[arg-type]
    await run_once(compacting(session, client_returning(SUMMARY)), session_settings={"limit": 1})
    boundary = (await events_of(store, session))[-1]
    assert isinstance(boundary, BoundaryEvent)
    assert boundary.handoff_items is not None
    assert [i.get("call_id") for i in boundary.handoff_items if i.get("call_id")] == ["lost"]
    items = (await store.load_context(session.conversation_id)).to_responses()
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["lost"]
