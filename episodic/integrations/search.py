"""A tool that lets an agent search its own conversation: recall of what a compaction
summarized away, since the log keeps every event.

:class:`ConversationSearch` is a plain async callable for any loop, with the tool definition
the chat APIs take. ``EpisodicSession.search_tool()`` (OpenAI Agents SDK) and
``EpisodicSessionService.search_tool()`` (Google ADK) wrap it in those frameworks' own tool
classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from episodic.errors import NotFoundError, ValidationError
from episodic.search import check_search_limit, render_hits
from episodic.store import EpisodicStore

#: The tool's name, as the model calls it.
SEARCH_TOOL_NAME = "search_conversation"
#: What the model is told the tool does.
SEARCH_TOOL_DESCRIPTION = (
    "Search this conversation's earlier messages, tool outputs included, for a few words: an "
    "error code, a file name, a command, a decision. Earlier work is summarized; use this "
    "for an exact detail the summary left out. Returns the best matching messages with "
    "their seq numbers."
)
#: How many messages one call returns, unless asked otherwise.
DEFAULT_TOOL_HITS = 5
QUERY_DESCRIPTION = "a few distinctive words to look for"


@dataclass(frozen=True)
class ConversationSearch:
    """``await search("E2147")``: the messages of one conversation that match, as text for a
    model. Register :meth:`to_openai` (or :meth:`parameters` under your framework's own tool
    type) and call this with the model's ``query`` argument."""

    store: EpisodicStore
    conversation_id: UUID
    limit: int = DEFAULT_TOOL_HITS
    name: str = SEARCH_TOOL_NAME
    description: str = SEARCH_TOOL_DESCRIPTION

    def __post_init__(self) -> None:
        if not isinstance(self.store, EpisodicStore):
            raise ValidationError("ConversationSearch takes an episodic.EpisodicStore")
        check_search_limit(self.limit)

    async def __call__(self, query: str) -> str:
        """The matches, best first, or why there are none. A query the store refuses (blank,
        too long) is answered with the reason: the model wrote it and can write another."""
        try:
            hits = await self.store.search(self.conversation_id, query, limit=self.limit)
        except ValidationError as exc:
            return f"Search refused: {exc}"
        except NotFoundError:
            hits = []  # nothing written yet: nothing to find
        return render_hits(hits, query)

    def parameters(self) -> dict[str, Any]:
        """The tool's arguments, as JSON Schema."""
        return {
            "type": "object",
            "properties": {"query": {"type": "string", "description": QUERY_DESCRIPTION}},
            "required": ["query"],
            "additionalProperties": False,
        }

    def to_openai(self) -> dict[str, Any]:
        """The tool as Chat Completions' ``tools`` takes it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters(),
            },
        }
