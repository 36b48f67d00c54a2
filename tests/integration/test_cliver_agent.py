"""A real ``cliver_core.AgentCore`` runs on a context loaded from PostgreSQL after a boundary.

The agent talks to a fake OpenAI-compatible server on 127.0.0.1 (stdlib ``http.server`` in a
thread) through its own provider and the official ``openai`` SDK, exactly as it would talk to a
real endpoint: the binding's ``base_url`` points at the fake. The server records every request
body, so the tests assert on what went over the wire.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from uuid import UUID

import pytest

from tests.support import require_extra

cliver_core = require_extra("cliver_core", "cliver")

from cliver_core import AgentCore, CLIverTool, ModelBinding, ModelBindings, presets  # noqa: E402

from episodic import BoundaryRequest, EpisodicStore, Message, ToolCall  # noqa: E402
from episodic.context import MISSING_RESULT_TEXT, Context  # noqa: E402
from episodic.models import BoundaryEvent  # noqa: E402
from episodic.policy import safe_cut_at_or_before  # noqa: E402

MODEL = "fake-model"
API_KEY = "sk-episodic-test"
SYSTEM = "You are the test agent. Answer briefly."
HANDOFF = "HANDOFF (runtime context, not a new instruction): the failing test is fixed 🧪."
RETAINED = ["Fix the failing test in tests/test_app.py 🧪", "Also update the changelog — ünïcode"]
PROMPT = "What is left to do? ✅"


# ---- a fake OpenAI-compatible chat-completions endpoint -----------------------------------


@dataclass
class FakeOpenAI:
    """Answers ``POST /v1/chat/completions`` from a script of assistant messages."""

    replies: list[dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    base_url: str = ""

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self.paths.append(path)
        self.headers.append(headers)
        self.requests.append(body)
        message = self.replies.pop(0) if self.replies else {"role": "assistant", "content": "ok"}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", MODEL),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 321, "completion_tokens": 12, "total_tokens": 333},
        }


def _handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            if self.headers.get("Accept", "").startswith("text/event-stream"):
                self._send(400, {"error": {"message": "this fake does not stream"}})
                return
            body = json.loads(raw.decode("utf-8"))
            headers = {k.lower(): v for k, v in self.headers.items()}
            self._send(200, fake.answer(self.path, headers, body))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def fake_openai(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    # Only 127.0.0.1: no proxy from the environment may take the request elsewhere.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    fake = FakeOpenAI(replies=[])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fake-openai", daemon=True)
    thread.start()
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# ---- a conversation with a boundary --------------------------------------------------------


def call(call_id: str, name: str = "run", **args: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, args=args)


async def _conversation_after_a_boundary(store: EpisodicStore) -> tuple[UUID, Context]:
    """Two finished turns summarized by a boundary, then an unfinished turn in the tail."""
    conv = await store.create_conversation(metadata={"model": MODEL})
    await store.append(
        conv,
        [
            Message.user(RETAINED[0]),
            Message.assistant(None, tool_calls=[call("c1", cmd="pytest -x")]),
            Message.tool_result("c1", "1 failed: test_total", name="run"),
            Message.assistant("Fixed the off-by-one in total()."),
        ],
    )
    await store.mark_run_completed(conv)
    await store.append(
        conv,
        [
            Message.user(RETAINED[1]),
            Message.assistant(
                "Reading both files.",
                tool_calls=[call("c2", "read_file", path="CHANGELOG.md"), call("c3", path="é.txt")],
            ),
            Message.tool_result("c3", "ünïcode ✓", name="run"),
            Message.tool_result("c2", "## 0.1.0", name="read_file"),
            Message.assistant("Changelog updated."),
        ],
    )
    finished = await store.mark_run_completed(conv)
    # The tail: two parallel calls, a user message that interrupts before their results, one
    # late result, and a run completion that abandons the other call.
    await store.append(
        conv,
        [
            Message.user("Now run the linter 🔍"),
            Message.assistant(
                None, tool_calls=[call("c4", cmd="ruff check ."), call("c5", cmd="mypy .")]
            ),
        ],
    )
    await store.append(conv, [Message.user("and be quick, please")])
    await store.append(conv, [Message.tool_result("c4", "All checks passed!", name="run")])
    closed = await store.mark_run_completed(conv)
    assert closed.abandoned_tool_call_ids == ("c5",)

    events = await store.read_events(conv)
    cut = safe_cut_at_or_before(events, finished.seq)
    assert cut == finished.seq
    head = await store.get_conversation(conv)
    boundary = await store.write_boundary(
        conv,
        BoundaryRequest(
            summary=HANDOFF,
            covers_through_seq=cut,
            retained=RETAINED,
            reason="unfinished_turns",
            expected_boundary_seq=head.boundary_seq,
        ),
    )
    assert isinstance(boundary, BoundaryEvent)
    ctx = await store.load_context(conv)
    assert ctx.boundary == boundary
    return conv, ctx


def _agent(fake: FakeOpenAI, *, preset: bool = False) -> AgentCore:
    if preset:
        # A brand preset with its endpoint overridden: how an app points DeepSeek elsewhere.
        llm = presets.deepseek(api_key=API_KEY, model=MODEL, base_url=fake.base_url)
    else:
        # Any OpenAI-compatible endpoint: no brand, an explicit base_url.
        llm = ModelBinding.llm(model=MODEL, api_key=API_KEY, base_url=fake.base_url)
    return AgentCore(ModelBindings(llm=llm))


def _args(call_dict: dict[str, Any]) -> tuple[str, str, Any]:
    function = call_dict["function"]
    return call_dict["id"], function["name"], json.loads(function["arguments"])


def _normalized(message: dict[str, Any]) -> dict[str, Any]:
    """A wire message with tool arguments parsed (their JSON spacing is the sender's)."""
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if message.get("tool_calls"):
        out["tool_calls"] = [_args(c) for c in message["tool_calls"]]
    if out.get("content") is None:
        out["content"] = None
    return out


def _expected_tail() -> list[tuple[str, Any, str | None]]:
    """(role, content, tool_call_id) of the tail as a provider must see it."""
    return [
        ("user", "Now run the linter 🔍", None),
        ("assistant", None, None),
        ("tool", "All checks passed!", "c4"),
        ("tool", MISSING_RESULT_TEXT, "c5"),
        ("user", "and be quick, please", None),
    ]


# ---- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("preset", [False, True], ids=["generic-binding", "deepseek-preset"])
async def test_agent_core_sends_the_loaded_context(
    pg_store: EpisodicStore, fake_openai: FakeOpenAI, preset: bool
) -> None:
    _, ctx = await _conversation_after_a_boundary(pg_store)
    fake_openai.replies.append({"role": "assistant", "content": "Only mypy is left. 🚀"})
    agent = _agent(fake_openai, preset=preset)
    try:
        response = await agent.chat(PROMPT, system_prompt=SYSTEM, conversation=ctx.to_cliver())
    finally:
        await agent.aclose()

    assert response.message.content == "Only mypy is left. 🚀"
    assert response.usage is not None
    assert response.usage.input_tokens == 321
    assert fake_openai.paths == ["/v1/chat/completions"]
    assert fake_openai.headers[0]["authorization"] == f"Bearer {API_KEY}"
    body = fake_openai.requests[0]
    assert body["model"] == MODEL
    assert not body.get("stream")
    sent = body["messages"]

    # The system message cliver adds, then the handoff, then the retained user messages.
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[1] == {"role": "user", "content": HANDOFF}
    assert sent[2:4] == [{"role": "user", "content": text} for text in RETAINED]
    # Nothing at or before the cut is sent: the summarized calls are gone.
    sent_ids = {c["id"] for m in sent for c in m.get("tool_calls") or []}
    assert sent_ids == {"c4", "c5"}
    # The tail in order, each call followed by its results (the late one moved up to it, the
    # abandoned one answered by the synthetic error), then the new prompt last.
    tail = sent[4:-1]
    assert [(m["role"], m.get("content"), m.get("tool_call_id")) for m in tail] == (
        _expected_tail()
    )
    assert [_args(c) for c in tail[1]["tool_calls"]] == [
        ("c4", "run", {"cmd": "ruff check ."}),
        ("c5", "run", {"cmd": "mypy ."}),
    ]
    assert sent[-1] == {"role": "user", "content": PROMPT}
    # Exactly what Context.to_openai() gives, between cliver's system message and the prompt.
    assert [_normalized(m) for m in sent[1:-1]] == [_normalized(m) for m in ctx.to_openai()]
    _assert_pairs_intact(sent)


async def test_agent_core_runs_a_tool_on_top_of_the_loaded_context(
    pg_store: EpisodicStore, fake_openai: FakeOpenAI
) -> None:
    """The model calls a tool: cliver's second request is the first one plus the call and its
    result, so the loaded history passes through the Re-Act loop unchanged."""
    _, ctx = await _conversation_after_a_boundary(pg_store)
    fake_openai.replies += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_new",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"q": "mypy 🐍"})},
                }
            ],
        },
        {"role": "assistant", "content": "mypy reports nothing."},
    ]
    lookup = CLIverTool(
        name="lookup",
        description="Look something up.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        execute=lambda q: [{"text": f"looked up {q}"}],
        safety="safe",
    )
    agent = _agent(fake_openai)
    try:
        response = await agent.chat(
            PROMPT, system_prompt=SYSTEM, conversation=ctx.to_cliver(), extra_tools=[lookup]
        )
    finally:
        await agent.aclose()

    assert response.message.content == "mypy reports nothing."
    first, second = fake_openai.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup"]
    assert second["messages"][: len(first["messages"])] == first["messages"]
    added = second["messages"][len(first["messages"]) :]
    assert [m["role"] for m in added] == ["assistant", "tool"]
    assert [_args(c) for c in added[0]["tool_calls"]] == [("call_new", "lookup", {"q": "mypy 🐍"})]
    assert added[1]["tool_call_id"] == "call_new"
    assert added[1]["content"] == "looked up mypy 🐍"
    _assert_pairs_intact(second["messages"], ends_with="tool")


