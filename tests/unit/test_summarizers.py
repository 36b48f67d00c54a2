"""The summarizer adapters: OpenAI-compatible over real HTTP against a fake server, an agent
object (a stand-in and, when installed, a real cliver-core AgentCore), and the extractive one."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from episodic.compaction import (
    DEFAULT_SUMMARY_PREFIX,
    CompactionConfig,
    CompactionRequest,
    finalize_compaction,
    prepare_compaction,
)
from episodic.errors import ConfigurationError, EpisodicError
from episodic.models import Message, ToolCall, Usage
from episodic.settings import EpisodicSettings
from episodic.summarizers import (
    AgentSummarizer,
    ExtractiveSummarizer,
    OpenAIChatSummarizer,
    Summarizer,
    SummarizerError,
    SummaryResult,
    parse_transcript,
)
from episodic.summarizers.openai_chat import OPENAI_BASE_URL
from episodic.tokens import CharHeuristic
from episodic.worker.setup import summarizer_from_settings
from tests.support_openai import FakeOpenAIServer, Reply, chat_completion, error_body

CHARS = CharHeuristic()
PROMPT = "Write a handoff note.\n\nSession transcript, oldest first:\n\n[user]\nRename the module"


def _request(prompt: str = PROMPT) -> CompactionRequest:
    return CompactionRequest(
        prompt=prompt,
        source_messages=1,
        omitted_messages=0,
        transcript_tokens=CHARS.count(prompt),
        request_tokens=CHARS.count(prompt),
    )


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as running:
        yield running


@pytest.fixture
async def summarizer(server: FakeOpenAIServer) -> AsyncIterator[OpenAIChatSummarizer]:
    async with OpenAIChatSummarizer(
        "cheap-model", base_url=server.base_url, api_key="sk-test", timeout=5.0
    ) as opened:
        yield opened


# ---- OpenAIChatSummarizer ---------------------------------------------------------------


async def test_openai_success_maps_text_usage_and_model(server: FakeOpenAIServer) -> None:
    server.add(
        chat_completion(
            "## Current request\nRename the module.",
            model="cheap-model-2025-01-01",
            prompt_tokens=120,
            completion_tokens=30,
            cached_tokens=40,
            reasoning_tokens=12,
        )
    )
    async with OpenAIChatSummarizer(
        "cheap-model",
        base_url=server.base_url,
        api_key="sk-test",
        max_output_tokens=500,
        temperature=0.2,
    ) as summarizer:
        result = await summarizer.summarize(_request())

    assert result == SummaryResult(
        text="## Current request\nRename the module.",
        usage=Usage(input_tokens=120, output_tokens=30, cache_read_tokens=40, reasoning_tokens=12),
        model="cheap-model-2025-01-01",
    )
    [received] = server.requests
    assert (received.method, received.path) == ("POST", "/v1/chat/completions")
    assert received.headers["authorization"] == "Bearer sk-test"
    body = received.json
    assert body["model"] == "cheap-model"
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][-1] == {"role": "user", "content": PROMPT}
    assert body["max_completion_tokens"] == 500
    assert body["temperature"] == 0.2
    assert "max_tokens" not in body
    assert not body.get("stream")


async def test_openai_optional_fields_and_older_max_tokens_name(server: FakeOpenAIServer) -> None:
    server.add(chat_completion("note", usage=False))
    async with OpenAIChatSummarizer(
        "m",
        base_url=server.base_url,
        api_key="k",
        system_prompt=None,
        max_output_tokens=64,
        max_tokens_field="max_tokens",
    ) as summarizer:
        result = await summarizer.summarize(_request())

    assert result.usage is None
    body = server.requests[0].json
    assert body["messages"] == [{"role": "user", "content": PROMPT}]
    assert body["max_tokens"] == 64
    assert "max_completion_tokens" not in body
    assert "temperature" not in body


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(429, True), (500, True), (502, True), (503, True), (400, False), (401, False),
     (403, False), (404, False)],
)  # fmt: skip
async def test_openai_http_errors_are_classified_and_not_retried_by_the_sdk(
    server: FakeOpenAIServer, summarizer: OpenAIChatSummarizer, status: int, retryable: bool
) -> None:
    server.add(Reply(status, error_body(f"scripted {status}")))

    with pytest.raises(SummarizerError) as caught:
        await summarizer.summarize(_request())

    error = caught.value
    assert isinstance(error, EpisodicError)
    assert error.retryable is retryable
    assert error.status_code == status
    assert f"HTTP {status}" in str(error)
    assert f" at {server.base_url} (model cheap-model): " in str(error)
    assert error.summarizer == "openai-chat:cheap-model"
    assert len(server.requests) == 1  # the worker owns retries, the SDK makes none


@pytest.mark.parametrize(
    ("status", "phrase", "retryable"),
    [(401, "Unauthorized", False), (500, "Internal Server Error", True)],
)
async def test_openai_http_error_names_the_url_and_the_model(
    server: FakeOpenAIServer,
    summarizer: OpenAIChatSummarizer,
    status: int,
    phrase: str,
    retryable: bool,
) -> None:
    server.add(Reply(status, error_body(f"scripted {status}")))

    with pytest.raises(SummarizerError) as caught:
        await summarizer.summarize(_request())

    where = f"{server.base_url} (model cheap-model)"
    assert str(caught.value).startswith(
        f"openai-chat:cheap-model at {where}: HTTP {status} {phrase}: "
    ), str(caught.value)
    assert f"scripted {status}" in str(caught.value)  # the server's own words
    assert caught.value.endpoint == where
    assert caught.value.retryable is retryable


async def test_openai_rate_limit_carries_the_retry_hint(
    server: FakeOpenAIServer, summarizer: OpenAIChatSummarizer
) -> None:
    server.add(Reply(429, error_body("slow down"), headers={"retry-after": "7"}))

    with pytest.raises(SummarizerError) as caught:
        await summarizer.summarize(_request())

    assert caught.value.retryable
    assert caught.value.retry_after == 7.0


async def test_openai_timeout_is_retryable(server: FakeOpenAIServer) -> None:
    hold = 30.0  # the answer exists only this long after the request arrived
    server.add(Reply(200, chat_completion("too late"), delay=hold))
    async with OpenAIChatSummarizer(
        "m", base_url=server.base_url, api_key="k", timeout=0.3
    ) as summarizer:
        started = time.monotonic()
        with pytest.raises(SummarizerError) as caught:
            await summarizer.summarize(_request())
        elapsed = time.monotonic() - started

    assert caught.value.retryable
    assert caught.value.status_code is None
    assert f" at {server.base_url} (model m): " in str(caught.value)
    # Cut by the timeout, not by the answer: a load-stalled loop may be late to cancel, but
    # only a client that waited for the reply can take the whole hold (same clock as asyncio).
    assert 0.3 <= elapsed < hold, elapsed
    assert len(server.requests) == 1


async def test_openai_unreachable_endpoint_is_retryable() -> None:
    async with FakeOpenAIServer() as closed:
        base_url = closed.base_url  # a port that is free again once the server stops
    async with OpenAIChatSummarizer("m", base_url=base_url, api_key="k", timeout=2.0) as summ:
        with pytest.raises(SummarizerError) as caught:
            await summ.summarize(_request())

    assert caught.value.retryable
    assert caught.value.status_code is None
    message = str(caught.value)
    assert message.startswith(f"openai-chat:m at {base_url} (model m): "), message
    assert "could not be reached" in message
    assert "ConnectError" in message  # the transport's reason, not only "Connection error."
    assert caught.value.endpoint == f"{base_url} (model m)"


@pytest.mark.parametrize("content", ["", "  \n ", None])
async def test_openai_empty_content_is_returned_as_empty_text(
    server: FakeOpenAIServer, summarizer: OpenAIChatSummarizer, content: str | None
) -> None:
    server.add(chat_completion(content))

    result = await summarizer.summarize(_request())

    assert result.text == (content or "")
    assert result.usage == Usage(input_tokens=10, output_tokens=5)


async def test_openai_response_without_choices_is_a_retryable_error(
    server: FakeOpenAIServer, summarizer: OpenAIChatSummarizer
) -> None:
    body = chat_completion("unused")
    body["choices"] = []
    server.add(body)

    with pytest.raises(SummarizerError, match="no choices") as caught:
        await summarizer.summarize(_request())

    assert caught.value.retryable


async def test_openai_client_passed_in_gets_no_retries_and_stays_open(
    server: FakeOpenAIServer,
) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="k", base_url=server.base_url, max_retries=5)
    summarizer = OpenAIChatSummarizer("m", client=client)
    server.add(Reply(500, error_body("boom")), chat_completion("second client call"))

    with pytest.raises(SummarizerError):
        await summarizer.summarize(_request())
    await summarizer.aclose()

    assert len(server.requests) == 1
    completion = await client.chat.completions.create(model="m", messages=[])
    assert completion.choices[0].message.content == "second client call"
    await client.close()


def test_openai_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)

    with pytest.raises(ConfigurationError, match=r"episodic-store\[openai\]"):
        OpenAIChatSummarizer("m", base_url="http://127.0.0.1:9/v1")


def test_openai_repr_hides_the_key() -> None:
    summarizer = OpenAIChatSummarizer("m", api_key="sk-secret")

    assert "sk-secret" not in repr(summarizer)
    assert summarizer.base_url == "https://api.openai.com/v1"


def test_openai_logs_once_where_it_sends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="episodic.summarizers")

    default = OpenAIChatSummarizer("gpt-4.1-mini", api_key="k")
    local = OpenAIChatSummarizer("llama", base_url="http://127.0.0.1:11434/v1/", api_key="k")

    assert default.base_url == OPENAI_BASE_URL == "https://api.openai.com/v1"
    assert local.base_url == "http://127.0.0.1:11434/v1"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("episodic.summarizers")]
    assert len(lines) == 2, lines  # one line per summarizer, at creation
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert "https://api.openai.com/v1" in lines[0]
    assert "model gpt-4.1-mini" in lines[0]
    assert "default" in lines[0]
    assert "http://127.0.0.1:11434/v1" in lines[1]
    assert "model llama" in lines[1]


def test_openai_never_logs_a_password_or_query_in_the_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episodic.summarizers")
    url = "https://user:hunter2@gateway.example/v1?key=sk-query"

    summarizer = OpenAIChatSummarizer("m", base_url=url, api_key="k")

    assert summarizer.base_url == url  # requests still go there
    shown = [summarizer.endpoint, repr(summarizer), *(r.getMessage() for r in caplog.records)]
    assert not [text for text in shown if "hunter2" in text or "sk-query" in text], shown
    assert summarizer.endpoint == "https://user:***@gateway.example/v1?*** (model m)"


async def test_openai_with_a_client_reports_the_clients_url(server: FakeOpenAIServer) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="k", base_url=server.base_url, max_retries=5)
    server.add(Reply(401, error_body("bad key")))

    summarizer = OpenAIChatSummarizer("m", client=client)
    with pytest.raises(SummarizerError) as caught:
        await summarizer.summarize(_request())

    assert summarizer.base_url == server.base_url
    assert str(caught.value).startswith(f"openai-chat:m at {server.base_url} (model m): HTTP 401")
    await client.close()


def test_settings_without_a_model_say_which_url_would_be_used() -> None:
    settings = EpisodicSettings(
        _env_file=None, summarizer="openai", summarizer_model=None, summarizer_base_url=None
    )

    with pytest.raises(ConfigurationError) as caught:
        summarizer_from_settings(settings)

    message = str(caught.value)
    assert "EPISODIC_SUMMARIZER_MODEL" in message
    assert "EPISODIC_SUMMARIZER_BASE_URL is unset" in message
    assert OPENAI_BASE_URL in message

    custom = settings.model_copy(update={"summarizer_base_url": "http://127.0.0.1:8000/v1"})
    with pytest.raises(ConfigurationError, match=r"EPISODIC_SUMMARIZER_BASE_URL is http://127"):
        summarizer_from_settings(custom)


def test_settings_with_a_model_build_the_summarizer_for_that_url() -> None:
    settings = EpisodicSettings(
        _env_file=None,
        summarizer="openai",
        summarizer_model="cheap",
        summarizer_base_url="http://127.0.0.1:8000/v1",
    )

    summarizer = summarizer_from_settings(settings)

    assert isinstance(summarizer, OpenAIChatSummarizer)
    assert (summarizer.base_url, summarizer.model) == ("http://127.0.0.1:8000/v1", "cheap")


# ---- AgentSummarizer --------------------------------------------------------------------


class FakeAgent:
    """The agent-core shape: an async ``chat(prompt)``; replies or raises from a script."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.prompts: list[str] = []

    async def chat(self, prompt: str, /) -> Any:
        self.prompts.append(prompt)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _reply(content: object, **fields: object) -> SimpleNamespace:
    return SimpleNamespace(message=SimpleNamespace(content=content), **fields)


