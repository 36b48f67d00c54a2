"""A summarizer backed by an agent object: anything with an async ``chat(prompt)`` whose
reply has ``.message.content`` and a usage (the agent-core shape; typically a second
``cliver_core.AgentCore`` bound to a cheaper model, with no tools)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from episodic.compaction import CompactionRequest
from episodic.loop import ChatSummarizer, coerce_usage
from episodic.models import Usage
from episodic.summarizers.base import SummarizerError, SummaryResult
from episodic.summarizers.classify import summarizer_error

logger = logging.getLogger(__name__)

#: Replies an agent core writes itself when its loop gives up (cliver-core 0.3's texts). They
#: are error texts, not summaries, and must never become a handoff.
AGENT_GIVE_UP_REPLIES = (
    "Reached maximum iterations without a final answer.",
    "Tool calls failed repeatedly.",
)


class AgentSummarizer:
    """Asks ``agent.chat(request.prompt)`` for the handoff.

    The text is ``response.message.content`` (text blocks joined when it is a list; a plain
    string reply is taken as is). Usage is read from ``usage_total`` (a run's total, when the
    agent reports one) or else ``usage``, through :func:`episodic.loop.coerce_usage`; missing
    or unreadable usage becomes ``None`` rather than failing a good summary. The model comes
    from ``response.model`` or the agent core's ``request_info["model"]``.

    Anything the agent raises becomes a :class:`SummarizerError` (see
    :mod:`episodic.summarizers.classify`); so does a reply with no message, or one of
    :data:`AGENT_GIVE_UP_REPLIES`.
    """

    def __init__(self, agent: ChatSummarizer, *, name: str = "agent") -> None:
        self.agent = agent
        self.name = name

    def __repr__(self) -> str:
        return f"AgentSummarizer(name={self.name!r}, agent={type(self.agent).__name__})"

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        """One ``chat`` call with the request prompt as the user input."""
        try:
            response = await self.agent.chat(request.prompt)
        except Exception as exc:
            raise summarizer_error(exc, summarizer=self.name) from exc
        text = self._text(response)
        return SummaryResult(text=text, usage=self._usage(response), model=_model(response))

    def _text(self, response: object) -> str:
        if isinstance(response, str):
            return response
        message = getattr(response, "message", None)
        if message is None:
            raise SummarizerError(
                f"{self.name}: the agent's reply ({type(response).__name__}) has no .message",
                summarizer=self.name,
                retryable=False,
            )
        text = content_text(getattr(message, "content", None))
        if text.strip().startswith(AGENT_GIVE_UP_REPLIES):
            raise SummarizerError(
                f"{self.name}: the agent gave up instead of summarizing: {text.strip()[:200]}",
                summarizer=self.name,
                retryable=True,
            )
        return text

    def _usage(self, response: object) -> Usage | None:
        raw = getattr(response, "usage_total", None)
        if raw is None:
            raw = getattr(response, "usage", None)
        try:
            return coerce_usage(raw)
        except (TypeError, ValueError) as exc:
            logger.warning("%s: ignoring an unreadable usage %r: %s", self.name, raw, exc)
            return None


def content_text(content: object) -> str:
    """A message content as text: a string as is; for a list of blocks, the ``text`` of each
    text block (dicts or objects) joined by newlines; anything else empty."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else getattr(block, "type", None)
        text = block.get("text") if isinstance(block, Mapping) else getattr(block, "text", None)
        if kind in (None, "text", "output_text") and isinstance(text, str):
            parts.append(text)
    return "\n".join(parts)


def _model(response: object) -> str | None:
    model = getattr(response, "model", None)
    if isinstance(model, str) and model:
        return model
    info = getattr(response, "request_info", None)
    if isinstance(info, Mapping):
        model = info.get("model")
        if isinstance(model, str) and model:
            return model
    return None


__all__ = ["AGENT_GIVE_UP_REPLIES", "AgentSummarizer", "content_text"]
