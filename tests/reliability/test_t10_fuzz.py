"""T10: hostile input at every public entry point.

Scenario. Hypothesis strategies per entry point feed the store (one PostgreSQL database for
the module; SQLite as well at a smaller size) with NUL characters (``\\x00`` and the JSON
escape ``\\u0000``), unpaired surrogates, 10 MB bodies, nesting of 1,000+ levels, wrong types,
malformed and unknown UUIDs, negative and overflowing seqs and counts, unknown roles (through
``Message.from_openai`` and through a ``Message`` built without validation), tool results
without their call, and the like. Entry points: ``create_conversation``, ``append``,
``load_context``, ``read_events``, ``mark_run_completed``, ``write_boundary``,
``claim_conversation``/``claim_due`` (the queue), ``Message.from_openai`` and the
configuration (``EpisodicSettings``, ``parse_database_url``).

Each probe says whether it must be refused, must be accepted (NUL inside message text is
legal and must round-trip) or may go either way. Pass criteria, counted over all probes:
0 crashes or exceptions outside episodic's types: every refusal is an
``episodic.errors.ValidationError`` subclass, or ``NotFoundError`` for a well-formed unknown
id (``ConflictError``, ``UnsafeCutError`` and ``LeaseLostError`` where the input is
well-formed but the state refuses it are counted and reported); 0 driver errors (asyncpg,
SQLAlchemy, sqlite3) reach the caller; every input that must be refused is refused; the three
tables' row counts are unchanged after each refusal; accepted appends read back equal. The p99
time of refusals is reported (target < 50 ms), not asserted. Known library bugs are listed in
``KNOWN_BUGS`` with a strict-xfail reproduction each in ``tests/regressions/``; a failure
outside them fails the run.

Run: ``EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
.venv/bin/pytest tests/reliability/test_t10_fuzz.py -x -q -s``.
"""

from __future__ import annotations

import asyncio
import math
import reprlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall, Usage
from episodic.errors import (
    ConfigurationError,
    ConflictError,
    EpisodicError,
    LeaseLostError,
    NotFoundError,
    UnsafeCutError,
    ValidationError,
)
from episodic.models import MAX_TOKEN_COUNT, ImageBlock, RawBlock, TextBlock
from episodic.settings import EpisodicSettings
from episodic.store.engine import parse_database_url, sqlalchemy_url
from episodic.store.store import MAX_LEASE_SECONDS
from tests.conftest import isolated_settings
from tests.reliability.sizes import size
from tests.reliability.strategies import (
    NUL,
    TEN_MB,
    bad_uuids,
    battery_settings,
    deep_nesting,
    nasty_strings,
    overflowing_ints,
    private_database,
    wrong_types,
)

EXAMPLES = size(2_000, 20_000)
SQLITE_EXAMPLES = size(60, 5_000)
BIG = "x" * TEN_MB
DRIVER_MODULES = ("asyncpg", "sqlalchemy", "sqlite3", "aiosqlite", "psycopg", "psycopg2")

FRESH = object()  # a conversation_id placeholder: a new seeded conversation for this probe
NEW_ID = object()  # a conversation_id placeholder: a new random UUID

#: Known library bugs: (entry point, probe label) -> the regression test that reproduces it.
#: A failure of one of these probes is counted and reported but does not fail the fuzz run;
#: its strict-xfail regression test fails as soon as the bug is fixed, and then the entry
#: here must go. None now: BUG-1 to BUG-6 are fixed, their tests plain regression tests.
KNOWN_BUGS: dict[tuple[str, str], str] = {}
#: the regression module with one strict-xfail reproduction per bug
REGRESSIONS = "tests/regressions/test_t10_input_validation.py"


def known_bug(entry: str, label: str) -> str | None:
    """The bug id a failing probe class is known for (labels match by prefix)."""
    for (known_entry, prefix), bug in KNOWN_BUGS.items():
        if entry == known_entry and label.startswith(prefix):
            return bug
    return None


# ---- probes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    entry: str
    label: str
    kwargs: dict[str, Any]
    #: "reject": must raise a ValidationError subclass; "notfound": NotFoundError;
    #: "accept": must succeed; "either": anything typed
    expect: str = "reject"

    def __repr__(self) -> str:
        return (
            f"Probe({self.entry}, {self.label}, {_SHORT.repr(self.kwargs)}, expect={self.expect})"
        )


_SHORT = reprlib.Repr()  # bounded repr: probes hold 10 MB strings and 10,000-deep values
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 4, 60, 60


def probe(entry: str, label: str, expect: str = "reject", **kwargs: Any) -> Probe:
    return Probe(entry, label, kwargs, expect)


@dataclass
class Results:
    calls: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    reject_seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    count_checks: int = 0


RESULTS: dict[str, Results] = defaultdict(Results)  # per backend