async def test_agent_reply_text_usage_total_and_model() -> None:
    usage = SimpleNamespace(input_tokens=900, output_tokens=70, cache_read_input_tokens=100)
    agent = FakeAgent(_reply("the handoff", usage_total=usage, model="cheap-1"))

    result = await AgentSummarizer(agent, name="cheap").summarize(_request())

    assert agent.prompts == [PROMPT]
    assert result == SummaryResult(
        text="the handoff",
        usage=Usage(input_tokens=900, output_tokens=70, cache_read_tokens=100),
        model="cheap-1",
    )


@pytest.mark.parametrize(
    ("reply", "usage"),
    [
        (_reply("s"), None),
        (_reply("s", usage=None), None),
        (_reply("s", usage={"input_tokens": 3, "output_tokens": 4}), Usage(input_tokens=3,
                                                                           output_tokens=4)),
        (_reply("s", usage=SimpleNamespace(input_tokens="many")), None),
    ],
)  # fmt: skip
async def test_agent_usage_is_optional_and_never_fails_a_summary(
    reply: object, usage: Usage | None
) -> None:
    result = await AgentSummarizer(FakeAgent(reply)).summarize(_request())

    assert result.text == "s"
    assert result.usage == usage
    assert result.model is None


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ([{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
         "a\nb"),
        (None, ""),
        ("", ""),
    ],
)  # fmt: skip
async def test_agent_content_shapes(content: object, text: str) -> None:
    result = await AgentSummarizer(FakeAgent(_reply(content))).summarize(_request())

    assert result.text == text


