"""Pydantic AI's message history on an episodic conversation (``pydantic-ai-slim`` 2.68):
``agent.run(prompt, message_history=await history.load())``, then
``await history.save(result)``, with ``history = EpisodicHistory(session_id, store)``.

Each ``ModelRequest`` and ``ModelResponse`` becomes the log's messages, its JSON kept in
``native`` (:mod:`episodic.formats.pydantic_ai`), so ``load`` gives back the messages that
were saved, part for part: system prompts, instructions, thinking, usage, run ids. A tool
return must answer a stored call, as any tool result. ``load`` returns the compacted view:
after a worker's boundary, one request with the handoff and the retained user messages as
user prompts (the conversation's first system prompts ahead of them: Pydantic AI sends a
system prompt only when a history has none, so the view keeps the one the history began
with), then the messages after the cut, each tool call followed by its returns. A call that
never got a return is paired with an error return, except calls still waiting at the end of
the history (a run that ended on deferred tool calls): those are given back waiting, for
``deferred_tool_results``.

``save`` appends the run's ``new_messages()`` in one batch (two runs saved at once never
interleave), each message under a client id made from its content, so saving a run again, in
this process or another, writes nothing twice. A run that ended with nothing waiting is then
marked completed (:meth:`EpisodicStore.mark_run_completed`), which the worker's trigger and
cut rely on; one that waits for deferred tool results is not. The latest model call's usage
goes with the batch, for the pressure signal; the summary is the worker's, never on the
request.

:meth:`EpisodicHistory.capability` is for runs that grow long inside one request: before each
model call it appends what the run has settled so far (every call answered), so the worker
sees the pressure and nothing is lost if the process dies, and when the worker has written a
newer boundary meanwhile it gives the model the compacted view, then the rest of the run (the
worker's cut stays before a run it sees in progress, so the run goes on from its own prompt).
Two runs with it at once interleave in the log at those settled points, never inside a call
and its returns.

Any string is a session id: it names one conversation per tenant (a UUID derived from the
tenant and the id), created by the first write; loading a session never written returns
``[]``. A tenant-scoped store (``store.for_tenant``) scopes the session.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

import orjson
import pydantic
from pydantic_ai import AgentRunResult, RunContext, Tool
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_core import PydanticSerializationError

from episodic.context import MISSING_RESULT_TEXT
from episodic.errors import (
    IdempotencyMismatchError,
    NotFoundError,
    ValidationError,
)
from episodic.formats.pydantic_ai import (
    message_digest,
    messages_from_pydantic_ai,
    pydantic_ai_messages_of,
    system_prompt_parts,
)
from episodic.integrations.search import DEFAULT_TOOL_HITS, ConversationSearch
from episodic.integrations.sessions import create_session_conversation, named_conversation_id
from episodic.models import Message, MessageEvent, RunCompletedEvent, Usage
from episodic.store import DEFAULT_TENANT, EpisodicStore

#: The namespace of the conversation ids sessions map to (uuid5 of tenant and session id).
SESSION_NAMESPACE = uuid.UUID("9c4e2d71-3b6a-4f85-a0d2-7e1f5c8b3a96")
#: Events read from the start of the log to find the system prompt a compacted history
#: began with (a Pydantic AI conversation's first message holds it).
SYSTEM_PROMPT_SCAN = 16
#: Digests of saved messages a history remembers, so a run's later save skips what its
#: processor saved; past that, a save finds them through the store's refusals instead.
REMEMBERED_MESSAGES = 4_096
#: Runs the processor of one history keeps a record of (the oldest is forgotten first).
REMEMBERED_RUNS = 64

#: Pydantic AI's own adapter, but NaN and infinity written as themselves: JSON has neither,
#: and the log refuses them rather than store them as null, as Pydantic AI's JSON would.
_ADAPTER: pydantic.TypeAdapter[list[ModelMessage]] = pydantic.TypeAdapter(
    list[ModelMessage],
    config=pydantic.ConfigDict(
        defer_build=True,
        ser_json_bytes="base64",
        val_json_bytes="base64",
        ser_json_inf_nan="constants",
    ),
)


def session_conversation_id(session_id: str, tenant_id: str = DEFAULT_TENANT) -> UUID:
    """The conversation a session id names for a tenant: the same id, the same conversation,
    in every process."""
    return named_conversation_id(SESSION_NAMESPACE, session_id, tenant_id)


class EpisodicHistory:
    """A Pydantic AI message history on an episodic conversation (see the module's
    docstring). One object per session and request is the intended use; it is safe to share
    between concurrent runs of the session."""

    def __init__(self, session_id: str, store: EpisodicStore) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValidationError(
                f"session_id must be a non-empty string, not {session_id!r:.80}",
                field="session_id",
            )
        if not isinstance(store, EpisodicStore):
            raise ValidationError("EpisodicHistory takes an episodic.EpisodicStore", field="store")
        self.session_id = session_id
        self.store = store
        self.conversation_id = session_conversation_id(
            session_id, store.tenant_id or DEFAULT_TENANT
        )
        self._saved: OrderedDict[str, None] = OrderedDict()
        self._loaded: _Loaded | None = None
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    # ---- the history ----------------------------------------------------------------------

    async def load(self) -> list[ModelMessage]:
        """The compacted view as Pydantic AI messages, for ``message_history``: always
        starting with a request, no return without its call (see the module's docstring).
        ``[]`` for a session never written."""
        try:
            context, tail = await self.store.load_context_and_tail(self.conversation_id)
        except NotFoundError:
            self._loaded = _Loaded(boundary_seq=None, last=None)
            return []
        abandoned = {
            call
            for event in tail
            if isinstance(event, RunCompletedEvent)
            for call in event.abandoned_tool_call_ids
        }
        data = pydantic_ai_messages_of(_with_deferred_calls(list(context.messages), abandoned))
        if context.boundary is not None and data and not _has_system_prompt(data):
            data[0]["parts"][:0] = await self._first_system_prompt()
        history = _validated(data)
        self._loaded = _Loaded(
            boundary_seq=context.boundary_seq, last=history[-1] if history else None
        )
        return history

    async def save(self, result: AgentRunResult[Any]) -> list[MessageEvent]:
        """Append the run's new messages that are not in the log yet, in one batch, and mark
        the run completed unless it ends waiting for deferred tool results. Saving a run
        again writes nothing: it returns ``[]`` from this history, and from another the
        messages the first save stored."""
        new_messages = getattr(result, "new_messages", None)
        if not callable(new_messages):
            raise ValidationError(
                "save takes what agent.run returned (an AgentRunResult), not "
                f"{type(result).__name__}; to append messages, use append",
                field="result",
            )
        data = _dumped(new_messages())
        before = await self._last_seq()
        stored = await self._append(data)
        if stored and not _waiting_calls(data):
            # A fresh write lands after all the log held when this save began; a replay gives
            # back what an earlier save stored, which marked the run unless it died first.
            # (Asking only whether a completion follows the batch misses a run whose batch a
            # concurrent save's completion happens to follow.)
            fresh = stored[0].seq > before
            if fresh or not await self._completed_after(stored[-1]):
                await self.store.mark_run_completed(self.conversation_id)
        return stored

    async def append(self, messages: Sequence[ModelMessage]) -> list[MessageEvent]:
        """Append Pydantic AI messages, in order, in one batch (the conversation is created
        by the first write), less those already in the log: a message appended twice is
        stored once. Returns the stored messages."""
        return await self._append(_dumped(messages))

    # ---- long runs ------------------------------------------------------------------------

    def capability(self) -> ProcessHistory[Any]:
        """A ``ProcessHistory`` capability for ``agent.run(..., capabilities=[...])`` (or the
        agent's own), running :meth:`process_history` before each model call."""
        return ProcessHistory(self.process_history)

    async def process_history(
        self, ctx: RunContext[Any], messages: list[ModelMessage]
    ) -> list[ModelMessage]:
        """A history processor: append the run's messages settled so far (its pending
        request, and a response still waiting for its returns, stay for later), then, when a
        boundary newer than the one the history was loaded behind has been written, return
        the compacted view followed by the rest of the run; else ``messages`` as they are."""
        run_id = ctx.run_id
        if run_id is None:
            return messages
        pending = 1 if messages and isinstance(messages[-1], ModelRequest) else 0
        own = [
            message
            for message in messages[: len(messages) - pending]
            if message.run_id == run_id and not self._resumed(message)
        ]
        settled = _settled(own)
        run = self._run(run_id)
        unsaved = [m for m in settled if id(m) not in run.saved]
        if unsaved:
            await self._append(_dumped(unsaved))
        run.saved.update((id(m), m) for m in unsaved)
        try:
            head = await self.store.get_conversation(self.conversation_id)
        except NotFoundError:
            return messages
        if run.boundary_seq is _UNKNOWN:
            # The history did not come from load(): the boundary it is behind is not known,
            # so the one there now is taken as its own.
            run.boundary_seq = head.boundary_seq
            return messages
        if head.boundary_seq == run.boundary_seq:
            return messages
        context = await self.store.load_context(self.conversation_id)
        run.boundary_seq = context.boundary_seq
        view = _validated(pydantic_ai_messages_of(context.messages))
        if not view:
            return messages
        # The view holds what the log holds: never append its messages again.
        for item in _dumped(view):
            self._remember(message_digest(item))
        run.saved.update((id(m), m) for m in view)
        # What the log does not hold yet: the run's messages after its settled ones (they
        # end the list: a view only ever comes before them), and the pending request.
        first = own[len(settled)] if len(settled) < len(own) else None
        start = next((i for i, m in enumerate(messages) if m is first), len(messages) - pending)
        return [*_with_system_prompt(view, messages), *messages[start:]]

    def _run(self, run_id: str) -> _Run:
        """The processor's record of a run, made at its first model call."""
        run = self._runs.get(run_id)
        if run is None:
            loaded = self._loaded
            run = _Run(loaded.boundary_seq if loaded is not None else _UNKNOWN)
            self._runs[run_id] = run
            while len(self._runs) > REMEMBERED_RUNS:
                self._runs.popitem(last=False)
        return run

    # ---- recall ---------------------------------------------------------------------------

    def search_tool(self, *, limit: int = DEFAULT_TOOL_HITS) -> Tool[Any]:
        """A tool that searches this session's whole log (tool outputs included) for a few
        words: give it to the agent that runs with this history, and it can recall an exact
        detail a compaction summarized away."""
        search = ConversationSearch(self.store, self.conversation_id, limit=limit)

        async def search_conversation(query: str) -> str:
            return await search(query)

        return Tool(search_conversation, name=search.name, description=search.description)

    # ---- writing ----------------------------------------------------------------------------

    async def _append(self, data: list[dict[str, Any]]) -> list[MessageEvent]:
        """Append the messages of ``data`` not saved yet, as one batch. A message the log
        holds already (saved by an earlier attempt, or by another process) makes the store
        refuse the batch, naming it: it is left out and the rest sent again."""
        converted = [messages_from_pydantic_ai(item) for item in data]
        pending = [
            (item, messages)
            for item, messages in zip(data, converted, strict=True)
            if _group_of(messages) not in self._saved
        ]
        stored: list[MessageEvent] = []
        while pending:
            batch = [message for _, messages in pending for message in messages]
            try:
                stored = await self._write(batch, _latest_usage([item for item, _ in pending]))
                break
            except IdempotencyMismatchError as exc:
                pending = _without_stored(pending, exc)
        for messages in converted:
            self._remember(_group_of(messages))
        return stored

    async def _write(self, batch: list[Message], usage: Usage | None) -> list[MessageEvent]:
        try:
            return await self.store.append(self.conversation_id, batch, usage=usage)
        except NotFoundError:
            await self._create()
            return await self.store.append(self.conversation_id, batch, usage=usage)

    async def _create(self) -> None:
        await create_session_conversation(
            self.store, self.conversation_id, metadata={"session_id": self.session_id}
        )

    async def _last_seq(self) -> int:
        """Where the session's log ends now (0 for a session never written)."""
        try:
            return (await self.store.get_conversation(self.conversation_id)).last_seq
        except NotFoundError:
            return 0

    async def _completed_after(self, last: MessageEvent) -> bool:
        """Whether a run completion follows the run's last message already: an append the
        store replayed (the run saved before, by another process) returns the first
        attempt's messages, and that attempt marked the run."""
        after = await self.store.read_events(self.conversation_id, after_seq=last.seq, limit=1)
        return bool(after) and isinstance(after[0], RunCompletedEvent)

    def _remember(self, group: str) -> None:
        self._saved[group] = None
        self._saved.move_to_end(group)
        while len(self._saved) > REMEMBERED_MESSAGES:
            self._saved.popitem(last=False)

    def _resumed(self, message: ModelMessage) -> bool:
        """The loaded history's last request, which a run without a prompt sends again under
        its own run id: it is in the log already (Pydantic AI leaves it out of
        ``new_messages()`` too)."""
        last = self._loaded.last if self._loaded is not None else None
        return (
            isinstance(message, ModelRequest)
            and isinstance(last, ModelRequest)
            and message.parts == last.parts
            and message.timestamp == last.timestamp
            and message.instructions == last.instructions
        )

    async def _first_system_prompt(self) -> list[dict[str, Any]]:
        """The system prompt parts of the conversation's first request, when a Pydantic AI
        run wrote it: what a compacted history begins with."""
        events = await self.store.read_events(
            self.conversation_id, after_seq=0, limit=SYSTEM_PROMPT_SCAN
        )
        for event in events:
            if isinstance(event, MessageEvent):
                parts = system_prompt_parts(event.message)
                if parts:
                    return parts
        return []


@dataclass(slots=True)
class _Loaded:
    """What the latest ``load`` returned: the boundary it was behind, its last message."""

    boundary_seq: int | None
    last: ModelMessage | None


class _Unknown:
    """The boundary a history is behind, when it did not come from ``load``."""


_UNKNOWN = _Unknown()


@dataclass(slots=True)
class _Run:
    """A run the processor has seen: the boundary its history is behind, and the messages
    of its list known to be in the log, by identity (kept, so no id is reused meanwhile),
    so each model call converts only what is new."""

    boundary_seq: int | _Unknown | None
    saved: dict[int, ModelMessage] = field(default_factory=dict)


def _dumped(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """The messages' JSON (bytes as base64), refusing what JSON cannot hold."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ValidationError(
            "expected a list of Pydantic AI messages (ModelRequest and ModelResponse), not "
            f"{type(messages).__name__}",
            field="messages",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, ModelRequest | ModelResponse):
            raise ValidationError(
                f"messages[{index}] is a {type(message).__name__}, not a Pydantic AI "
                "ModelRequest or ModelResponse",
                field=f"messages[{index}]",
            )
    try:
        encoded = _ADAPTER.dump_json(list(messages))
    except PydanticSerializationError as exc:
        raise ValidationError(
            f"a Pydantic AI message holds a value that cannot be stored as JSON (a tool "
            f"return's content, say); nothing was written: {exc}",
            field="messages",
        ) from None
    try:
        data: list[dict[str, Any]] = orjson.loads(encoded)
    except orjson.JSONDecodeError:
        index = next(i for i, m in enumerate(messages) if not _is_json(_ADAPTER.dump_json([m])))
        raise ValidationError(
            f"messages[{index}] holds a NaN or infinite number (in a tool's arguments or "
            "return, say), which JSON cannot hold; nothing was written",
            field=f"messages[{index}]",
        ) from None
    return data


def _is_json(encoded: bytes) -> bool:
    try:
        orjson.loads(encoded)
    except orjson.JSONDecodeError:
        return False
    return True


def _validated(data: list[dict[str, Any]]) -> list[ModelMessage]:
    try:
        return _ADAPTER.validate_python(data)
    except pydantic.ValidationError as exc:
        raise ValidationError(
            f"the log holds messages Pydantic AI refuses as a history: {exc}",
            field="messages",
            details=exc.errors(include_url=False, include_context=False),
        ) from None


def _group_of(messages: list[Message]) -> str:
    """The digest of the Pydantic AI message ``messages`` were made from."""
    native = messages[0].native
    assert native is not None  # made by messages_from_pydantic_ai
    return str(native.data["group"])


def _without_stored(
    pending: list[tuple[dict[str, Any], list[Message]]], refusal: IdempotencyMismatchError
) -> list[tuple[dict[str, Any], list[Message]]]:
    """``pending`` less the message the store found in the log already: the first one when
    the batch's key (its first message's client id) keyed an earlier batch, else the one
    whose client id it names. A refusal that names none of them is re-raised."""
    if not refusal.key:
        return pending[1:]
    for index, (_, messages) in enumerate(pending):
        if any(message.client_id == refusal.key for message in messages):
            return [*pending[:index], *pending[index + 1 :]]
    raise refusal


def _latest_usage(data: list[dict[str, Any]]) -> Usage | None:
    """The usage of the latest model call among ``data`` (its input is the context it saw),
    for the pressure signal; None when no response reported any."""
    for item in reversed(data):
        usage = item.get("usage") if item.get("kind") == "response" else None
        if isinstance(usage, dict) and usage.get("input_tokens"):
            return Usage(
                input_tokens=usage.get("input_tokens") or 0,
                output_tokens=usage.get("output_tokens") or 0,
                cache_read_tokens=usage.get("cache_read_tokens") or 0,
                reasoning_tokens=usage.get("output_reasoning_tokens") or 0,
            )
    return None


def _waiting_calls(data: list[dict[str, Any]]) -> set[str]:
    """The calls of ``data`` with no return in it."""
    waiting: set[str] = set()
    for item in data:
        for part in item.get("parts", ()):
            kind = part.get("part_kind")
            if kind == "tool-call":
                waiting.add(part.get("tool_call_id"))
            elif kind == "tool-return" or (
                kind == "retry-prompt" and part.get("tool_name") is not None
            ):
                waiting.discard(part.get("tool_call_id"))
    return waiting


def _settled(messages: list[ModelMessage]) -> list[ModelMessage]:
    """The longest start of ``messages`` after which no call waits for its return."""
    waiting: set[str] = set()
    end = 0
    for index, message in enumerate(messages):
        if isinstance(message, ModelResponse):
            waiting.update(p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart))
        else:
            waiting.difference_update(
                p.tool_call_id for p in message.parts if isinstance(p, ToolReturnPart)
            )
        if not waiting:
            end = index + 1
    return messages[:end]


def _with_deferred_calls(messages: list[Message], abandoned: set[str]) -> list[Message]:
    """``messages`` less the synthetic error returns that close the last response's calls
    when nothing follows them: calls a run left waiting for deferred tool results, which
    Pydantic AI takes as ``deferred_tool_results`` (calls a run completion abandoned keep
    theirs: no later return would be stored)."""
    end = len(messages)
    while (
        end and _is_synthetic(messages[end - 1]) and messages[end - 1].tool_call_id not in abandoned
    ):
        end -= 1
    if end == len(messages) or not end or messages[end - 1].role != "assistant":
        return messages
    return messages[:end]


def _is_synthetic(message: Message) -> bool:
    return (
        message.role == "tool"
        and message.seq is None
        and message.is_error
        and message.content == MISSING_RESULT_TEXT
    )


def _has_system_prompt(data: list[dict[str, Any]]) -> bool:
    return any(
        part.get("part_kind") == "system-prompt"
        for item in data
        if item.get("kind") == "request"
        for part in item["parts"]
    )


def _with_system_prompt(view: list[ModelMessage], before: list[ModelMessage]) -> list[ModelMessage]:
    """``view`` with the system prompt ``before`` began with, when it has none."""
    if any(
        isinstance(p, SystemPromptPart)
        for m in view
        if isinstance(m, ModelRequest)
        for p in m.parts
    ):
        return view
    first = before[0] if before else None
    prompts = (
        [p for p in first.parts if isinstance(p, SystemPromptPart)]
        if isinstance(first, ModelRequest)
        else []
    )
    head = view[0]
    if not prompts or not isinstance(head, ModelRequest):
        return view
    return [replace(head, parts=[*prompts, *head.parts]), *view[1:]]


__all__ = [
    "REMEMBERED_MESSAGES",
    "REMEMBERED_RUNS",
    "SESSION_NAMESPACE",
    "SYSTEM_PROMPT_SCAN",
    "EpisodicHistory",
    "session_conversation_id",
]
