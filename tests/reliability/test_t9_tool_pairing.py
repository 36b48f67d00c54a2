"""T9: tool calls stay paired through loading and compaction, at any cut.

Scenario. Generated conversation scripts (``strategies.conversation_scripts``): user and
assistant turns, assistant messages with 1-4 parallel calls (some answered in the same batch,
in any order), results that arrive later and sometimes after a new user turn, calls left
pending to the end, run completions that abandon what is still open, ids reused once
answered, and compaction requested through any seq of the log, mid-call included.

Two paths. (1) Pure, at CI size: the log is built in memory, a requested cut goes through
``policy.safe_cut_at_or_before`` (a direct boundary) and ``policy.resting_cut`` over the tail
(the worker's choice: the latest safe cut that covers no run in progress), and after every
step the context is ``context.compose_context``. (2) The
real store, on a smaller sample on PostgreSQL and SQLite: appends, ``mark_run_completed``,
``write_boundary`` at the requested cut (refused with ``UnsafeCutError`` when unsafe, then
written at the cut moved earlier) or a worker attempt (``claim_conversation`` +
``job.compact_claimed``), and ``load_context`` after every compaction and at the end.

Pass criteria: 0 violations of an OpenAI-style validator (no tool output without its call,
every call answered before the next non-tool message) and of an Anthropic-style validator
(each ``tool_use`` answered by ``tool_result`` blocks in the very next turn, every
``tool_result`` answering a ``tool_use`` of the turn before) on ``to_openai()`` of every
context; on every context too, ``to_responses()`` and ``to_anthropic()`` are accepted by the
providers' own SDK types, and ``to_anthropic()`` itself alternates roles, has no blank text
and answers every ``tool_use`` in the turn right after it, with every call and result there
exactly once; every stored message after the cut is in the context exactly once (so the
validators cannot pass by dropping messages); the chosen cut equals an independent oracle (the
latest safe cut at or before the request, or for the worker before a run in progress; an
unsafe request moves earlier) and never passes a
call pending at that moment; every boundary in the final log was safe when written and no
later result crosses it; the store refuses every unsafe requested cut.

Run: ``EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
.venv/bin/pytest tests/reliability/test_t9_tool_pairing.py -x -q -s``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pydantic
import pytest
from hypothesis import given

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall
from episodic.context import Context, compose_context, tail_messages
from episodic.errors import UnsafeCutError
from episodic.formats.anthropic import tool_use_id
from episodic.models import BoundaryEvent, MessageEvent, RunCompletedEvent, StoredEvent
from episodic.policy import resting_cut, safe_cut_at_or_before
from episodic.tokens import CharHeuristic
from episodic.worker.job import CompactionOptions, compact_claimed
from tests.reliability.sizes import size
from tests.reliability.strategies import (
    FakeSummarizer,
    Op,
    anthropic_turn_violations,
    anthropic_violations,
    battery_settings,
    conversation_scripts,
    is_safe_cut,
    openai_violations,
    resting_limit,
    results_crossing,
    seeded_script,
)
from tests.support import sent_after_cut
from tests.support_formats import check_anthropic, check_responses

PURE_CONVERSATIONS = size(2_000, 50_000)  # seeded
SHRINKING_CONVERSATIONS = size(300, 5_000)  # hypothesis
STORE_CONVERSATIONS = size(40, 2_000)
CID = UUID("00000000-0000-4000-8000-000000000009")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
ESTIMATOR = CharHeuristic()
MAX_EVENTS = 10_000

STATS: Counter[str] = Counter()


def requested_cut(op: Op, last_seq: int) -> int:
    return max(1, math.ceil(op.fraction * last_seq))


def oracle_cut(events: Sequence[StoredEvent], upto: int, above: int = 0) -> int:
    """The latest safe cut in (above, upto], else 0 (independent of episodic.policy)."""
    return max((c for c in range(above + 1, upto + 1) if is_safe_cut(events, c)), default=0)


def pending_call_seqs(events: Sequence[StoredEvent]) -> list[int]:
    """Seqs of calls still waiting for a result now (not answered, not abandoned)."""
    waiting: dict[str, int] = {}
    for event in events:
        if isinstance(event, RunCompletedEvent):
            waiting.clear()
        elif isinstance(event, MessageEvent):
            if event.message.tool_call_id is not None:
                waiting.pop(event.message.tool_call_id, None)
            for call in event.message.tool_calls:
                waiting[call.id] = event.seq
    return sorted(waiting.values())


def check_context(
    context: Context, events: Sequence[StoredEvent], where: str
) -> tuple[list[str], list[str]]:
    """Both validators' violations, after checking the context holds every message after the
    cut exactly once (synthetic results aside)."""
    covers = context.boundary.covers_through_seq if context.boundary is not None else 0
    expected = sent_after_cut(events, covers)
    offset = 1 + len(context.boundary.retained) if context.boundary is not None else 0
    found = Counter(m.seq for m in context.messages[offset:] if m.seq is not None)
    assert found == expected, f"{where}: messages after the cut lost or repeated"
    wire = context.to_openai()
    return openai_violations(wire), anthropic_violations(wire) + format_violations(context)


def format_violations(context: Context) -> list[str]:
    """The Responses and Anthropic forms of ``context``: both pass the SDKs' types (a refusal
    fails the test with pydantic's own message), and the Anthropic turns follow the Messages
    rules with every call and every result of the context in them exactly once."""
    items = context.to_responses()
    check_responses(items)
    turns = context.to_anthropic()
    check_anthropic(turns)
    STATS["contexts checked against the SDK types"] += 1
    out = anthropic_turn_violations(turns)
    calls = Counter(call.id for m in context.messages for call in m.tool_calls)
    results = Counter(m.tool_call_id or "" for m in context.messages if m.role == "tool")
    blocks = [b for turn in turns for b in turn["content"]]
    if Counter(b["id"] for b in blocks if b["type"] == "tool_use") != _as_tool_use(calls):
        out.append("to_anthropic lost or repeated a tool_use")
    answered = Counter(b["tool_use_id"] for b in blocks if b["type"] == "tool_result")
    if answered != _as_tool_use(results):
        out.append("to_anthropic lost or repeated a tool_result")
    if Counter(i["call_id"] for i in items if i["type"] == "function_call") != calls:
        out.append("to_responses lost or repeated a function_call")
    if Counter(i["call_id"] for i in items if i["type"] == "function_call_output") != results:
        out.append("to_responses lost or repeated a function_call_output")
    return out


def _as_tool_use(ids: Counter[str]) -> Counter[str]:
    return Counter({tool_use_id(call_id): n for call_id, n in ids.items()})


def check_final_log(events: Sequence[StoredEvent], where: str) -> None:
    """Every boundary was at a safe cut when written, and no later result crosses it."""
    previous = 0
    for event in events:
        if isinstance(event, BoundaryEvent):
            covers = event.covers_through_seq
            assert previous <= covers < event.seq, f"{where}: boundaries out of order"
            assert is_safe_cut(events[: event.seq - 1], covers), f"{where}: unsafe boundary"
            assert results_crossing(events, covers) == [], f"{where}: a result crosses a cut"
            previous = covers
            STATS["boundaries checked"] += 1


# ---- 1. the pure functions, at CI size -------------------------------------------------


class PureLog:
    """A conversation log built in memory the way the store builds it."""

    def __init__(self) -> None:
        self.events: list[StoredEvent] = []
        self.open: dict[str, int] = {}
        self.boundary: BoundaryEvent | None = None

    @property
    def covers(self) -> int:
        return self.boundary.covers_through_seq if self.boundary is not None else 0

    def message(self, message: Message) -> None:
        seq = len(self.events) + 1
        self.events.append(
            MessageEvent.model_construct(  # built from validated parts; skip re-validation
                conversation_id=CID,
                seq=seq,
                created_at=T0,
                token_estimate=1,
                message=message.as_stored(seq=seq, created_at=T0, token_estimate=1),
                kind="message",
                usage=None,
            )
        )
        if message.tool_call_id is not None:
            del self.open[message.tool_call_id]
        for call in message.tool_calls:
            self.open[call.id] = seq

    def run_completed(self) -> None:
        abandoned = tuple(k for k, _ in sorted(self.open.items(), key=lambda kv: kv[::-1]))
        self.events.append(
            RunCompletedEvent.model_construct(
                conversation_id=CID,
                seq=len(self.events) + 1,
                created_at=T0,
                token_estimate=0,
                abandoned_tool_call_ids=abandoned,
                kind="run_completed",
            )
        )
        self.open.clear()

    def compact(self, op: Op, direct: bool) -> None:
        last = len(self.events)
        if last == 0:
            return
        STATS["compaction requests"] += 1
        events = self.events
        if direct:
            requested = requested_cut(op, last)
            cut = safe_cut_at_or_before(events, requested)
            assert cut == oracle_cut(events, requested), (requested, cut)
            assert cut <= requested
            if not is_safe_cut(events, requested):
                STATS["unsafe requests moved earlier"] += 1
        else:
            cut = resting_cut([e for e in events if e.seq > self.covers])
            limit = resting_limit(events, above=self.covers)
            assert cut == oracle_cut(events, limit, above=self.covers), cut
        pending = pending_call_seqs(events)
        assert all(cut < seq for seq in pending), f"cut {cut} passes pending calls {pending}"
        if pending and cut:
            STATS["cuts placed before a pending call"] += 1
        if cut <= self.covers:
            STATS["requests with no safe cut after the last one"] += 1
            return
        self.boundary = BoundaryEvent(
            conversation_id=CID,
            seq=last + 1,
            created_at=T0,
            token_estimate=1,
            summary=f"summary through {cut}",
            covers_through_seq=cut,
            retained=("kept",),
            reason="manual_recovery",
        )
        self.events.append(self.boundary)
        STATS["boundaries written"] += 1

    def context(self) -> Context:
        return compose_context(
            CID,
            boundary=self.boundary,
            tail=tail_messages([e for e in self.events if e.seq > self.covers]),
            last_seq=len(self.events),
            estimator=ESTIMATOR,
        )


def play_pure(script: list[Op]) -> None:
    log = PureLog()
    for step, op in enumerate(script):
        if op.kind == "user":
            log.message(Message.user(op.text))
        elif op.kind == "assistant":
            log.message(Message.assistant(op.text))
        elif op.kind == "calls":
            calls = [ToolCall(id=i, name="run", args={"n": n}) for n, i in enumerate(op.ids)]
            log.message(Message.assistant(op.text or None, tool_calls=calls))
            for call_id in op.answered:
                log.message(Message.tool_result(call_id, f"out {call_id}", name="run"))
        elif op.kind == "results":
            if op.interrupt:
                log.message(Message.user("meanwhile"))
                STATS["results after a new user turn"] += 1
            for call_id in op.answered:
                log.message(Message.tool_result(call_id, f"late {call_id}", name="run"))
        elif op.kind == "run":
            STATS["calls abandoned"] += len(log.open)
            log.run_completed()
        else:
            log.compact(op, direct=step % 2 == 0)
        if op.kind in ("user", "assistant") and step != len(script) - 1:
            continue  # nothing a plain message changes in the pairing; checked at the next step
        oa, an = check_context(log.context(), log.events, f"step {step}")
        STATS["pure contexts validated"] += 1
        STATS["openai violations"] += len(oa)
        STATS["anthropic violations"] += len(an)
        assert (oa, an) == ([], []), (script, step)
    STATS["calls left pending"] += len(log.open)
    check_final_log(log.events, "pure")


def test_pairing_with_pure_functions_seeded() -> None:
    """The bulk: seeded scripts (cheap to generate); a failure names its seed."""
    for seed in range(1, PURE_CONVERSATIONS + 1):
        script = seeded_script(seed)
        try:
            play_pure(script)
        except AssertionError as exc:
            raise AssertionError(f"T9 seed {seed}: {exc}\nscript: {script}") from exc
        STATS["pure conversations"] += 1


@battery_settings(SHRINKING_CONVERSATIONS)
@given(script=conversation_scripts())
def test_pairing_with_pure_functions_shrinking(script: list[Op]) -> None:
    """The same property under hypothesis, so a failure shrinks to a minimal script."""
    STATS["pure conversations"] += 1
    play_pure(script)


# ---- 2. the real store, a smaller sample ------------------------------------------------


async def play_store(store: EpisodicStore, script: list[Op]) -> None:
    conv = await store.create_conversation()
    summarizer = FakeSummarizer()
    # the scripts are a few words: whether a boundary shrinks them is not the question here
    options = CompactionOptions(summarizer_timeout=10.0, require_smaller=False)

    async def validate(where: str) -> list[StoredEvent]:
        context = await store.load_context(conv)
        head = await store.get_conversation(conv)
        events = await store.read_events(conv, limit=MAX_EVENTS) if head.last_seq else []
        oa, an = check_context(context, events, where)
        STATS["store contexts validated"] += 1
        STATS["openai violations"] += len(oa)
        STATS["anthropic violations"] += len(an)
        assert (oa, an) == ([], []), (script, where)
        return events

    for step, op in enumerate(script):
        if op.kind == "user":
            await store.append(conv, [Message.user(op.text)])
        elif op.kind == "assistant":
            await store.append(conv, [Message.assistant(op.text)])
        elif op.kind == "calls":
            calls = [ToolCall(id=i, name="run", args={"n": n}) for n, i in enumerate(op.ids)]
            batch = [Message.assistant(op.text or None, tool_calls=calls)]
            batch += [Message.tool_result(i, f"out {i}", name="run") for i in op.answered]
            await store.append(conv, batch)
        elif op.kind == "results":
            if op.interrupt:
                await store.append(conv, [Message.user("meanwhile")])
            await store.append(
                conv, [Message.tool_result(i, f"late {i}", name="run") for i in op.answered]
            )
        elif op.kind == "run":
            await store.mark_run_completed(conv)
        else:
            events = await validate(f"before compaction at step {step}")
            head = await store.get_conversation(conv)
            if not events:
                continue
            STATS["store compaction requests"] += 1
            if step % 2 == 0:
                await _direct_boundary(
                    store, conv, op, events, head.boundary_seq, head.covers_through_seq
                )
            else:
                await _worker_boundary(
                    store, conv, summarizer, options, events, head.covers_through_seq
                )
            await validate(f"after compaction at step {step}")
    events = await validate("end")
    check_final_log(events, "store")


async def _direct_boundary(
    store: EpisodicStore,
    conv: UUID,
    op: Op,
    events: list[StoredEvent],
    boundary_seq: int | None,
    covers: int,
) -> None:
    requested = requested_cut(op, len(events))

    async def write(cut: int) -> Any:
        return await store.write_boundary(
            conv,
            BoundaryRequest(
                summary=f"summary through {cut}",
                covers_through_seq=cut,
                retained=["kept"],
                reason="manual_recovery",
                expected_boundary_seq=boundary_seq,
            ),
        )

    if requested < covers or not is_safe_cut(events, requested):
        with pytest.raises(UnsafeCutError):
            await write(requested)
        STATS["store unsafe cuts refused"] += 1
    cut = safe_cut_at_or_before(events, requested)
    assert cut == oracle_cut(events, requested)
    assert all(cut < seq for seq in pending_call_seqs(events))
    if cut > covers:
        written = await write(cut)
        assert written.covers_through_seq == cut
        STATS["store boundaries written"] += 1


async def _worker_boundary(
    store: EpisodicStore,
    conv: UUID,
    summarizer: FakeSummarizer,
    options: CompactionOptions,
    events: list[StoredEvent],
    covers: int,
) -> None:
    claim = await store.claim_conversation(conv, "t9-worker", lease_seconds=30)
    assert claim is not None
    result = await compact_claimed(store, summarizer, claim, worker="t9-worker", options=options)
    expected = oracle_cut(events, resting_limit(events, above=covers), above=covers)
    head = await store.get_conversation(conv)
    if result.outcome == "succeeded":
        assert head.covers_through_seq == expected > covers
        STATS["store boundaries written"] += 1
    else:
        assert result.outcome == "nothing_to_compact", result
        assert head.covers_through_seq == covers
        source = [
            e
            for e in events
            if isinstance(e, MessageEvent)
            and e.seq <= expected
            and (e.message.tool_calls or e.message.role != "assistant" or e.message.text.strip())
        ]
        # A boundary the worker wrote carries its notes and record: with no message after
        # it in view there is nothing new to fold in, so the worker writes nothing.
        latest = next((e for e in reversed(events) if isinstance(e, BoundaryEvent)), None)
        stateful = latest is not None and latest.handoff_state is not None
        unseen = [e for e in source if e.seq > covers]  # an empty assistant reply is none
        assert (
            expected <= covers
            or (head.boundary_seq is None and not source)
            or (stateful and not unseen)
        )


@battery_settings(STORE_CONVERSATIONS)
@given(script=conversation_scripts(max_ops=16))
async def test_pairing_through_the_store(store: EpisodicStore, script: list[Op]) -> None:
    STATS[f"{store.dialect} conversations"] += 1
    await play_store(store, script)


# ---- the validators reject what they must (so 0 violations means something) -------------


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "run", "arguments": "{}"}}


_GOOD: list[dict[str, Any]] = [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]},
    {"role": "tool", "tool_call_id": "b", "content": "B"},
    {"role": "tool", "tool_call_id": "a", "content": "A"},
    {"role": "user", "content": "next"},
]
_BROKEN: dict[str, list[dict[str, Any]]] = {
    "result missing": [_GOOD[0], _GOOD[1], _GOOD[2], _GOOD[4]],
    "result after a user turn": [_GOOD[0], _GOOD[1], _GOOD[2], _GOOD[4], _GOOD[3]],
    "orphan result": [_GOOD[0], _GOOD[2], _GOOD[4]],
    "result answered twice": [*_GOOD[:4], _GOOD[3], _GOOD[4]],
    "ends with an open call": _GOOD[:2],
    "result for another turn's call": [
        _GOOD[0],
        {"role": "assistant", "content": None, "tool_calls": [_call("x")]},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
    ],
}


def test_the_validators_accept_a_valid_history() -> None:
    assert openai_violations(_GOOD) == []
    assert anthropic_violations(_GOOD) == []


@pytest.mark.parametrize("case", sorted(_BROKEN))
def test_the_validators_reject(case: str) -> None:
    assert openai_violations(_BROKEN[case]), case
    assert anthropic_violations(_BROKEN[case]), case


def test_t9_summary() -> None:
    """Prints the figures of the runs above (run with -s) and holds them to 0 violations."""
    print(
        f"\nT9: {STATS['pure conversations']} pure conversations, "
        f"{STATS['postgresql conversations']} on PostgreSQL, "
        f"{STATS['sqlite conversations']} on SQLite; "
        + ", ".join(f"{k} {v}" for k, v in sorted(STATS.items()) if "conversations" not in k)
    )
    assert STATS["openai violations"] == 0
    assert STATS["anthropic violations"] == 0


def _use(call_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "run", "input": {}}


def _answer(call_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "ok"}


_TEXT = {"type": "text", "text": "next"}
_GOOD_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": [_use("a"), _use("b")]},
    {"role": "user", "content": [_answer("b"), _answer("a"), _TEXT]},
]
_BROKEN_TURNS: dict[str, list[dict[str, Any]]] = {
    "two user turns in a row": [_GOOD_TURNS[0], *_GOOD_TURNS],
    "a system turn": [{"role": "system", "content": "be brief"}, *_GOOD_TURNS],
    "text before the results": [
        *_GOOD_TURNS[:2],
        {"role": "user", "content": [_TEXT, _answer("a"), _answer("b")]},
    ],
    "a result missing": [*_GOOD_TURNS[:2], {"role": "user", "content": [_answer("a")]}],
    "a result a turn late": [
        *_GOOD_TURNS[:2],
        {"role": "user", "content": [_answer("a")]},
        {"role": "assistant", "content": "hm"},
        {"role": "user", "content": [_answer("b")]},
    ],
    "ends with an open call": _GOOD_TURNS[:2],
    "a blank text block": [{"role": "user", "content": [{"type": "text", "text": " \n"}]}],
    "an empty turn": [*_GOOD_TURNS, {"role": "assistant", "content": []}],
}


def test_the_turn_validator_accepts_valid_turns() -> None:
    assert anthropic_turn_violations(_GOOD_TURNS) == []


@pytest.mark.parametrize("case", sorted(_BROKEN_TURNS))
def test_the_turn_validator_rejects(case: str) -> None:
    assert anthropic_turn_violations(_BROKEN_TURNS[case]), case


def test_the_sdk_checks_reject_a_broken_context_form() -> None:
    """format_violations fails on output the SDKs refuse, not only on pairing."""
    context = compose_context(
        CID,
        boundary=None,
        tail=[
            Message.user("go").as_stored(seq=1, created_at=T0, token_estimate=1),
            Message.assistant(None, tool_calls=[ToolCall(id="a", name="run")]).as_stored(
                seq=2, created_at=T0, token_estimate=1
            ),
        ],
        last_seq=2,
        estimator=ESTIMATOR,
    )
    assert format_violations(context) == []
    items = context.to_responses()
    del items[1]["arguments"]
    with pytest.raises(pydantic.ValidationError):
        check_responses(items)
    turns = context.to_anthropic()
    turns[1]["content"][0]["input"] = "{}"  # the arguments' text, not the object
    with pytest.raises(pydantic.ValidationError):
        check_anthropic(turns)