class RateLimited(Exception):
    status_code = 429


@pytest.mark.parametrize(
    ("raised", "retryable"),
    [
        (ConnectionResetError("reset"), True),
        (TimeoutError(), True),
        (RateLimited("slow down"), True),
        (ValueError("no llm binding"), False),
    ],
)
async def test_agent_errors_become_summarizer_errors(raised: Exception, retryable: bool) -> None:
    summarizer = AgentSummarizer(FakeAgent(raised), name="cheap")

    with pytest.raises(SummarizerError) as caught:
        await summarizer.summarize(_request())

    assert caught.value.retryable is retryable
    assert caught.value.__cause__ is raised
    assert str(caught.value).startswith("cheap: ")


@pytest.mark.parametrize(
    "reply",
    [SimpleNamespace(usage=None), _reply("Reached maximum iterations without a final answer.")],
)
async def test_agent_reply_that_is_no_summary_is_an_error(reply: object) -> None:
    with pytest.raises(SummarizerError):
        await AgentSummarizer(FakeAgent(reply)).summarize(_request())


async def test_a_real_agent_core_summarizes_through_the_fake_server(
    server: FakeOpenAIServer,
) -> None:
    pytest.importorskip("cliver_core")
    from cliver_core import AgentCore, ModelBinding, ModelBindings

    server.add(chat_completion("handoff from the agent", prompt_tokens=50, completion_tokens=7))
    binding = ModelBinding.llm(model="cheap-model", api_key="sk-agent", base_url=server.base_url)
    agent = AgentCore(ModelBindings(llm=binding))

    result = await AgentSummarizer(agent, name="cliver").summarize(_request())

    assert result.text == "handoff from the agent"
    assert result.usage == Usage(input_tokens=50, output_tokens=7)
    assert result.model == "cheap-model"
    [received] = server.requests
    assert received.headers["authorization"] == "Bearer sk-agent"
    assert received.json["messages"][-1] == {"role": "user", "content": PROMPT}