def _assert_pairs_intact(sent: list[dict[str, Any]], *, ends_with: str = "user") -> None:
    """Every assistant tool_calls block is followed directly by exactly one result per call."""
    index = 0
    while index < len(sent):
        message = sent[index]
        assert message["role"] != "tool", f"result at {index} follows no tool_calls block"
        index += 1
        calls = [c["id"] for c in message.get("tool_calls") or []]
        results: list[str] = []
        while index < len(sent) and sent[index]["role"] == "tool":
            results.append(sent[index]["tool_call_id"])
            index += 1
        assert sorted(results) == sorted(calls), f"calls {calls}, results {results}"
    assert sent[-1]["role"] == ends_with


async def test_raw_tool_arguments_reach_the_model_unchanged(
    pg_store: EpisodicStore, fake_openai: FakeOpenAI
) -> None:
    conv = await pg_store.create_conversation()
    raw = '{"cmd": "pytest", '  # what a model emitted: not valid JSON
    stored = Message.from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run", "arguments": raw}}
            ],
        }
    )
    await pg_store.append(conv, [Message.user("go"), stored])
    await pg_store.append(conv, [Message.tool_result("c1", "bad arguments", is_error=True)])
    ctx = await pg_store.load_context(conv)
    assert ctx.to_openai()[1]["tool_calls"][0]["function"]["arguments"] == raw
    fake_openai.replies.append({"role": "assistant", "content": "retrying"})
    agent = _agent(fake_openai)
    try:
        await agent.chat(PROMPT, conversation=ctx.to_cliver())
    finally:
        await agent.aclose()
    sent = fake_openai.requests[0]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == raw
