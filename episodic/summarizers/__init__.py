"""Summarizers for the compaction worker: the :class:`Summarizer` protocol and its adapters.

- :class:`OpenAIChatSummarizer`: any OpenAI-compatible chat-completions endpoint (needs the
  ``episodic-store[openai]`` extra; the ``openai`` package is imported only when one is created).
- :class:`AgentSummarizer`: any agent with an async ``chat(prompt)`` (the agent-core shape).
- :class:`ExtractiveSummarizer`: offline and deterministic, for the demo and tests.

Each makes one attempt per call and raises :class:`SummarizerError` (with ``retryable``) on
failure; retries, backoff and timeouts around the call belong to the worker.
"""

from episodic.summarizers.agent import AgentSummarizer
from episodic.summarizers.base import (
    Summarizer,
    SummarizerError,
    SummaryResult,
    is_retryable_status,
)
from episodic.summarizers.classify import summarizer_error
from episodic.summarizers.extractive import ExtractiveSummarizer, extractive_handoff
from episodic.summarizers.openai_chat import OpenAIChatSummarizer, usage_from_openai
from episodic.summarizers.transcript import ParsedTranscript, TranscriptBlock, parse_transcript

__all__ = [
    "AgentSummarizer",
    "ExtractiveSummarizer",
    "OpenAIChatSummarizer",
    "ParsedTranscript",
    "Summarizer",
    "SummarizerError",
    "SummaryResult",
    "TranscriptBlock",
    "extractive_handoff",
    "is_retryable_status",
    "parse_transcript",
    "summarizer_error",
    "usage_from_openai",
]