# ---- ExtractiveSummarizer ---------------------------------------------------------------

SESSION = [
    Message.user("Fix the failing test in tests/test_io.py\nIt started after the refactor."),
    Message.assistant(
        "Running the tests first.",
        tool_calls=[ToolCall(id="c1", name="run", args={"cmd": "pytest -x"})],
    ),
    Message.tool_result("c1", "1 failed\nAssertionError: fixture path", name="run", is_error=True),
    Message.assistant(
        None,
        tool_calls=[ToolCall(id="c2", name="read_file", args={"path": "tests/conftest.py"})],
        reasoning="The fixture path probably points at the old package.",
    ),
    Message.tool_result("c2", "FIXTURES = 'old/fixtures'", name="read_file"),
    Message.assistant(
        "The fixture path still names the old package; fixed it in tests/conftest.py.",
        tool_calls=[ToolCall(id="c3", name="run", args={"cmd": "pytest -x"})],
    ),
    Message.tool_result("c3", "12 passed", name="run"),
    Message.user("Also add a regression test for the fixture path."),
    Message.assistant(
        "Added tests/test_fixtures.py::test_fixture_path; the suite passes.",
        reasoning="SECRET-REASONING must not reach the handoff.",
    ),
]


def _prepared(messages: Sequence[Message], **limits: int) -> CompactionRequest:
    config = CompactionConfig().with_limits(
        auto_compact_token_limit=10, recent_user_token_budget=0, **limits
    )
    prepared = prepare_compaction(messages, config, CHARS)
    assert prepared is not None
    return prepared.request


