"""What every compactor in the benchmark is driven through, and the budget they share.

A compactor holds one session: the benchmark adds each phase's messages, asks for a
compaction after every phase from the second on, and reads back the context the next model
call would see. Each adapter runs the compactor's own code (a peer's class, episodic's
worker) and converts only at the edges, to and from episodic's :class:`~episodic.Message`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from episodic import Message
from episodic.errors import ConfigurationError
from episodic.tokens import CharHeuristic, TiktokenEstimator, TokenEstimator


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible chat-completions server and the model name it answers to."""

    base_url: str
    model: str
    api_key: str = "no-key"

    def client(self, timeout: float) -> Any:
        """An ``openai.AsyncOpenAI`` for this endpoint, without the SDK's own retries (a
        failed call is a finding here, not something to hide)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=timeout, max_retries=0
        )


DEFAULT_HANDOFF_TOKENS = 160
DEFAULT_KEEP_TOKENS = 160


@dataclass(frozen=True, slots=True)
class Budget:
    """What every compactor gets, so they compare: the most tokens a handoff may be (sent as
    the call's output limit), and the recent material kept word for word beside it (each
    compactor in its own unit, as close to ``keep_tokens`` as it allows)."""

    handoff_tokens: int = DEFAULT_HANDOFF_TOKENS
    keep_tokens: int = DEFAULT_KEEP_TOKENS
    timeout: float = 900.0


class Compactor(ABC):
    """One session's history under one compactor."""

    #: as the report names it
    name: ClassVar[str]
    #: what it is, for the report (the peer's class, the package and version)
    describes: ClassVar[str]
    #: whether it calls the model (the baselines do not)
    needs_model: ClassVar[bool] = True
    #: the modules it imports when it runs, and what ``pip install`` brings each
    requires: ClassVar[dict[str, str]] = {}

    def __init__(self, endpoint: Endpoint | None, budget: Budget) -> None:
        self.endpoint = endpoint
        self.budget = budget

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this compactor cannot run here (a required module missing), or None."""
        import importlib.util

        for module, package in cls.requires.items():
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install '{package}')"
        return None

    async def open(self) -> None:
        """Start the session (a conversation, a store); nothing by default."""
        return None

    async def close(self) -> None:
        """Release what :meth:`open` took; nothing by default."""
        return None

    @abstractmethod
    async def add(self, messages: Sequence[Message]) -> None:
        """Append a phase's messages, as the agent would."""

    @abstractmethod
    async def compact(self) -> None:
        """Compact the history now (a compaction of everything not kept verbatim)."""

    @abstractmethod
    async def context(self) -> list[Message]:
        """What the next model call would see of the history."""

    async def search(self, query: str, limit: int) -> list[str] | None:
        """The texts of the ``limit`` events of the history that best match ``query``, best
        first; None for a compactor that keeps no searchable history (the peers)."""
        return None

    def endpoint_or_fail(self) -> Endpoint:
        if self.endpoint is None:
            raise RuntimeError(f"{self.name} calls a model: give it an endpoint")
        return self.endpoint


def package_version(package: str) -> str:
    """An installed distribution's version, for the report ("not installed" when absent)."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def count_tokens(messages: Sequence[Message]) -> int:
    """The messages' size in tokens (cl100k, as rendered for the model), for budgets and the
    report alike."""
    from bench.handoff.scoring import render

    return _estimator().count(render(messages))


def _estimator() -> TokenEstimator:
    global _ESTIMATOR
    if _ESTIMATOR is None:
        try:
            _ESTIMATOR = TiktokenEstimator()
        except ConfigurationError:
            _ESTIMATOR = CharHeuristic()
    return _ESTIMATOR


_ESTIMATOR: TokenEstimator | None = None


def keep_from(messages: Sequence[Message], keep_tokens: int) -> int:
    """Where the newest messages worth ``keep_tokens`` begin (the newest message always),
    moved forward past tool results whose call would be cut, so none is kept without its
    call and the budget holds (moving back to the call could double it: a test run's
    output is often the biggest message there is)."""
    total = 0
    start = len(messages)
    for index in range(len(messages) - 1, -1, -1):
        total += count_tokens(messages[index : index + 1])
        if total > keep_tokens and start < len(messages):
            break
        start = index
    while start < len(messages) - 1 and messages[start].role == "tool":
        start += 1
    return start