class Harness:
    """One database, one store, one event loop for all of a backend's probes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.store: EpisodicStore = self.run(EpisodicStore.open(url, settings=isolated_settings()))
        self.engine = create_async_engine(sqlalchemy_url(url), pool_size=1, max_overflow=0)
        self.results = RESULTS[self.store.dialect]
        self.conv, self.open_call, self.answered_call = self.run(self._seed())
        self.last_counts = self.run(self.counts())

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    async def _seed(self) -> tuple[UUID, str, str]:
        conv = await self.store.create_conversation(metadata={"fixture": "t10"})
        call = ToolCall(id="open_1", name="run")
        done = ToolCall(id="done_1", name="run")
        await self.store.append(
            conv,
            [
                Message.user("seed"),
                Message.assistant(None, tool_calls=[done, call]),
                Message.tool_result("done_1", "ok", name="run"),
            ],
        )
        return conv, "open_1", "done_1"

    async def fresh_conversation(self) -> UUID:
        conv = await self.store.create_conversation()
        await self.store.append(
            conv,
            [
                Message.user("seed"),
                Message.assistant(None, tool_calls=[ToolCall(id="open_1", name="run")]),
            ],
        )
        return conv

    async def counts(self) -> tuple[int, int, int]:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT (SELECT count(*) FROM episodic_conversations),"
                        " (SELECT count(*) FROM episodic_events),"
                        " (SELECT count(*) FROM episodic_compaction_attempts)"
                    )
                )
            ).one()
        return (int(row[0]), int(row[1]), int(row[2]))

    def close(self) -> None:
        self.run(self.store.close())
        self.run(self.engine.dispose())
        self.loop.close()

    # ---- one probe ----------------------------------------------------------------

    def check(self, p: Probe, call: Callable[[], Any], *, database: bool = True) -> None:
        r = self.results
        r.calls[p.entry] += 1
        before = self.last_counts
        started = time.perf_counter()
        error: BaseException | None = None
        value: Any = None
        try:
            value = call()
            if asyncio.iscoroutine(value):
                value = self.run(value)
        except Exception as exc:  # classified below; nothing may escape untyped
            error = exc
        seconds = time.perf_counter() - started
        outcome = _classify(p, error)
        r.outcomes[(p.entry, outcome)] += 1
        problem: str | None = None
        if outcome.startswith("untyped") or outcome.startswith("driver"):
            problem = f"{outcome}: {type(error).__name__}: {str(error)[:160]}"
        elif p.expect == "reject" and error is None:
            problem = "accepted input that must be refused"
        elif p.expect == "accept" and error is not None:
            problem = f"refused valid input: {type(error).__name__}: {str(error)[:160]}"
        elif p.expect == "notfound" and not isinstance(error, NotFoundError):
            problem = f"expected NotFoundError, got {type(error).__name__}"
        if error is not None and isinstance(error, ValidationError):
            r.reject_seconds[p.entry].append(seconds)
        if database:
            # Counts before this probe are the counts after the previous one (fresh
            # conversations a probe asks for are made before it is timed and counted).
            after = self.last_counts = self.run(self.counts())
            if error is not None:
                r.count_checks += 1
                if after != before:
                    problem = f"row counts changed on a refusal: {before} -> {after}"
        if p.entry == "append" and error is None and value is not None:
            problem = problem or self._round_trip(p, value)
        if problem is not None:
            key = (p.entry, p.label)
            if len(r.failures[key]) < 3:
                r.failures[key].append(f"{problem} <- {p!r}")

    def _round_trip(self, p: Probe, stored: list[Any]) -> str | None:
        cid = stored[0].conversation_id
        back = self.run(self.store.read_events(cid, after_seq=stored[0].seq - 1, limit=len(stored)))
        # Python-mode dumps: what the caller passed, not its JSON rendering (which would hide
        # a silent replacement of characters)
        fields = {"seq", "created_at", "token_estimate"}
        sent = [m.model_dump(exclude=fields) for m in p.kwargs["messages"]]
        got = [e.message.model_dump(exclude=fields) for e in back]
        return None if sent == got else f"read back differs: {got!r:.200}"


def _classify(p: Probe, error: BaseException | None) -> str:
    if error is None:
        return "accepted"
    root = type(error).__module__.split(".")[0]
    if root in DRIVER_MODULES:
        return f"driver:{type(error).__name__}"
    if isinstance(error, ValidationError):
        return f"ValidationError:{type(error).__name__}"
    if isinstance(error, NotFoundError):
        return "NotFoundError"
    if isinstance(error, ConflictError | UnsafeCutError | LeaseLostError | ConfigurationError):
        return f"typed:{type(error).__name__}"
    if p.entry == "settings" and isinstance(error, pydantic.ValidationError):
        return "pydantic.ValidationError"
    if isinstance(error, EpisodicError):
        return f"untyped-episodic:{type(error).__name__}"
    return f"untyped:{type(error).__module__}.{type(error).__name__}"


# ---- strategies: building blocks -------------------------------------------------------

ids_of_conversations = st.one_of(
    bad_uuids.map(lambda v: ("bad", v)),
    st.uuids().map(lambda v: ("unknown", v)),
    st.uuids().map(lambda v: ("unknown", str(v).upper())),
)


def unvalidated(**fields: Any) -> Message:
    """A Message built without validation (``model_construct``), as buggy caller code can."""
    defaults: dict[str, Any] = {
        "content": None,
        "tool_calls": (),
        "tool_call_id": None,
        "name": None,
        "is_error": False,
        "reasoning": None,
        "native": None,
        "metadata": {},
        "client_id": None,
        "seq": None,
        "created_at": None,
        "token_estimate": None,
    }
    defaults.update(fields)
    return Message.model_construct(**defaults)


def build(base: Message, **overrides: Any) -> Message:
    """``base`` with ``overrides``, validated; when Message's own validation refuses them (a
    constrained string with a lone surrogate, say), built without validation, as a caller's
    ``model_construct`` would."""
    values = {**dict(base), **overrides}
    try:
        return Message.model_validate(values)
    except ValidationError:
        return Message.model_construct(**values)


@st.composite
def hostile_batches(draw: st.DrawFn) -> tuple[str, Any, str]:
    """(label, messages, expectation) for append's ``messages``."""
    s = draw(nasty_strings)
    has_nul = NUL in s
    has_surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in s)
    kind = draw(
        st.sampled_from(
            [
                "text",
                "client_id",
                "tool_call_id",
                "call_id",
                "tool_name",
                "reasoning",
                "metadata_value",
                "metadata_key",
                "block_text",
                "raw_block",
                "big_body",
                "big_batch",
                "deep_metadata",
                "not_a_list",
                "not_messages",
                "empty",
                "orphan_result",
                "result_for_answered",
                "second_result_in_batch",
                "duplicate_call_in_batch",
                "reuse_open_call",
                "already_stored",
                "client_id_twice",
                "unknown_role",
                "unvalidated_shape",
            ]
        )
    )
    bad = "reject" if has_surrogate else "accept"
    if kind == "text":
        return kind, [Message.user(s)], bad
    if kind == "client_id":
        if not s:
            return kind, [Message.user("x")], "accept"
        return (
            kind,
            [build(Message.user("x"), client_id=f"{s}-{uuid4().hex}")],
            ("reject" if has_nul or has_surrogate else "accept"),
        )
    if kind == "tool_call_id":
        call_id = s or "never-called"
        return (
            kind,
            [build(Message.tool_result("x", "r"), tool_call_id=call_id)],
            "reject",
        )  # orphan or unstorable
    if kind == "call_id":
        cid = f"{s}-{uuid4().hex}"
        call = ToolCall.model_construct(id=cid, name="run", args={}, arguments_json=None)
        return (
            kind,
            [Message.assistant(None, tool_calls=[call])],
            ("reject" if has_nul or has_surrogate else "accept"),
        )
    if kind == "tool_name":
        name = s or "n"
        call = ToolCall.model_construct(
            id=f"c-{uuid4().hex}", name=name, args={}, arguments_json=None
        )
        return (
            kind,
            [Message.assistant(None, tool_calls=[call])],
            (
                "reject" if has_surrogate else "either"  # NUL in a tool name: stored in JSON
            ),
        )
    if kind == "reasoning":
        return kind, [Message.assistant("a", reasoning=s)], bad
    if kind == "metadata_value":
        return kind, [Message.user("x", metadata={"v": s})], bad
    if kind == "metadata_key":
        label = "metadata_key_surrogate" if has_surrogate else kind
        return label, [Message.user("x", metadata={s: 1})], bad
    if kind == "block_text":
        return kind, [Message.user((TextBlock(text=s), ImageBlock(url=s or "u")))], bad
    if kind == "raw_block":
        return kind, [Message.user((RawBlock(data={"type": s, "v": s}),))], bad
    if kind == "big_body":
        return kind, [Message.user(BIG)], "reject"
    if kind == "big_batch":
        return kind, [Message.user("x" * (TEN_MB // 4)) for _ in range(4)], "either"
    if kind == "deep_metadata":
        depth = draw(st.sampled_from([255, 300, 1_000, 5_000]))
        try:
            message = Message.user("x", metadata={"d": deep_nesting(depth)})
        except ValidationError:
            message = unvalidated(role="user", content="x", metadata={"d": deep_nesting(depth)})
            return f"unvalidated_deep_metadata_{depth}", [message], "reject"
        return f"{kind}_{depth}", [message], "reject"
    if kind == "not_a_list":
        value = draw(st.one_of(wrong_types, st.just(Message.user("x")), st.just("hello")))
        return kind, value, "reject"
    if kind == "not_messages":
        return (
            kind,
            [draw(st.one_of(wrong_types, st.just({"role": "user", "content": "x"})))],
            ("reject"),
        )
    if kind == "empty":
        return kind, draw(st.sampled_from([[], ()])), "reject"
    if kind == "orphan_result":
        return kind, [Message.tool_result(f"never-{uuid4().hex}", "r")], "reject"
    if kind == "result_for_answered":
        return kind, [Message.tool_result("done_1", "again")], "reject"
    if kind == "second_result_in_batch":
        cid = f"c-{uuid4().hex}"
        return (
            kind,
            [
                Message.assistant(None, tool_calls=[ToolCall(id=cid, name="run")]),
                Message.tool_result(cid, "1"),
                Message.tool_result(cid, "2"),
            ],
            "reject",
        )
    if kind == "duplicate_call_in_batch":
        cid = f"c-{uuid4().hex}"
        call = ToolCall(id=cid, name="run")
        return (
            kind,
            [
                Message.assistant(None, tool_calls=[call]),
                Message.assistant(None, tool_calls=[call]),
            ],
            "reject",
        )
    if kind == "reuse_open_call":
        return (
            kind,
            [Message.assistant(None, tool_calls=[ToolCall(id="open_1", name="run")])],
            "reject",
        )
    if kind == "already_stored":
        return (
            kind,
            [Message.user("x").model_copy(update={"seq": draw(st.integers(-5, 5))})],
            "reject",
        )
    if kind == "client_id_twice":
        same = f"dup-{uuid4().hex}"
        return (
            kind,
            [Message.user("a", client_id=same), Message.user("b", client_id=same)],
            "reject",
        )
    if kind == "unknown_role":
        role = draw(st.sampled_from(["wizard", "developer", "", "USER", "function", NUL]))
        return f"{kind}", [unvalidated(role=role, content="x")], "reject"
    # unvalidated_shape: shapes Message's validator forbids, smuggled past it
    shape = draw(
        st.sampled_from(["tool_no_id", "user_no_content", "user_with_calls", "system_blocks"])
    )
    fields: dict[str, Any] = {
        "tool_no_id": {"role": "tool", "content": "r"},
        "user_no_content": {"role": "user"},
        "user_with_calls": {
            "role": "user",
            "content": "x",
            "tool_calls": (ToolCall(id=f"u-{uuid4().hex}", name="t"),),
        },
        "system_blocks": {"role": "system", "content": (TextBlock(text="x"),)},
    }[shape]
    return f"{kind}_{shape}", [unvalidated(**fields)], "reject"


# ---- strategies: one per entry point ---------------------------------------------------


@st.composite
def append_probes(draw: st.DrawFn, conv: UUID) -> Probe:
    part = draw(
        st.sampled_from(
            ["messages", "messages", "messages", "conversation_id", "key", "expected_seq", "usage"]
        )
    )
    good = [Message.user("ok")]
    if part == "messages":
        label, messages, expect = draw(hostile_batches())
        target = FRESH if label.startswith(("unknown_role", "unvalidated", "deep", "big")) else conv
        return probe("append", label, expect, conversation_id=target, messages=messages)
    if part == "conversation_id":
        how, value = draw(ids_of_conversations)
        return probe(
            "append",
            f"id_{how}",
            "reject" if how == "bad" else "notfound",
            conversation_id=value,
            messages=good,
        )
    if part == "key":
        key = draw(st.one_of(nasty_strings, wrong_types, st.just("k" * 513)))
        if (
            isinstance(key, str)
            and key
            and NUL not in key
            and len(key) <= 512
            and not _has_surrogate(key)
        ):
            key = f"{key}-{uuid4().hex}"[:512]
            return probe(
                "append",
                "key_ok",
                "accept",
                conversation_id=conv,
                messages=good,
                idempotency_key=key,
            )
        if key is None:
            return probe(
                "append",
                "key_none",
                "accept",
                conversation_id=conv,
                messages=good,
                idempotency_key=None,
            )
        return probe(
            "append",
            "key_surrogate" if isinstance(key, str) and _has_surrogate(key) else "key_bad",
            "reject",
            conversation_id=conv,
            messages=good,
            idempotency_key=key,
        )
    if part == "expected_seq":
        value = draw(
            st.one_of(overflowing_ints, wrong_types.filter(lambda v: v is not None), st.just(True))
        )
        return probe(
            "append",
            "expected_seq",
            "reject",
            conversation_id=conv,
            messages=good,
            expected_seq=value,
        )
    value = draw(
        st.one_of(
            wrong_types.filter(lambda v: v is not None),
            st.just({"input_tokens": 5}),
            st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, 10**30]).map(lambda n: ("huge", n)),
        )
    )
    if isinstance(value, tuple):
        return probe(
            "append",
            f"usage_{value[1].bit_length()}_bits",
            "reject" if value[1] > MAX_TOKEN_COUNT else "accept",
            conversation_id=conv,
            messages=good,
            # past Usage's own bound (MAX_TOKEN_COUNT), as model_construct can
            usage=Usage.model_construct(input_tokens=value[1], output_tokens=value[1]),
        )
    return probe(
        "append", "usage_wrong_type", "reject", conversation_id=conv, messages=good, usage=value
    )


def _has_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


@st.composite
def create_probes(draw: st.DrawFn) -> Probe:
    part = draw(st.sampled_from(["tenant", "metadata", "metadata", "conversation_id"]))
    if part == "tenant":
        tenant = draw(st.one_of(nasty_strings, wrong_types, st.just("t" * 257)))
        ok = isinstance(tenant, str) and tenant and NUL not in tenant and len(tenant) <= 256
        if tenant is None:  # the store's tenant, else "default"
            return probe("create_conversation", "tenant_default", "accept", tenant_id=None)
        if ok and not _has_surrogate(tenant):
            return probe("create_conversation", "tenant_ok", "accept", tenant_id=tenant)
        label = "tenant_surrogate" if ok else "tenant_bad"
        return probe("create_conversation", label, "reject", tenant_id=tenant)
    if part == "metadata":
        kind = draw(
            st.sampled_from(
                [
                    "nasty_value",
                    "nasty_key",
                    "deep",
                    "big",
                    "wrong_type",
                    "non_str_key",
                    "bad_override",
                    "unencodable",
                ]
            )
        )
        s = draw(nasty_strings)
        if kind == "nasty_value":
            expect = "reject" if _has_surrogate(s) else ("either" if NUL in s else "accept")
            return probe(
                "create_conversation",
                "metadata_nul" if NUL in s else "metadata_value",
                expect,
                metadata={"v": s, "list": [s]},
            )
        if kind == "nasty_key":
            # "compaction" is the key of the conversation's trigger overrides: an object.
            reserved = s == "compaction"
            expect = (
                "reject" if _has_surrogate(s) or reserved else ("either" if NUL in s else "accept")
            )
            return probe("create_conversation", "metadata_key", expect, metadata={s: 1})
        if kind == "deep":
            depth = draw(st.sampled_from([255, 300, 1_000, 10_000]))
            return probe(
                "create_conversation",
                f"metadata_deep_{depth}",
                "reject",
                metadata={"d": deep_nesting(depth, kind=draw(st.sampled_from(["dict", "list"])))},
            )
        if kind == "big":
            return probe("create_conversation", "metadata_10mb", "reject", metadata={"big": BIG})
        if kind == "wrong_type":
            return probe(
                "create_conversation",
                "metadata_wrong_type",
                "reject",
                metadata=draw(
                    st.one_of(
                        st.text(max_size=3),
                        st.integers(),
                        st.lists(st.integers(), max_size=2),
                        st.just(b"x"),
                    )
                ),
            )
        if kind == "non_str_key":
            return probe(
                "create_conversation",
                "metadata_non_str_key",
                "reject",
                metadata={draw(st.one_of(st.integers(), st.none(), st.just((1, 2)))): 1},
            )
        if kind == "bad_override":
            value = draw(
                st.one_of(overflowing_ints, st.just(-1), st.just("8"), st.just(True), st.just(1.5))
            )
            key = draw(
                st.sampled_from(
                    ["trigger_unfinished_turns", "trigger_context_tokens", "unknown_key"]
                )
            )
            return probe(
                "create_conversation",
                "metadata_bad_override",
                "reject",
                metadata={"compaction": {key: value}},
            )
        return probe(
            "create_conversation",
            "metadata_unencodable",
            "reject",
            metadata={"v": draw(st.sampled_from([object(), {1, 2}, 2**64, complex(1, 2)]))},
        )
    how, value = draw(ids_of_conversations)
    if how == "bad" and value is None:
        return probe("create_conversation", "id_none", "accept", conversation_id=None)
    if how == "unknown":
        # a new id each time: hypothesis repeats values, and an id created here must stay
        # unknown for the read probes
        value = NEW_ID
    return probe(
        "create_conversation",
        f"id_{how}",
        "reject" if how == "bad" else "accept",
        conversation_id=value,
    )


@st.composite
def read_probes(draw: st.DrawFn, conv: UUID) -> Probe:
    entry = draw(
        st.sampled_from(
            ["load_context", "read_events", "mark_run_completed", "get_conversation", "pressure"]
        )
    )
    how, value = draw(ids_of_conversations)
    bad_id = probe(
        entry, f"id_{how}", "reject" if how == "bad" else "notfound", conversation_id=value
    )
    if entry in ("mark_run_completed", "get_conversation", "pressure") or draw(st.booleans()):
        return bad_id
    if entry == "load_context":
        cap = draw(st.one_of(overflowing_ints, wrong_types, st.just(0)))
        expect = "accept" if cap is None or (type(cap) is int and cap >= 1) else "reject"
        return probe(
            entry,
            "max_tool_result_tokens",
            expect,
            conversation_id=conv,
            max_tool_result_tokens=cap,
        )
    part = draw(st.sampled_from(["after_seq", "limit"]))
    value = draw(
        st.one_of(overflowing_ints, wrong_types, st.just(0), st.just(10_001), st.just(2**63 - 1))
    )
    if part == "after_seq":
        ok = type(value) is int and 0 <= value < 2**63
        return probe(
            entry, "after_seq", "accept" if ok else "reject", conversation_id=conv, after_seq=value
        )
    ok = type(value) is int and 1 <= value <= 10_000
    return probe(entry, "limit", "accept" if ok else "reject", conversation_id=conv, limit=value)


@st.composite
def boundary_probes(draw: st.DrawFn, conv: UUID) -> Probe:
    """write_boundary on a fresh conversation (seq 1 a user message, seq 2 a call still open)."""
    base: dict[str, Any] = {
        "conversation_id": FRESH,
        "summary": "s",
        "covers_through_seq": 1,
        "reason": "manual_recovery",
        "expected_boundary_seq": -1,  # replaced below
    }
    part = draw(
        st.sampled_from(
            [
                "conversation_id",
                "summary",
                "covers",
                "retained",
                "reason",
                "expected",
                "retention",
                "lease_token",
                "usage",
                "model",
                "tokens_before",
                "pressure",
            ]
        )
    )
    label, expect = part, "reject"
    value: Any
    if part == "conversation_id":
        how, value = draw(ids_of_conversations)
        base["conversation_id"] = value
        label, expect = f"id_{how}", "reject" if how == "bad" else "notfound"
    elif part == "summary":
        value = draw(st.one_of(nasty_strings, wrong_types, st.just(BIG)))
        base["summary"] = value
        if value is BIG:
            label, expect = "summary_10mb", "either"
        elif isinstance(value, str) and value.strip() and not _has_surrogate(value):
            label, expect = "summary_nul" if NUL in value else "summary_ok", "either"
        else:
            label = (
                "summary_surrogate"
                if isinstance(value, str) and _has_surrogate(value)
                else "summary_bad"
            )
    elif part == "covers":
        value = draw(
            st.one_of(
                overflowing_ints,
                wrong_types,
                st.just(0),
                st.just(2),
                st.just(3),
                st.just(4),
                st.just(2**63 - 1),
            )
        )
        base["covers_through_seq"] = value
        label = (
            {2: "covers_unsafe_open_call", 3: "covers_past_end", 4: "covers_past_end"}.get(
                value, "covers_bad"
            )
            if type(value) is int
            else "covers_bad"
        )
        if label == "covers_bad" and type(value) is int and value >= 2**63:
            label = "covers_overflow"
    elif part == "retained":
        value = draw(
            st.one_of(
                st.just("a string"),
                st.lists(st.one_of(nasty_strings, wrong_types), min_size=1, max_size=3),
                wrong_types.filter(lambda v: not isinstance(v, list | dict) and v is not None),
            )
        )
        base["retained"] = value
        ok = isinstance(value, list) and all(
            isinstance(t, str) and not _has_surrogate(t) for t in value
        )
        label, expect = ("retained_ok", "either") if ok else ("retained_bad", "reject")
    elif part == "reason":
        value = draw(st.one_of(nasty_strings, wrong_types))
        base["reason"] = value
        ok = isinstance(value, str) and value and not _has_surrogate(value)
        label, expect = (
            ("reason_ok", "either")
            if ok
            else (
                "reason_surrogate" if isinstance(value, str) and value else "reason_bad",
                "reject",
            )
        )
    elif part == "expected":
        value = draw(
            st.one_of(overflowing_ints, wrong_types.filter(lambda v: v is not None), st.just(True))
        )
        base["expected_boundary_seq"] = value
        label = "expected_boundary_seq"
    elif part == "retention":
        base["retention"] = draw(st.one_of(nasty_strings, wrong_types))
    elif part == "lease_token":
        base["lease_token"] = draw(st.one_of(bad_uuids.filter(lambda v: v is not None)))
        label = "lease_token_not_uuid"
    elif part == "usage":
        base["usage"] = draw(
            st.one_of(wrong_types.filter(lambda v: v is not None), st.just({"input_tokens": 1}))
        )
        label = "usage_wrong_type"
    elif part == "model":
        value = draw(st.one_of(nasty_strings, wrong_types.filter(lambda v: v is not None)))
        base[draw(st.sampled_from(["model", "prompt_version"]))] = value
        if isinstance(value, str):
            label, expect = (
                ("model_surrogate", "reject") if _has_surrogate(value) else ("model_text", "either")
            )
        else:
            label = "model_not_str"
    elif part == "tokens_before":
        value = draw(st.one_of(overflowing_ints, wrong_types.filter(lambda v: v is not None)))
        base["tokens_before"] = value
        label = "tokens_before_bad"
    else:
        base["pressure"] = draw(wrong_types.filter(lambda v: v is not None))
        label = "pressure_wrong_type"
    base["expected_boundary_seq"] = base["expected_boundary_seq"] if part == "expected" else None
    return probe("write_boundary", label, expect, **base)


@st.composite
def queue_probes(draw: st.DrawFn, conv: UUID) -> Probe:
    """claim_due / claim_conversation with one hostile argument at a time."""
    entry = draw(st.sampled_from(["claim_conversation", "claim_due"]))
    args: dict[str, Any] = {"owner": "fuzz-worker", "lease_seconds": 1.0}
    if entry == "claim_due":
        args["limit"] = 1
    else:
        args["reason"] = "manual_recovery"
        how, value = draw(st.one_of(st.just(("known", conv)), ids_of_conversations))
        args["conversation_id"] = value
        if how == "bad":
            return probe(entry, "id_bad", "reject", **args)
    part = draw(
        st.sampled_from(["lease_seconds", "owner", "limit" if entry == "claim_due" else "reason"])
    )
    if part == "lease_seconds":
        value = draw(
            st.one_of(
                st.floats(allow_nan=True, allow_infinity=True),
                st.integers(-5, 0),
                overflowing_ints,
                wrong_types,
                st.just(1e300),
            )
        )
        ok = type(value) in (int, float) and math.isfinite(value) and 0 < value <= MAX_LEASE_SECONDS
    elif part == "limit":
        value = draw(st.one_of(st.integers(-3, 0), overflowing_ints, wrong_types, st.just(10_000)))
        ok = type(value) is int and 1 <= value <= 10_000
    else:
        value = draw(st.one_of(nasty_strings, wrong_types))
        ok = (
            isinstance(value, str)
            and bool(value)
            and NUL not in value
            and not _has_surrogate(value)
        )
        if isinstance(value, str) and _has_surrogate(value):
            part += "_surrogate"
    args[part.removesuffix("_surrogate")] = value
    label = "ok" if ok else part
    expect = "either" if ok else "reject"
    if ok and args.get("conversation_id") not in (None, conv):
        expect = "notfound"
    return probe(entry, label, expect, **args)


@st.composite
def openai_probes(draw: st.DrawFn) -> Probe:
    kind = draw(
        st.sampled_from(
            ["role", "content", "deep_content", "tool_calls", "not_a_dict", "tool_no_id", "nasty"]
        )
    )
    if kind == "role":
        role = draw(
            st.one_of(st.sampled_from(["wizard", "", "USER", "function", NUL]), wrong_types)
        )
        return probe("from_openai", "unknown_role", "reject", data={"role": role, "content": "x"})
    if kind == "content":
        return probe(
            "from_openai",
            "content_wrong_type",
            "reject",
            data={
                "role": "user",
                "content": draw(
                    st.one_of(
                        st.integers(),
                        st.just({"a": 1}),
                        st.lists(
                            st.one_of(st.integers(), st.text(max_size=3)), min_size=1, max_size=2
                        ),
                    )
                ),
            },
        )
    if kind == "deep_content":
        depth = draw(st.sampled_from([300, 1_000, 5_000]))
        return probe(
            "from_openai",
            f"deep_content_{depth}",
            "reject",
            data={"role": "user", "content": [{"type": "x", "v": deep_nesting(depth)}]},
        )
    if kind == "tool_calls":
        calls = draw(
            st.one_of(
                wrong_types,
                st.just([{"id": 1}]),
                st.just([{"id": "a", "function": {"name": "", "arguments": "{}"}}]),
                st.just([{"id": "a", "function": {"name": "f", "arguments": 5}}]),
                st.just("abc"),
            )
        )
        expect = "reject" if calls else "either"  # a falsy value reads as "no calls"
        return probe(
            "from_openai",
            "tool_calls_bad",
            expect,
            data={"role": "assistant", "content": None, "tool_calls": calls},
        )
    if kind == "not_a_dict":
        return probe(
            "from_openai",
            "not_a_dict",
            "reject",
            data=draw(st.one_of(wrong_types, st.just("user"), st.just([("role", "user")]))),
        )
    if kind == "tool_no_id":
        return probe(
            "from_openai",
            "tool_result_without_call_id",
            "reject",
            data={"role": "tool", "content": "x"},
        )
    s = draw(nasty_strings)
    return probe(
        "from_openai", "nasty_text", "either", data={"role": "user", "content": s, "extra": s}
    )


@st.composite
def config_probes(draw: st.DrawFn) -> Probe:
    if draw(st.booleans()):
        url = draw(
            st.one_of(
                nasty_strings,
                wrong_types,
                st.sampled_from(
                    [
                        "mysql://x/y",
                        "postgresql+asyncpg://",
                        "://",
                        "sqlite",
                        "http://example.test",
                        "postgresql://u@h:notaport/d",
                    ]
                ),
            )
        )
        return probe("parse_database_url", "url", "either", url=url)
    name = draw(
        st.sampled_from(
            [
                "max_message_bytes",
                "pool_min_size",
                "pool_max_size",
                "lock_timeout_ms",
                "trigger_unfinished_turns",
                "trigger_context_tokens",
                "summarizer",
                "summarizer_timeout",
                "lease_seconds",
                "max_attempts",
                "backoff_base_seconds",
                "worker_concurrency",
                "metrics_port",
                "token_estimator",
                "database_url",
            ]
        )
    )
    value = draw(
        st.one_of(
            overflowing_ints,
            wrong_types,
            nasty_strings,
            st.just(-1),
            st.just(0),
            st.just("nan"),
            st.just(float("nan")),
        )
    )
    return probe("settings", name, "either", **{name: value})


# ---- running the probes -----------------------------------------------------------------


def _call(h: Harness, p: Probe) -> Any:
    s, kw = h.store, dict(p.kwargs)
    if kw.get("conversation_id") is NEW_ID:
        kw["conversation_id"] = p.kwargs["conversation_id"] = uuid4()
    if kw.get("conversation_id") is FRESH:
        # Probes that write (or may poison a conversation) get their own, so one accepted
        # probe cannot change what the next one meets.
        kw["conversation_id"] = h.run(h.fresh_conversation())
        p.kwargs["conversation_id"] = kw["conversation_id"]
        h.last_counts = h.run(h.counts())
    if p.entry == "from_openai":
        return lambda: Message.from_openai(kw["data"])
    if p.entry == "settings":
        return lambda: EpisodicSettings(_env_file=None, **kw).trigger_config()
    if p.entry == "parse_database_url":
        return lambda: parse_database_url(kw["url"])
    if p.entry == "write_boundary":
        # The request is checked as it is made: that is the entry point being fuzzed.
        conversation = kw.pop("conversation_id")
        return lambda: s.write_boundary(conversation, BoundaryRequest(**kw))
    method = getattr(s, p.entry)
    return lambda: method(**kw)


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("t10")
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres_server")
        template = request.getfixturevalue("postgres_template")
        urls = private_database("postgresql", server=server, template=template, tmp=tmp)
    else:
        template = request.getfixturevalue("sqlite_template")
        urls = private_database("sqlite", server=None, template=template, tmp=Path(tmp))
    for url in urls:
        h = Harness(url)
        try:
            yield h
        finally:
            h.close()


def _examples(h: Harness) -> int:
    return EXAMPLES if h.store.dialect == "postgresql" else SQLITE_EXAMPLES


def _fuzz(
    h: Harness, strategy: st.SearchStrategy[Probe], *, database: bool = True, entry_points: int = 1
) -> None:
    """``entry_points``: how many public entry points the strategy spreads its probes over,
    so that each gets about the battery's count."""

    @battery_settings(_examples(h) * entry_points)
    @given(p=strategy)
    def run(p: Probe) -> None:
        h.check(p, _call(h, p), database=database)

    run()


def test_fuzz_create_conversation(harness: Harness) -> None:
    _fuzz(harness, create_probes())


def test_fuzz_append(harness: Harness) -> None:
    _fuzz(harness, append_probes(harness.conv))


def test_fuzz_reads_and_run_completion(harness: Harness) -> None:
    # get_conversation, load_context, read_events, mark_run_completed, pressure
    _fuzz(harness, read_probes(harness.conv), entry_points=5)


def test_fuzz_write_boundary(harness: Harness) -> None:
    _fuzz(harness, boundary_probes(harness.conv))


def test_fuzz_queue(harness: Harness) -> None:
    _fuzz(harness, queue_probes(harness.conv), entry_points=2)  # claim_due, claim_conversation


def test_fuzz_from_openai(harness: Harness) -> None:
    _fuzz(harness, openai_probes(), database=False)


def test_fuzz_configuration(harness: Harness) -> None:
    # EpisodicSettings, parse_database_url
    _fuzz(harness, config_probes(), database=False, entry_points=2)


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_t10_summary(dialect: str) -> None:
    """Prints the figures (run with -s) and fails on any problem outside KNOWN_BUGS."""
    r = RESULTS[dialect]
    if not r.calls:
        pytest.skip(f"no {dialect} probes ran")
    lines = [
        f"\nT10 [{dialect}]: {sum(r.calls.values())} probes, {r.count_checks} row-count checks"
    ]
    for entry in sorted(r.calls):
        outcomes = {o: n for (e, o), n in sorted(r.outcomes.items()) if e == entry}
        times = r.reject_seconds.get(entry, [])
        lines.append(
            f"  {entry}: {r.calls[entry]} probes, refusals p99 {_p99(times) * 1000:.1f} ms "
            f"(max {max(times, default=0) * 1000:.1f} ms); {outcomes}"
        )
    unexpected = {k: v for k, v in r.failures.items() if known_bug(*k) is None}
    known = {k: v for k, v in r.failures.items() if known_bug(*k) is not None}
    driver = sum(n for (_, o), n in r.outcomes.items() if o.startswith("driver"))
    untyped = sum(n for (_, o), n in r.outcomes.items() if o.startswith("untyped"))
    lines.append(
        f"  untyped exceptions {untyped}, driver errors reaching the caller {driver} "
        f"(all within known bugs: {not unexpected}); refusals p99 over all entry points "
        f"{_p99([t for ts in r.reject_seconds.values() for t in ts]) * 1000:.1f} ms"
    )
    for (entry, label), examples in sorted(known.items()):
        lines.append(
            f"  KNOWN {known_bug(entry, label)} ({REGRESSIONS}) {entry}/{label}: {examples[0]}"
        )
    for (entry, label), examples in sorted(unexpected.items()):
        lines.append(f"  FAILURE {entry}/{label}: {examples[0]}")
    print("\n".join(lines))
    assert not unexpected, f"{len(unexpected)} probe classes failed; see the summary above"
