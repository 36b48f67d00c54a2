"""Properties of ``load_context`` over random operation sequences, on PostgreSQL and SQLite.

Each example drives a fresh conversation through user messages (multibyte and emoji text
included), assistant messages with 0-3 parallel tool calls, tool results (some after an
interrupting user message, some in the call's own batch), run completions (which abandon the
calls still open) and summary boundaries at a safe cut, then appends one more user message and
checks the loaded context two ways: against episodic's own ``validate_history`` and against a
strict chat-completions validator written here from the wire rules alone.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall, ValidationError
from episodic.context import Context
from episodic.loop import validate_history
from episodic.models import ImageBlock, MessageEvent, StoredEvent, TextBlock
from episodic.policy import safe_cut, safe_cut_at_or_before
from tests.support import assert_stored_context_is, sent_after_cut

MAX_EVENTS = 10_000

PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,  # no .hypothesis directory in the repository
    # The explain phase re-runs a failure hundreds of times against the database: minutes.
    phases=[Phase.explicit, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# ---- strategies ---------------------------------------------------------------------------

MULTIBYTE = [
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🧪🚀👩‍💻",
    "🏳️‍🌈 flag",
    "Ελληνικά и кириллица",
    "a\u0301 combining",
    "tab\tnew\nline",
]
texts = st.one_of(st.text(max_size=24), st.sampled_from(MULTIBYTE))
non_blank_texts = st.one_of(
    st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != ""), st.sampled_from(MULTIBYTE)
)
ID_PREFIXES = ["call_", "toolu_", "fc-é-", "🔧"]

#: ``data.draw`` of an interactive example (``st.DataObject``).
Draw = Callable[..., Any]


@st.composite
def user_contents(draw: st.DrawFn) -> Any:
    """A string, or text and image blocks a chat-completions user message may carry."""
    if draw(st.integers(0, 3)) > 0:
        return draw(texts)
    blocks = st.one_of(
        st.builds(TextBlock, text=texts),
        st.builds(
            ImageBlock,
            url=st.sampled_from(["data:image/png;base64,AAAA", "https://example.test/ü.png"]),
            detail=st.sampled_from([None, "low", "high", "auto"]),
        ),
    )
    return tuple(draw(st.lists(blocks, min_size=1, max_size=3)))


@st.composite
def tool_contents(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 3)) > 0:
        return draw(texts)
    return tuple(draw(st.lists(st.builds(TextBlock, text=texts), min_size=1, max_size=2)))


@dataclass
class Model:
    """What the test knows about the conversation while generating operations."""

    open_ids: list[str] = field(default_factory=list)
    closed_ids: set[str] = field(default_factory=set)
    counter: int = 0
    boundaries: int = 0
    log: list[str] = field(default_factory=list)
    notes: set[str] = field(default_factory=set)  # what happened, for hypothesis.event
    interrupted: set[str] = field(default_factory=set)  # open calls a user message followed

    def new_id(self, draw: Draw, taken: Sequence[str]) -> str:
        reusable = sorted(i for i in self.closed_ids if i not in taken)
        if reusable and draw(st.integers(0, 4)) == 0:
            self.notes.add("reused-id")
            return str(draw(st.sampled_from(reusable)))
        self.counter += 1
        return f"{draw(st.sampled_from(ID_PREFIXES))}{self.counter}"


async def _step(store: EpisodicStore, conv: UUID, model: Model, draw: Draw) -> None:
    kinds = ["user", "user", "assistant", "calls", "calls", "run_completed", "boundary", "boundary"]
    if model.open_ids:
        kinds += ["result", "result", "result", "user", "run_completed"]
    if draw(st.integers(0, 19)) == 0:
        kinds = ["system"]
    kind = draw(st.sampled_from(kinds))
    model.log.append(kind)
    if kind == "user":
        model.interrupted.update(model.open_ids)
        await store.append(conv, [Message.user(draw(user_contents()))])
    elif kind == "system":
        await store.append(conv, [Message.system(draw(texts))])
    elif kind == "assistant":
        content = draw(st.one_of(texts, st.builds(lambda t: (TextBlock(text=t),), texts)))
        await store.append(conv, [Message.assistant(content, reasoning=draw(st.none() | texts))])
    elif kind == "calls":
        ids: list[str] = []
        for _ in range(draw(st.integers(1, 3))):
            ids.append(model.new_id(draw, ids + model.open_ids))
        calls = [
            ToolCall(
                id=i, name=draw(st.sampled_from(["run", "read_file"])), args={"q": draw(texts)}
            )
            for i in ids
        ]
        batch = [Message.assistant(draw(st.none() | texts), tool_calls=calls)]
        # Some results arrive in the call's own batch, in any order.
        answered_now = draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
        if answered_now:
            model.notes.add("same-batch-result")
        for call_id in answered_now:
            batch.append(Message.tool_result(call_id, draw(tool_contents()), name="run"))
        await store.append(conv, batch)
        model.open_ids.extend(i for i in ids if i not in answered_now)
        model.closed_ids.difference_update(ids)
        model.interrupted.difference_update(ids)
        model.closed_ids.update(answered_now)
    elif kind == "result":
        chosen = draw(
            st.lists(st.sampled_from(model.open_ids), min_size=1, max_size=2, unique=True)
        )
        await store.append(
            conv,
            [
                Message.tool_result(
                    i, draw(tool_contents()), name="run", is_error=draw(st.booleans())
                )
                for i in chosen
            ],
        )
        if model.interrupted.intersection(chosen):
            model.notes.add("result-after-user")
        for call_id in chosen:
            model.open_ids.remove(call_id)
            model.closed_ids.add(call_id)
    elif kind == "run_completed":
        completed = await store.mark_run_completed(conv)
        assert set(completed.abandoned_tool_call_ids) == set(model.open_ids)
        if model.open_ids:
            model.notes.add("abandoned")
        model.closed_ids.update(model.open_ids)
        model.open_ids.clear()
    elif kind == "boundary":
        await _write_boundary(store, conv, model, draw)


async def _write_boundary(store: EpisodicStore, conv: UUID, model: Model, draw: Draw) -> None:
    events = await store.read_events(conv, limit=MAX_EVENTS)
    head = await store.get_conversation(conv)
    if not events:
        return
    if draw(st.booleans()):
        cut = safe_cut(events)
    else:
        cut = safe_cut_at_or_before(events, draw(st.integers(1, head.last_seq)))
    if cut < 1 or cut < head.covers_through_seq:
        model.log.append("boundary-skipped")
        return
    await store.write_boundary(
        conv,
        BoundaryRequest(
            summary=draw(non_blank_texts),
            covers_through_seq=cut,
            retained=draw(st.lists(texts, max_size=3)),
            reason=draw(
                st.sampled_from(["context_pressure", "unfinished_turns", "manual_recovery"])
            ),
            retention=draw(st.sampled_from(["recent_user_messages", "recent_turns"])),
            expected_boundary_seq=head.boundary_seq,
        ),
    )
    model.boundaries += 1
    model.log.append(f"boundary@{cut}")


# ---- a strict chat-completions validator, written from the wire rules alone ---------------

_TOP_KEYS = {
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "tool_calls", "name", "refusal"},
    "tool": {"role", "content", "tool_call_id"},
}


def _text_part(part: Any, where: str) -> None:
    assert isinstance(part, dict), f"{where}: a content part must be an object"
    assert set(part) == {"type", "text"}, f"{where}: text part keys {sorted(part)}"
    assert part["type"] == "text", f"{where}: part type {part['type']!r}"
    assert isinstance(part["text"], str), f"{where}: text must be a string"


def _user_part(part: Any, where: str) -> None:
    assert isinstance(part, dict), f"{where}: a content part must be an object"
    if part.get("type") == "text":
        _text_part(part, where)
        return
    assert part.get("type") == "image_url", f"{where}: user part type {part.get('type')!r}"
    assert set(part) == {"type", "image_url"}, f"{where}: image part keys {sorted(part)}"
    image = part["image_url"]
    assert isinstance(image, dict), f"{where}: image_url must be an object"
    assert set(image) <= {"url", "detail"}, f"{where}: image_url keys {sorted(image)}"
    assert isinstance(image.get("url"), str), f"{where}: image_url.url must be a string"
    if "detail" in image:
        assert image["detail"] in ("auto", "low", "high"), f"{where}: detail {image['detail']!r}"


def _content(value: Any, where: str, *, part: Any, nullable: bool) -> None:
    if value is None:
        assert nullable, f"{where}: content must not be null here"
        return
    if isinstance(value, str):
        return
    assert isinstance(value, list), f"{where}: content must be a string or a list of parts"
    assert value, f"{where}: content part list must not be empty"
    for index, item in enumerate(value):
        part(item, f"{where}.content[{index}]")


def check_chat_completions_request(messages: Any) -> None:
    """Raise AssertionError unless ``messages`` is a list a strict chat-completions endpoint
    accepts as the whole message list of a request (no system message: none was given)."""
    assert isinstance(messages, list), "messages must be a list"
    assert messages, "messages must not be empty"
    # The request body is JSON: it must survive an encode/decode round trip unchanged.
    assert json.loads(json.dumps(messages, ensure_ascii=False)) == messages
    unanswered: set[str] = set()  # calls of the assistant message this tool run follows
    in_block = False  # the previous message is that assistant message or one of its results
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        assert isinstance(message, dict), f"{where} must be an object"
        role = message.get("role")
        assert role in _TOP_KEYS, f"{where}: role {role!r} (no system/developer message here)"
        extra = set(message) - _TOP_KEYS[role]
        assert not extra, f"{where}: unknown keys {sorted(extra)}"
        assert "content" in message, f"{where}: content is required"
        if "name" in message:
            assert isinstance(message["name"], str), f"{where}: name must be a string"
        if role == "tool":
            call_id = message.get("tool_call_id")
            assert isinstance(call_id, str), f"{where}: tool_call_id must be a string"
            assert in_block, f"{where}: a tool message must follow an assistant's tool_calls"
            assert call_id in unanswered, (
                f"{where}: tool_call_id {call_id!r} is not an unanswered call of the "
                "immediately preceding assistant message"
            )
            unanswered.discard(call_id)
            _content(message["content"], where, part=_text_part, nullable=False)
            continue
        assert not unanswered, f"{where}: {role} message before the results of {unanswered}"
        in_block = False
        if role == "user":
            _content(message["content"], where, part=_user_part, nullable=False)
            continue
        calls = message.get("tool_calls")
        if calls is not None:
            assert isinstance(calls, list), f"{where}: tool_calls must be a list"
            assert calls, f"{where}: tool_calls must not be empty when present"
            ids: list[str] = []
            for position, call in enumerate(calls):
                at = f"{where}.tool_calls[{position}]"
                assert isinstance(call, dict), f"{at} must be an object"
                assert set(call) == {"id", "type", "function"}, f"{at}: keys {sorted(call)}"
                assert call["type"] == "function", f"{at}: type {call['type']!r}"
                assert isinstance(call["id"], str), f"{at}: id must be a string"
                assert call["id"], f"{at}: id must not be empty"
                function = call["function"]
                assert isinstance(function, dict), f"{at}.function must be an object"
                assert set(function) == {"name", "arguments"}, f"{at}: keys {sorted(function)}"
                assert isinstance(function["name"], str), f"{at}: function name"
                assert function["name"], f"{at}: function name must not be empty"
                assert isinstance(function["arguments"], str), f"{at}: arguments string"
                ids.append(call["id"])
            assert len(set(ids)) == len(ids), f"{where}: duplicate tool call ids {ids}"
            unanswered = set(ids)
            in_block = True
        _content(message["content"], where, part=_text_part, nullable=calls is not None)
    assert not unanswered, f"the request ends before the results of {unanswered}"
    assert messages[-1]["role"] == "user", "the request must end with the user's message"


# ---- checks against the log ---------------------------------------------------------------


def _answered_calls(events: Sequence[StoredEvent]) -> dict[int, int]:
    """Seq of each stored tool result -> seq of the assistant message whose call it answers
    (ids may be reused once the earlier call was answered or abandoned)."""
    waiting: dict[str, int] = {}
    answers: dict[int, int] = {}
    for stored in events:
        if not isinstance(stored, MessageEvent):
            continue
        message = stored.message
        if message.tool_call_id is not None:
            answers[stored.seq] = waiting.pop(message.tool_call_id)
        for call in message.tool_calls:
            waiting[call.id] = stored.seq
    return answers


def check_against_log(ctx: Context, events: Sequence[StoredEvent], last_text: Any) -> None:
    by_seq: Mapping[int, StoredEvent] = {e.seq: e for e in events}
    boundary = ctx.boundary
    messages = list(ctx.messages)
    prefix = 0
    covers = 0
    if boundary is not None:
        covers = boundary.covers_through_seq
        handoff = messages[0]
        assert handoff.role == "user"
        assert handoff.text == boundary.summary
        assert handoff.seq == boundary.seq
        retained = messages[1 : 1 + len(boundary.retained)]
        assert [m.role for m in retained] == ["user"] * len(boundary.retained)
        assert [m.text for m in retained] == list(boundary.retained)
        prefix = 1 + len(boundary.retained)
    body = messages[prefix:]
    answers = _answered_calls(events)

    # No stored result after the cut answers a call at or before it.
    assert not [r for r, c in answers.items() if r > covers and c <= covers]

    expected = sent_after_cut(events, covers)
    found = Counter(m.seq for m in body if m.seq is not None)
    assert found == expected, "every stored message after the cut appears exactly once"

    current_call_seq: int | None = None
    previous_seq = covers
    answered_pairs = {
        (c, e.message.tool_call_id)
        for r, c in answers.items()
        if isinstance(e := by_seq[r], MessageEvent)
    }
    for message in body:
        if message.seq is not None:
            stored = by_seq[message.seq]
            assert isinstance(stored, MessageEvent)
            assert message.stored_fields() == stored.message.stored_fields()
        if message.role != "tool":
            assert message.seq is not None
            assert message.seq > previous_seq, "non-tool messages keep the log's order"
            previous_seq = message.seq
            current_call_seq = message.seq if message.tool_calls else None
            continue
        assert current_call_seq is not None
        if message.seq is not None:
            assert answers[message.seq] == current_call_seq, "a result sits under its own call"
        else:
            assert message.is_error
            assert (current_call_seq, message.tool_call_id) not in answered_pairs

    assert body, "the new user message is in the context"
    assert body[-1].role == "user"
    assert body[-1].content == last_text


# ---- the property -------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(data=st.data())
async def test_loaded_context_is_a_valid_request(store: EpisodicStore, data: st.DataObject) -> None:
    conv = await store.create_conversation()
    model = Model()
    for _ in range(data.draw(st.integers(1, 20), label="steps")):
        await _step(store, conv, model, data.draw)
    last = data.draw(user_contents(), label="new prompt")
    await store.append(conv, [Message.user(last)])
    data.draw(st.just(model.log), label="operations")
    event(f"boundaries: {min(model.boundaries, 2)}")
    for note in sorted(model.notes):
        event(note)

    ctx = await store.load_context(conv)
    events = await store.read_events(conv, limit=MAX_EVENTS)
    head = await store.get_conversation(conv)

    validate_history(list(ctx.messages))
    check_chat_completions_request(ctx.to_openai())
    assert_stored_context_is(await store.load_stored_context(conv), ctx)
    check_against_log(ctx, events, last)
    assert ctx.last_seq == head.last_seq
    if model.boundaries:
        assert ctx.boundary is not None
        assert ctx.boundary.seq == head.boundary_seq
        assert ctx.messages[0].seq == head.boundary_seq
    else:
        assert ctx.boundary is None
        assert head.boundary_seq is None


# ---- the validator rejects what it should (so passing it means something) ------------------


def _ok() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "run", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "run", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "A"}]},
        {"role": "user", "content": [{"type": "text", "text": "next"}]},
    ]


def _broken(case: str) -> list[dict[str, Any]]:
    messages = _ok()
    if case == "system":
        messages.insert(0, {"role": "system", "content": "s"})
    elif case == "result-after-user":
        messages.insert(2, {"role": "user", "content": "wait"})
    elif case == "missing-result":
        del messages[3]
    elif case == "duplicate-result":
        messages.insert(3, {"role": "tool", "tool_call_id": "b", "content": "B"})
    elif case == "orphan-result":
        messages.insert(1, {"role": "tool", "tool_call_id": "a", "content": "A"})
    elif case == "ends-with-tool":
        messages.pop()
    elif case == "null-user-content":
        messages[0]["content"] = None
    elif case == "null-assistant-content":
        messages.insert(1, {"role": "assistant", "content": None})
    elif case == "image-extra-key":
        messages[0]["content"] = [{"type": "image_url", "image_url": {"url": "u"}, "alt": "x"}]
    elif case == "tool-name":
        messages[2]["name"] = "run"
    return messages


def test_the_validator_accepts_a_valid_request() -> None:
    check_chat_completions_request(_ok())


@pytest.mark.parametrize(
    "case",
    [
        "system",
        "result-after-user",
        "missing-result",
        "duplicate-result",
        "orphan-result",
        "ends-with-tool",
        "null-user-content",
        "null-assistant-content",
        "image-extra-key",
        "tool-name",
    ],
)
def test_the_validator_rejects(case: str) -> None:
    with pytest.raises(AssertionError):
        check_chat_completions_request(_broken(case))


# ---- regressions: bugs the property found ----------------------------------------------


async def test_image_alt_text_is_not_sent_as_an_unknown_key(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    image = ImageBlock(url="https://example.test/cat.png", alt="a cat")
    await store.append(conv, [Message.user((TextBlock(text="look"), image))])
    check_chat_completions_request((await store.load_context(conv)).to_openai())


async def test_empty_assistant_message_is_refused_or_never_sent(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    try:
        await store.append(conv, [Message.user("hi"), Message.assistant(None)])
    except ValidationError:
        return
    await store.append(conv, [Message.user("again")])
    check_chat_completions_request((await store.load_context(conv)).to_openai())


async def test_nul_in_a_tool_call_id_is_a_validation_error(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    call = ToolCall(id="call\x00one", name="run")
    with pytest.raises(ValidationError):
        await store.append(conv, [Message.user("go"), Message.assistant(None, tool_calls=[call])])
