"""What the next model call sees: the handoff, the retained user messages, and the tail.

Pure: ``compose_context`` turns the latest boundary and the events after its cut into a
history a provider accepts. Every tool call is followed by all its results before the next
non-tool message (results that arrived after an interruption are moved up to their call),
and a call that never got a result gets a synthetic error result, so a lost result or an
abandoned run can never make the next request fail with a 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast
from uuid import UUID

from pydantic import ConfigDict

from episodic.compaction import truncate_to_token_budget
from episodic.formats.anthropic import messages_to_anthropic
from episodic.formats.cliver import messages_to_cliver
from episodic.formats.openai_chat import messages_to_openai
from episodic.formats.responses import messages_to_responses
from episodic.models import (
    BoundaryEvent,
    EpisodicModel,
    Message,
    MessageEvent,
    StoredEvent,
    construct_valid,
    plain_defaults,
)
from episodic.rendering import context_token_estimate
from episodic.tokens import TokenEstimator
from episodic.view import in_view

if TYPE_CHECKING:
    from cliver_core import CLIverMessage

MISSING_RESULT_TEXT = (
    "No result was recorded for this tool call: the run ended or was interrupted before the "
    "tool answered. Treat the call as failed."
)
TOOL_RESULT_CUT_MARKER_NOTE = "[tool output cut when loading; the full text is in the log]"


def missing_result(call_id: str, name: str | None) -> Message:
    """The synthetic error result that pairs a call with no recorded result."""
    return Message.tool_result(call_id, MISSING_RESULT_TEXT, name=name, is_error=True)


class Context(EpisodicModel):
    """A conversation's context, ready for an agent loop.

    ``messages`` are the handoff (a user message) and the retained user messages when there is
    a boundary (or the items of a framework's own compaction, :attr:`BoundaryEvent.handoff_items`),
    then every message after its cut; never a system message. Stored messages
    carry ``seq``, ``created_at`` and ``token_estimate``; synthetic ones have ``seq=None``.
    """

    model_config = ConfigDict(frozen=True)

    conversation_id: UUID
    messages: tuple[Message, ...]
    boundary: BoundaryEvent | None
    estimated_tokens: int
    last_seq: int
    #: The seq of the conversation's latest boundary, the one a new boundary must expect:
    #: ``boundary.seq``, or, once a clear has put that boundary out of view, still its seq.
    boundary_seq: int | None = None

    def to_openai(self, *, include_reasoning: bool = False) -> list[dict[str, Any]]:
        """Chat-completions message dicts (prepend your system message)."""
        return messages_to_openai(self.messages, include_reasoning=include_reasoning)

    def to_responses(self) -> list[dict[str, Any]]:
        """OpenAI Responses-API input items for ``responses.create(input=...)`` (send your
        system prompt as ``instructions``). Items read with ``Message.from_responses_item``
        are given back as they came, except that assistant messages and function calls go
        without the ids of the reasoning output a context does not hold."""
        return messages_to_responses(self.messages)

    def to_anthropic(self) -> list[dict[str, Any]]:
        """The Anthropic Messages API's ``messages`` (send your system prompt as ``system``):
        roles alternate, each tool call's results open the user turn right after it."""
        return messages_to_anthropic(self.messages)

    def to_cliver(self) -> list[CLIverMessage]:
        """``cliver_core.CLIverMessage`` objects for ``AgentCore.chat(conversation=...)``.
        Needs the ``episodic-store[cliver]`` extra."""
        return messages_to_cliver(self.conversation_id, self.messages)


#: A user message's fields at their defaults (metadata is made per message).
_USER_MESSAGE = plain_defaults(Message) | {"role": "user"}


def _boundary_user(text: str, seq: int | None, created_at: Any, token_estimate: int) -> Message:
    """A user message of a boundary's text, built without a second validation: the boundary
    was written only after ``Message.user`` accepted the very same texts (their estimates are
    made from them), and every load behind a boundary builds these (~15 µs each validated)."""
    values = {
        **_USER_MESSAGE,
        "content": text,
        "metadata": {},
        "seq": seq,
        "created_at": created_at,
        "token_estimate": token_estimate,
    }
    return construct_valid(Message, values)


def boundary_messages(boundary: BoundaryEvent) -> list[Message]:
    """The handoff and the retained user messages a boundary contributes (or, for a
    framework's own compaction, its items)."""
    if boundary.handoff_items is not None:
        estimates = boundary.handoff_token_estimates
        if len(estimates) != len(boundary.handoff_items):
            estimates = (0,) * len(boundary.handoff_items)
        return [
            Message.from_responses_item(item).model_copy(update={"token_estimate": tokens})
            for item, tokens in zip(boundary.handoff_items, estimates, strict=True)
        ]
    retained_tokens = boundary.retained_token_estimates
    if len(retained_tokens) != len(boundary.retained):
        retained_tokens = (0,) * len(boundary.retained)
    first = _boundary_user(
        boundary.summary,
        boundary.seq,
        boundary.created_at,
        boundary.token_estimate - sum(retained_tokens),
    )
    retained = [
        _boundary_user(text, None, None, tokens)
        for text, tokens in zip(boundary.retained, retained_tokens, strict=True)
    ]
    return [first, *retained]


class CallLike(Protocol):
    """What pairing reads of a tool call."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...


class Composable(Protocol):
    """What composing a context reads of a message: a :class:`Message`, or a stored one
    that has no model yet (``episodic.store.codec.StoredMessage``)."""

    @property
    def role(self) -> str: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def tool_calls(self) -> Sequence[CallLike]: ...
    @property
    def text(self) -> str: ...
    @property
    def token_estimate(self) -> int | None: ...


M = TypeVar("M", bound=Composable)


def compose_context(
    conversation_id: UUID,
    *,
    boundary: BoundaryEvent | None,
    tail: Sequence[Message],
    last_seq: int,
    estimator: TokenEstimator,
    max_tool_result_tokens: int | None = None,
    boundary_seq: int | None = None,
) -> Context:
    """Build the context from the latest boundary (or none) and the stored messages after its
    cut, in seq order (:func:`tail_messages` picks them from events). ``boundary_seq`` is the
    head's latest boundary when a clear took ``boundary`` out of view."""
    messages, estimated = compose_messages(
        boundary, tail, estimator, max_tool_result_tokens=max_tool_result_tokens
    )
    # Every part is a valid, frozen model already: no need to validate them again.
    return construct_valid(
        Context,
        {
            "conversation_id": conversation_id,
            "messages": tuple(messages),
            "boundary": boundary,
            "estimated_tokens": estimated,
            "last_seq": last_seq,
            "boundary_seq": boundary_seq
            if boundary_seq is not None
            else (boundary.seq if boundary is not None else None),
        },
    )


def compose_messages(
    boundary: BoundaryEvent | None,
    tail: Sequence[M],
    estimator: TokenEstimator,
    *,
    max_tool_result_tokens: int | None = None,
) -> tuple[list[M | Message], int]:
    """:func:`compose_context`'s messages and their estimated tokens, from a tail of models
    or of stored messages: the boundary's messages and any synthetic results are models.
    Tool results are cut to ``max_tool_result_tokens`` only when they are models."""
    messages: list[M | Message] = []
    if boundary is not None:
        messages.extend(boundary_messages(boundary))
    # The boundary's stored estimate covers its handoff and retained messages together.
    estimated = boundary.token_estimate if boundary is not None else 0
    body: Sequence[M | Message] = tail
    counted = set[int]()
    if boundary is not None and boundary.handoff_items is not None:
        # A framework's items may hold a call whose result never came: pair them with the
        # tail like any messages (their estimates are in the boundary's already).
        body, counted, messages = [*messages, *tail], {id(m) for m in messages}, []
    for message in _paired(body):
        if id(message) in counted:
            messages.append(message)
            continue
        if (
            max_tool_result_tokens is not None
            and message.role == "tool"
            and isinstance(message, Message)
        ):
            message = _capped(message, max_tool_result_tokens, estimator)
        tokens = message.token_estimate
        if tokens is None:
            # a synthetic result, or a model never stored: a stored message has its estimate
            assert isinstance(message, Message)
            tokens = context_token_estimate(message, estimator)
            message = message.model_copy(update={"token_estimate": tokens})
        estimated += tokens
        messages.append(message)
    return messages, estimated


def tail_messages(events: Sequence[StoredEvent]) -> list[Message]:
    """The messages in view among ``events``, in order."""
    return [event.message for event in in_view(events) if isinstance(event, MessageEvent)]


def _paired(tail: Sequence[M]) -> list[M | Message]:
    """Tail messages in order, each call group followed by all its results. One pass: each
    call gets a slot right after its group, filled by the result that answers that call
    occurrence (ids may be reused once answered), or at the end by a synthetic error result."""
    out: list[M | Message | None] = []
    slots: list[tuple[int, CallLike]] = []
    waiting: dict[str, int] = {}  # call id -> its slot in out
    for message in tail:
        role = message.role
        if role == "tool":
            slot = waiting.pop(message.tool_call_id or "", None)
            if slot is not None:
                out[slot] = message
            # A result whose call is not in the tail cannot be placed; the safe cut rule
            # means it does not happen, and a provider would refuse it, so it is left out.
            continue
        calls = message.tool_calls
        if role == "system" or (role == "assistant" and not calls and _is_empty(message)):
            continue
        out.append(message)
        for call in calls:
            waiting[call.id] = len(out)
            slots.append((len(out), call))
            out.append(None)
    for slot, call in slots:
        if out[slot] is None:
            out[slot] = missing_result(call.id, call.name)
    return cast("list[M | Message]", out)


def _is_empty(message: Composable) -> bool:
    """No text: an assistant turn with no calls either (a reasoning-only or aborted turn) is
    kept by the log, but chat-completions refuses an assistant message with neither."""
    return not message.text.strip()


def _capped(message: Message, max_tokens: int, estimator: TokenEstimator) -> Message:
    if (message.token_estimate or 0) <= max_tokens:
        return message
    text = message.text
    if estimator.count(text) <= max_tokens:
        return message
    cut = truncate_to_token_budget(text, max_tokens, estimator)
    capped = message.model_copy(update={"content": f"{cut}\n{TOOL_RESULT_CUT_MARKER_NOTE}"})
    return capped.model_copy(update={"token_estimate": context_token_estimate(capped, estimator)})


__all__ = [
    "MISSING_RESULT_TEXT",
    "Composable",
    "Context",
    "boundary_messages",
    "compose_context",
    "compose_messages",
    "missing_result",
    "tail_messages",
]