async def test_extractive_handoff_of_a_realistic_session() -> None:
    result = await ExtractiveSummarizer().summarize(_prepared(SESSION))

    assert result.usage is None
    assert result.model == "extractive"
    text = result.text
    assert "Current request: Also add a regression test for the fixture path." in text
    assert "Earlier requests:\n- Fix the failing test in tests/test_io.py\n" in text
    assert "It started after the refactor" not in text  # first lines only
    assert "Tool activity: run x2 (errors: 1), read_file x1" in text
    assert "Last tool error (run): 1 failed | AssertionError: fixture path" in text
    assert "Last assistant reply: Added tests/test_fixtures.py::test_fixture_path" in text
    assert "Summarized: 9 messages (2 user, 4 assistant, 3 tool results)." in text
    assert "SECRET-REASONING" not in text
    assert "fixture path probably" not in text
    assert "Write a handoff note" not in text  # the instructions are not a message


async def test_extractive_does_not_repeat_the_requests_the_boundary_keeps_verbatim() -> None:
    config = CompactionConfig().with_limits(auto_compact_token_limit=10)
    prepared = prepare_compaction(SESSION, config, CHARS)
    assert prepared is not None
    assert "Also add a regression test for the fixture path." in prepared.request.retained
    text = (await ExtractiveSummarizer().summarize(prepared.request)).text
    assert "fixture path." not in text.split("Last assistant reply")[0]
    assert "Current request" not in text
    assert "Earlier requests" not in text


async def test_extractive_is_deterministic() -> None:
    request = _prepared(SESSION)

    first = await ExtractiveSummarizer().summarize(request)
    second = await ExtractiveSummarizer().summarize(request.model_copy())

    assert first == second


async def test_extractive_respects_max_chars() -> None:
    long_session = [
        *(Message.user(f"request {i}: " + "word " * 400) for i in range(20)),
        Message.assistant("reply " * 2_000),
    ]
    request = _prepared(long_session)

    for max_chars in (200, 500, 4_000):
        text = (await ExtractiveSummarizer(max_chars).summarize(request)).text
        assert len(text) <= max_chars
        assert "Current request: request 19:" in text
    text = (await ExtractiveSummarizer(4_000).summarize(request)).text
    assert "older not shown)" in text


async def test_extractive_carries_an_earlier_handoff_and_omitted_count() -> None:
    prepared = prepare_compaction(
        SESSION, CompactionConfig().with_limits(auto_compact_token_limit=10), CHARS
    )
    assert prepared is not None
    first = (await ExtractiveSummarizer().summarize(prepared.request)).text
    handoff = finalize_compaction(prepared.plan, first)
    later = [
        *handoff.messages,
        Message.user("Now open a pull request."),
        Message.assistant("Opened PR 42."),
    ]
    request = _prepared([Message.user("ancient " * 500), *later], compact_request_token_limit=1_000)

    text = (await ExtractiveSummarizer().summarize(request)).text

    assert request.omitted_messages == 1
    assert "Current request: Now open a pull request." in text
    assert "Earlier handoff: Extractive handoff" in text
    assert DEFAULT_SUMMARY_PREFIX not in text.split("Earlier handoff:")[0]
    assert "1 older messages were not in the request" in text


async def test_extractive_without_a_transcript_is_empty() -> None:
    result = await ExtractiveSummarizer().summarize(_request("no transcript here"))

    assert result.text == ""


def test_extractive_refuses_a_tiny_budget() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        ExtractiveSummarizer(50)


def test_transcript_blocks_round_trip_the_rendering() -> None:
    parsed = parse_transcript(_prepared(SESSION).prompt)

    assert [block.kind for block in parsed.blocks] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "user",
        "assistant",
    ]  # fmt: skip
    tool = parsed.blocks[2]
    assert (tool.tool_name, tool.error, tool.text) == (
        "run",
        True,
        "1 failed\nAssertionError: fixture path",
    )
    assert parsed.blocks[3].text == ""
    assert parsed.blocks[3].tool_calls.startswith("read_file(")
    assert parsed.omitted_messages == 0


def test_every_adapter_is_a_summarizer() -> None:
    adapters: list[Summarizer] = [
        ExtractiveSummarizer(),
        AgentSummarizer(FakeAgent()),
        OpenAIChatSummarizer("m", api_key="k"),
    ]

    assert [adapter.name for adapter in adapters] == ["extractive", "agent", "openai-chat:m"]
