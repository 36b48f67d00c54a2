"""cliver-core's ``CLIverMessage`` objects, from :class:`~episodic.models.Message`.

Needs the ``episodic-store[cliver]`` extra; cliver-core is imported only when a conversion runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING
from uuid import UUID

from episodic.errors import ConfigurationError
from episodic.formats.openai_chat import message_to_openai
from episodic.models import Message

if TYPE_CHECKING:
    from cliver_core import CLIverMessage


def messages_to_cliver(conversation_id: UUID, messages: Iterable[Message]) -> list[CLIverMessage]:
    """What :meth:`Context.to_cliver <episodic.context.Context.to_cliver>` returns: one
    ``CLIverMessage`` per message, its id ``<conversation>:<seq>`` (or
    ``<conversation>:synthetic:<index>`` for a message the store did not write)."""
    try:
        from cliver_core import CLIverMessage
        from cliver_core.messages import ToolCall as CLIverToolCall
    except ImportError as exc:
        raise ConfigurationError(
            "Context.to_cliver() needs cliver-core: pip install 'episodic-store[cliver]'"
        ) from exc
    out: list[CLIverMessage] = []
    for message in messages:
        wire = message_to_openai(message)
        calls = [
            CLIverToolCall(id=c.id, name=c.name, args=dict(c.args)) for c in message.tool_calls
        ]
        out.append(
            CLIverMessage(
                id=f"{conversation_id}:{message.seq}"
                if message.seq is not None
                else f"{conversation_id}:synthetic:{len(out)}",
                role=message.role,
                content=wire["content"],
                tool_calls=calls or None,
                tool_call_id=message.tool_call_id,
                # The exact chat-completions form, so an OpenAI-protocol provider sends
                # what the model produced (argument text included) byte for byte.
                native=wire,
                native_protocol="openai",
            )
        )
    return out


__all__ = ["messages_to_cliver"]
