"""Shared pieces of the property tests T8-T10: provider-style validators for a loaded context,
an independent safe-cut oracle, a deterministic fake summarizer, a private-database fixture
helper, and hypothesis strategies for conversation scripts and hostile inputs.

Nothing here imports the code it checks for its oracle: the validators read only the
chat-completions wire form, and the safe-cut oracle reads only calls, results and run
completions from the log.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from episodic.compaction import CompactionRequest
from episodic.models import MessageEvent, RunCompletedEvent, StoredEvent
from episodic.summarizers import SummaryResult
from tests.conftest import _admin, _with_database

# ---- hypothesis settings ---------------------------------------------------------------


def battery_settings(max_examples: int, **extra: Any) -> settings:
    """Settings for a battery property: no example database in the repository, no deadline
    (the database sets the pace), no explain phase (it replays failures hundreds of times)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.explicit, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
        **extra,
    )


# ---- one private database per test ---------------------------------------------------


@dataclass
class PrivateDatabase:
    url: str
    drop: Any


def private_database(
    backend: str, *, server: str | None, template: str | Path | None, tmp: Path
) -> Iterator[str]:
    """A migrated database for one sync test (the conftest fixtures are async and tied to the
    test's own loop; these tests drive their own loop so hypothesis can call into it)."""
    if backend == "postgresql":
        assert server is not None
        assert template is not None
        name = f"episodic_rel_{uuid.uuid4().hex[:12]}"
        asyncio.run(_admin(server, f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        try:
            yield _with_database(server, name)
        finally:
            asyncio.run(_admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    else:
        assert template is not None
        path = tmp / "episodic.db"
        shutil.copyfile(template, path)
        yield f"sqlite+aiosqlite:///{path}"


# ---- a deterministic fake summarizer -----------------------------------------------------


class FakeSummarizer:
    """Answers every request at once with a text derived from the request alone (plus a call
    counter), and remembers what it said so a model can predict the handoff."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0
        self.last_text: str | None = None

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        self.calls += 1
        digest = hashlib.sha256(request.prompt.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        self.last_text = f"summary #{self.calls} of {request.source_messages} messages ({digest})"
        return SummaryResult(text=self.last_text, model="fake-model")


# ---- provider-style validators over chat-completions dicts -------------------------------


def _calls_of(message: dict[str, Any]) -> list[str]:
    calls = message.get("tool_calls") or []
    return [call.get("id") for call in calls if isinstance(call, dict)]


def openai_violations(messages: Sequence[dict[str, Any]]) -> list[str]:
    """OpenAI chat-completions rules for tools: every ``tool`` message answers a call of the
    assistant message its run of tool messages follows (no output without its call, no second
    output for one call), and every call is answered before the next non-tool message."""
    out: list[str] = []
    waiting: set[str] = set()
    in_block = False
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not in_block:
                out.append(f"[{index}] tool output {call_id!r} does not follow a tool call")
            elif call_id not in waiting:
                out.append(f"[{index}] tool output {call_id!r} answers no open call of its turn")
            waiting.discard(call_id)
            continue
        if waiting:
            out.append(f"[{index}] {role} message before the outputs of {sorted(waiting)}")
        if role == "system":
            out.append(f"[{index}] a system message in a loaded context")
        ids = _calls_of(message) if role == "assistant" else []
        if len(set(ids)) != len(ids):
            out.append(f"[{index}] duplicate call ids in one message: {ids}")
        waiting = set(ids)
        in_block = bool(ids)
    if waiting:
        out.append(f"the context ends before the outputs of {sorted(waiting)}")
    return out


def to_anthropic(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Messages-API form of a chat-completions history: tool results become
    ``tool_result`` blocks of a user turn, and consecutive turns of one role merge (as the
    API itself merges them)."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        blocks: list[dict[str, Any]] = []
        if role == "tool":
            role = "user"
            blocks.append({"type": "tool_result", "tool_use_id": message.get("tool_call_id")})
        else:
            content = message.get("content")
            if isinstance(content, str) and content:
                blocks.append({"type": "text", "text": content})
            elif isinstance(content, list):
                blocks.extend({"type": "text", "text": "part"} for _ in content)
            for call_id in _calls_of(message):
                blocks.append({"type": "tool_use", "id": call_id})
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def anthropic_violations(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Anthropic Messages rules for tools (:func:`anthropic_turn_violations`) over the
    Messages-API form of a chat-completions history. That form is a sketch (every block's
    text is not carried over), so the rules on content are not applied."""
    return anthropic_turn_violations(to_anthropic(messages), content_rules=False)


def anthropic_turn_violations(
    turns: Sequence[dict[str, Any]], *, content_rules: bool = True
) -> list[str]:
    """Anthropic Messages rules over a ``messages`` list: only user and assistant turns, and
    they alternate; each assistant turn's ``tool_use`` blocks are answered, each exactly
    once, by ``tool_result`` blocks in the very next turn (a user turn, results first), and
    every ``tool_result`` answers a ``tool_use`` of the turn right before it. With
    ``content_rules``, also: no turn without content, no blank text block (the API refuses
    both)."""
    out: list[str] = []
    contents = [_blocks_of(turn) for turn in turns]
    for index, (turn, blocks) in enumerate(zip(turns, contents, strict=True)):
        if turn.get("role") not in ("user", "assistant"):
            out.append(f"turn {index}: role {turn.get('role')!r} is not user or assistant")
        elif index and turn["role"] == turns[index - 1].get("role"):
            out.append(f"turn {index}: two {turn['role']} turns in a row")
        if content_rules and not blocks:
            out.append(f"turn {index}: no content")
        if content_rules and any(
            b["type"] == "text" and not str(b.get("text")).strip() for b in blocks
        ):
            out.append(f"turn {index}: a blank text block")
        if turn.get("role") == "assistant":
            uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
            if len(set(uses)) != len(uses):
                out.append(f"turn {index}: duplicate tool_use ids {uses}")
            if not uses:
                continue
            following = contents[index + 1] if index + 1 < len(turns) else []
            answered = [b["tool_use_id"] for b in following if b["type"] == "tool_result"]
            if index + 1 >= len(turns) or turns[index + 1].get("role") != "user":
                out.append(f"turn {index}: tool_use {uses} is not answered by the next turn")
            elif sorted(answered) != sorted(uses):
                out.append(f"turn {index}: tool_use {sorted(uses)} answered by {sorted(answered)}")
            leading = 0
            for block in following:
                if block["type"] != "tool_result":
                    break
                leading += 1
            if leading != len(answered):
                out.append(f"turn {index + 1}: tool_result blocks must come first")
        else:
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            if not results:
                continue
            before = contents[index - 1] if index > 0 else []
            uses_before = (
                {b["id"] for b in before if b["type"] == "tool_use"}
                if index > 0 and turns[index - 1].get("role") == "assistant"
                else set()
            )
            for call_id in results:
                if call_id not in uses_before:
                    out.append(f"turn {index}: tool_result {call_id!r} without its tool_use")
    return out


def _blocks_of(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """A turn's content as blocks (a string is one text block)."""
    content = turn.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or [])


# ---- an independent safe-cut oracle ---------------------------------------------------


@dataclass(frozen=True)
class CallFact:
    call_id: str
    call_seq: int
    result_seq: int | None
    abandoned: bool


def call_facts(events: Sequence[StoredEvent]) -> list[CallFact]:
    """Every call in the log with the seq of the result that answered it (ids may be reused
    once the earlier call was answered or closed) and whether a run completion abandoned it."""
    open_calls: dict[str, int] = {}
    facts: list[CallFact] = []
    for event in events:
        if isinstance(event, RunCompletedEvent):
            for call_id in event.abandoned_tool_call_ids:
                if call_id in open_calls:
                    facts.append(CallFact(call_id, open_calls.pop(call_id), None, True))
            continue
        if not isinstance(event, MessageEvent):
            continue
        message = event.message
        if message.role == "tool" and message.tool_call_id in open_calls:
            call_id = message.tool_call_id
            facts.append(CallFact(call_id, open_calls.pop(call_id), event.seq, False))
        for call in message.tool_calls:
            open_calls[call.id] = event.seq
    facts.extend(CallFact(i, s, None, False) for i, s in open_calls.items())
    return facts


def is_safe_cut(events: Sequence[StoredEvent], cut: int) -> bool:
    """A boundary through ``cut`` separates no call from its result: every call at or before
    it was answered at or before it, or was closed as abandoned (it will never be answered)."""
    for fact in call_facts(events):
        if fact.call_seq > cut or fact.abandoned:
            continue
        if fact.result_seq is None or fact.result_seq > cut:
            return False
    return True


def resting_limit(events: Sequence[StoredEvent], above: int = 0) -> int:
    """The last seq the worker may cover through so that it covers no run still in
    progress, counting the messages after ``above`` (independent of episodic.policy): the
    log's end when its newest message (system and empty ones aside) is an answer (an
    assistant's text, no calls) or a run completion follows it; else the seq before the
    newest user message after ``above``, or before the first message after it when there is
    no user message."""
    tail = [e for e in events if e.seq > above]
    messages = [
        e
        for e in tail
        if isinstance(e, MessageEvent)
        and e.message.role != "system"
        and not (  # an empty assistant message: a state-only event
            e.message.role == "assistant"
            and not (e.message.text or e.message.tool_calls or e.message.reasoning)
        )
    ]
    if not messages:
        return events[-1].seq if events else 0
    last = messages[-1]
    answered = (
        last.message.role == "assistant" and not last.message.tool_calls and bool(last.message.text)
    )
    completed = any(isinstance(e, RunCompletedEvent) and e.seq > last.seq for e in tail)
    if answered or completed:
        return events[-1].seq
    users = [e.seq for e in messages if e.message.role == "user"]
    return (users[-1] if users else messages[0].seq) - 1


def results_crossing(events: Sequence[StoredEvent], cut: int) -> list[CallFact]:
    """Calls at or before ``cut`` whose result is stored after it (in the final log)."""
    return [
        f
        for f in call_facts(events)
        if f.call_seq <= cut and f.result_seq is not None and f.result_seq > cut
    ]


# ---- conversation scripts for T9 ---------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One step of a generated conversation.

    ``user``/``assistant``: a message with ``text``. ``calls``: an assistant message making
    calls ``ids`` (parallel when more than one), with results for ``answered`` in the same
    batch. ``results``: results for ``answered`` (calls still open), after a new user turn
    when ``interrupt``. ``run``: a run completion (open calls are abandoned). ``compact``: a
    compaction requested through seq ``max(1, ceil(fraction * last_seq))``.
    """

    kind: str
    text: str = ""
    ids: tuple[str, ...] = ()
    answered: tuple[str, ...] = ()
    interrupt: bool = False
    fraction: float = 1.0


SCRIPT_TEXTS = ("", " ", "ok", "go on", "日本語", "emoji 🧪", "a\u0301", "tab\tnl\n", "\x00")
_KINDS = ("user", "assistant", "calls", "calls", "calls", "compact", "compact", "run")
_KINDS_OPEN = (*_KINDS, "results", "results", "results", "compact")


def build_script(choose: Callable[[int], int], max_ops: int = 24) -> list[Op]:
    """A conversation script from a source of choices (``choose(n)`` is in ``range(n)``):
    parallel calls, results in any order and possibly after a new user turn, calls left
    pending to the end or abandoned by a run completion, ids reused once answered, and
    compaction requests at any point of the log, including mid-call."""
    ops: list[Op] = []
    open_ids: list[str] = []
    closed: list[str] = []
    counter = 0

    def pick(options: Sequence[Any]) -> Any:
        return options[choose(len(options))]

    def subset(options: Sequence[str], minimum: int) -> list[str]:
        chosen = [o for o in options if choose(2)]
        if len(chosen) < minimum:
            chosen = [options[0]]
        shuffled: list[str] = []
        while chosen:
            shuffled.append(chosen.pop(choose(len(chosen))))
        return shuffled

    for _ in range(1 + choose(max_ops)):
        kind = pick(_KINDS_OPEN if open_ids else _KINDS)
        if kind in ("user", "assistant"):
            ops.append(Op(kind, text=pick(SCRIPT_TEXTS)))
        elif kind == "calls":
            ids: list[str] = []
            for _ in range(1 + choose(4)):
                reusable = [i for i in closed if i not in ids]
                if reusable and choose(6) == 0:
                    ids.append(pick(reusable))
                else:
                    counter += 1
                    ids.append(f"call_{counter}")
            answered = subset(ids, 0)
            ops.append(
                Op("calls", text=pick(SCRIPT_TEXTS), ids=tuple(ids), answered=tuple(answered))
            )
            closed = [i for i in closed if i not in ids] + answered
            open_ids += [i for i in ids if i not in answered]
        elif kind == "results":
            chosen = subset(open_ids[:6], 1)
            ops.append(Op("results", answered=tuple(chosen), interrupt=bool(choose(2))))
            open_ids = [i for i in open_ids if i not in chosen]
            closed += chosen
        elif kind == "run":
            ops.append(Op("run"))
            closed += open_ids
            open_ids = []
        else:
            ops.append(Op("compact", fraction=choose(101) / 100))
    return ops


@st.composite
def conversation_scripts(draw: st.DrawFn, max_ops: int = 24) -> list[Op]:
    """:func:`build_script` driven by hypothesis (each choice a drawn integer, so failures
    shrink to short scripts with early choices)."""
    return build_script(lambda n: draw(st.integers(0, n - 1)) if n > 1 else 0, max_ops)


def seeded_script(seed: int, max_ops: int = 24) -> list[Op]:
    """:func:`build_script` driven by ``random.Random(seed)``: cheap, for bulk runs."""
    rng = random.Random(seed)
    return build_script(lambda n: rng.randrange(n) if n > 1 else 0, max_ops)


# ---- hostile inputs for T10 ----------------------------------------------------------

TEN_MB = 10 * 1024 * 1024
NUL = "\x00"

#: strings a text column, a JSON encoder or a UTF-8 codec may choke on
nasty_strings = st.one_of(
    st.just(NUL),
    st.just("a\x00b"),
    st.just("\\u0000"),
    st.just("\ud800"),
    st.just("x\udfffy"),
    st.just("\ud83d"),
    st.just(""),
    st.just(" "),
    st.just("\u202e\ufeff"),
    st.just("🧪" * 100),
    st.text(max_size=20),
    st.text(st.characters(codec=None, categories=["Cs", "Cc"]), min_size=1, max_size=5),
)


def deep_nesting(depth: int, leaf: Any = 1, *, kind: str = "dict") -> Any:
    """A JSON value nested ``depth`` levels deep (built iteratively)."""
    value: Any = leaf
    for _ in range(depth):
        value = {"k": value} if kind == "dict" else [value]
    return value


bad_uuids = st.one_of(
    st.just(""),
    st.just("not-a-uuid"),
    st.just("00000000-0000-0000-0000-00000000000g"),
    st.just("0" * 33),
    st.just("\x00" * 36),
    st.just("\ud800" * 36),
    st.text(max_size=40),
    st.integers(),
    st.none(),
    st.just(b"\x00" * 16),
    st.floats(allow_nan=True),
    st.just([]),
    st.just({}),
)

overflowing_ints = st.one_of(
    st.integers(max_value=-1),
    st.just(-(2**63) - 1),
    st.just(2**63),
    st.just(2**64),
    st.just(10**30),
    st.integers(min_value=2**63),
)

wrong_types = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=8),
    st.just(object()),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(float("nan")),
    st.just(float("inf")),
)

__all__ = [
    "NUL",
    "TEN_MB",
    "CallFact",
    "FakeSummarizer",
    "Op",
    "PrivateDatabase",
    "anthropic_turn_violations",
    "anthropic_violations",
    "bad_uuids",
    "battery_settings",
    "build_script",
    "call_facts",
    "conversation_scripts",
    "deep_nesting",
    "is_safe_cut",
    "nasty_strings",
    "openai_violations",
    "overflowing_ints",
    "private_database",
    "resting_limit",
    "results_crossing",
    "seeded_script",
    "to_anthropic",
    "wrong_types",
]
